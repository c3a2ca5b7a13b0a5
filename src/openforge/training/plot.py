"""The reward curve: a PNG through matplotlib when it is installed, else a small SVG.

The SVG is written by hand so that every install can produce a plot without a plotting
dependency; it draws each named series as a polyline with axes and a legend.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

Series = dict[str, list[tuple[float, float]]]
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd")


def write_curve(path_stem: Path, series: Series, title: str, ylabel: str = "reward") -> Path:
    """Plot `series` (name -> [(step, value)]) to `<path_stem>.png` or `<path_stem>.svg`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return _write_svg(path_stem.with_suffix(".svg"), series, title, ylabel)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in series.items():
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", label=name)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    out = path_stem.with_suffix(".png")
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return out


def _write_svg(out: Path, series: Series, title: str, ylabel: str) -> Path:
    width, height, pad = 640, 360, 50
    points = [p for pts in series.values() for p in pts]
    xs = [p[0] for p in points] or [0.0, 1.0]
    ys = [p[1] for p in points] or [0.0, 1.0]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(0.0, min(ys)), max(1.0, max(ys))

    def sx(x: float) -> float:
        return pad + (x - x0) / (x1 - x0) * (width - 2 * pad)

    def sy(y: float) -> float:
        return height - pad - (y - y0) / (y1 - y0) * (height - 2 * pad)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
             f'<text x="{width / 2}" y="{height - 10}" text-anchor="middle">step</text>',
             f'<text x="15" y="{height / 2}" transform="rotate(-90 15 {height / 2})" '
             f'text-anchor="middle">{escape(ylabel)}</text>']
    for frac in (0.0, 0.5, 1.0):
        y = y0 + frac * (y1 - y0)
        parts.append(f'<text x="{pad - 5}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
        parts.append(f'<line x1="{pad}" y1="{sy(y):.1f}" x2="{width - pad}" y2="{sy(y):.1f}" '
                     f'stroke="#ddd"/>')
    parts.append(f'<text x="{pad}" y="{height - pad + 15}" text-anchor="middle">{x0:g}</text>')
    parts.append(f'<text x="{width - pad}" y="{height - pad + 15}" text-anchor="middle">{x1:g}</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        if pts:
            coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
            parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
            parts.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>'
                         for x, y in pts)
        parts.append(f'<text x="{width - pad - 120}" y="{pad + 15 * i}" fill="{color}">'
                     f'{escape(name)}</text>')
    parts.append("</svg>")
    out.write_text("\n".join(parts) + "\n")
    return out


def text_curve(points: list[tuple[float, float]], width: int = 40) -> list[str]:
    """The curve as text lines (`step  value  ####`), for the terminal."""
    return [f"{int(x):>5}  {y:6.3f}  " + "#" * round(max(0.0, min(1.0, y)) * width)
            for x, y in points]
