"""Run reports: `report.json` and a self-contained `report.html` (`openforge report RUN`).

The JSON holds the summary, one row per task, one row per attempt (status, reward, error)
and pass@k / pass^k for k = 1..k. The HTML needs no external asset: per-task results, an
inline SVG pass@k curve, and every attempt's trajectory turn by turn from the store's
recorded calls (what the harness sent, what the policy answered).
"""

from __future__ import annotations

import html
import json
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from openforge.errors import OpenforgeError
from openforge.metrics import MetricsSummary, summarize
from openforge.report.behaviours import analyse, behaviours_html
from openforge.report.filmstrip import load_filmstrips
from openforge.types import INFRA_STATUSES, Call

if TYPE_CHECKING:
    from openforge.store import Store

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
_MAX_TEXT = 6000


class ReportError(OpenforgeError):
    """The directory is not a run directory the report can read."""


def _load(run_dir: Path) -> tuple[dict[str, Any], list[Any]]:
    from openforge.runner import CONFIG_FILE, RESULTS_FILE, read_results

    if not (run_dir / CONFIG_FILE).exists() and not (run_dir / RESULTS_FILE).exists():
        raise ReportError(f"{run_dir} is not a run directory (no {CONFIG_FILE} or {RESULTS_FILE})")
    config: dict[str, Any] = {}
    if (run_dir / CONFIG_FILE).exists():
        config = yaml.safe_load((run_dir / CONFIG_FILE).read_text()) or {}
    return config, read_results(run_dir)


def build_report(run_dir: Path) -> dict[str, Any]:
    """The report as a JSON-ready dict."""
    return _build(run_dir)[0]


def _build(run_dir: Path) -> tuple[dict[str, Any], dict[str, list[Call]]]:
    """The report and the recorded calls it was built from (read once, for the HTML too)."""
    from openforge.runner import STORE_FILE
    from openforge.store import Store

    config, records = _load(run_dir)
    store = Store(run_dir / STORE_FILE) if (run_dir / STORE_FILE).exists() else None
    try:
        return _build_from(run_dir, config, records, store)
    finally:
        if store is not None:
            store.close()


def _build_from(run_dir: Path, config: dict[str, Any], records: list[Any],
                store: Store | None) -> tuple[dict[str, Any], dict[str, list[Call]]]:
    k = int(config.get("k") or max([r.attempt + 1 for r in records], default=1))
    task_ids = list(dict.fromkeys(r.task_id for r in records))
    metrics = summarize([r.outcome() for r in records], k, task_ids)
    report: dict[str, Any] = {
        "run_id": config.get("run_id") or run_dir.name,
        "generated_at": time.time(),
        "config": config,
        "summary": {
            "tasks": metrics.tasks, "k": k, "attempts": metrics.attempts, "scored": metrics.scored,
            "passed": metrics.passed, "infra_failures": metrics.infra_failures,
            "plugin_errors": metrics.plugin_errors, "mean_reward": metrics.mean_reward,
            "headline": metrics.headline(),
        },
        "sandbox": _sandbox(records),
        "pass_at_k": {str(key): v for key, v in metrics.pass_at.items()},
        "pass_hat_k": {str(key): v for key, v in metrics.pass_hat.items()},
        "tasks": [row.model_dump(mode="json") for row in metrics.rows],
        "attempts": [
            {"task_id": r.task_id, "attempt": r.attempt, "status": r.status, "reward": r.reward,
             "passed": r.passed, "error": r.error, "final_answer": r.final_answer,
             "duration_s": r.duration_s, "tries": r.tries, "infra_errors": r.infra_errors,
             "session_id": r.session_id, "rollout_id": r.rollout_id,
             "reward_details": r.reward_details, "logs": r.logs, "sandbox": r.sandbox}
            for r in sorted(records, key=lambda r: (r.task_id, r.attempt))
        ],
        "trajectories": _trajectory_metrics(store) if store is not None else None,
    }
    calls = ({r.session_id: store.list_calls(r.session_id) for r in records if r.session_id}
             if store is not None else {})
    report["behaviours"] = analyse(report, calls)
    return report, calls


def _trajectory_metrics(store: Store) -> dict[str, Any]:
    """How the recorded calls merge into training samples (branches and why, exact tokens),
    counted the way `openforge export` writes them: over the sessions it keeps, with the
    ones it leaves out (infrastructure failures, plugin errors) counted apart."""
    from openforge.export import training_metrics

    metrics, left_out = training_metrics(store)
    return {**metrics.model_dump(mode="json"), "sessions_left_out": left_out}


def write_report(run_dir: Path) -> list[Path]:
    """Write report.json and report.html into `run_dir`; return their paths."""
    run_dir = Path(run_dir)
    data, calls = _build(run_dir)
    json_path, html_path = run_dir / REPORT_JSON, run_dir / REPORT_HTML
    json_path.write_text(json.dumps(data, indent=1, default=str))
    html_path.write_text(render_html(data, calls, load_filmstrips(run_dir, data, calls)))
    return [json_path, html_path]


# -- HTML ------------------------------------------------------------------------------------

def _e(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > _MAX_TEXT:
        text = text[:_MAX_TEXT] + f"\n...[{len(text) - _MAX_TEXT} characters cut]"
    return html.escape(text)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _svg_curve(pass_at: dict[str, float], pass_hat: dict[str, float]) -> str:
    """An inline SVG line chart of pass@k and pass^k over k."""
    ks = sorted(int(k) for k in pass_at)
    if not ks:
        return "<p class='meta'>no scored attempts: no curve</p>"
    w, h, left, bottom, top, right = 420, 220, 40, 30, 12, 100
    span = max(ks[-1] - ks[0], 1)

    def x(k: int) -> float:
        return left + (k - ks[0]) / span * (w - left - right) if len(ks) > 1 else left + (w - left - right) / 2

    def y(v: float) -> float:
        return top + (1 - v) * (h - top - bottom)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img" '
             f'aria-label="pass@k curve">']
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{left}" x2="{w - right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
                     f'stroke="#e3e5ee"/><text x="4" y="{y(tick) + 4:.1f}">{tick:.2f}</text>')
    for k in ks:
        parts.append(f'<text x="{x(k) - 3:.1f}" y="{h - 10}">{k}</text>')
    parts.append(f'<text x="{(w - right) / 2:.0f}" y="{h}">k</text>')
    for series, color, label, dy in ((pass_at, "#1a56b0", "pass@k", 0), (pass_hat, "#b3261e", "pass^k", 16)):
        points = " ".join(f"{x(k):.1f},{y(series[str(k)]):.1f}" for k in ks if str(k) in series)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{points}"/>')
        for k in ks:
            if str(k) in series:
                parts.append(f'<circle cx="{x(k):.1f}" cy="{y(series[str(k)]):.1f}" r="3" fill="{color}">'
                             f'<title>{label} k={k}: {series[str(k)]:.3f}</title></circle>')
        parts.append(f'<line x1="{w - right + 10}" x2="{w - right + 28}" y1="{top + 6 + dy}" '
                     f'y2="{top + 6 + dy}" stroke="{color}" stroke-width="2"/>'
                     f'<text x="{w - right + 32}" y="{top + 10 + dy}">{label}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _content_text(content: Any) -> str:
    """Text of a message's content in any dialect (string, or a list of typed parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict):
                kind = part.get("type")
                if "text" in part:
                    out.append(str(part["text"]))
                elif kind == "tool_result":
                    out.append(_content_text(part.get("content")))
                elif kind == "tool_use":
                    out.append(f"[call {part.get('name')}({json.dumps(part.get('input', {}))})]")
                elif kind in ("image", "image_url", "input_image"):
                    out.append("[image]")
                else:
                    out.append(json.dumps(part, default=str))
            else:
                out.append(str(part))
        return "\n".join(out)
    return json.dumps(content, default=str)


def request_messages(call: Call) -> list[tuple[str, str, list[str]]]:
    """(role, text, tool calls) of the request's conversation, whatever the dialect."""
    req = call.request or {}
    msgs: list[tuple[str, str, list[str]]] = []
    if req.get("system"):
        msgs.append(("system", _content_text(req["system"]), []))
    if req.get("instructions"):
        msgs.append(("system", _content_text(req["instructions"]), []))
    items = req.get("messages")
    if items is None:
        items = req.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if items is None and "prompt" in req:
        items = [{"role": "prompt", "content": req["prompt"]}]
    for item in items or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "function_call":
            msgs.append(("assistant", "", [f"{item.get('name')}({item.get('arguments')})"]))
        elif kind == "function_call_output":
            msgs.append(("tool", _content_text(item.get("output")), []))
        else:
            role = str(item.get("role", kind or "?"))
            calls = [f"{c.get('function', {}).get('name')}({c.get('function', {}).get('arguments')})"
                     for c in item.get("tool_calls") or [] if isinstance(c, dict)]
            if role == "user" and isinstance(item.get("content"), list) and all(
                    isinstance(p, dict) and p.get("type") == "tool_result" for p in item["content"]):
                role = "tool"
            msgs.append((role, _content_text(item.get("content")), calls))
    return msgs


def response_parts(call: Call) -> tuple[str, str, list[str]]:
    """(reasoning, text, tool calls) the policy answered with, whatever the dialect."""
    resp = call.response or {}
    reasoning, text, calls = "", "", []
    if resp.get("choices"):
        choice = resp["choices"][0]
        if "message" in choice:
            msg = choice["message"] or {}
            reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
            text = msg.get("content") or ""
            calls = [f"{c['function']['name']}({c['function'].get('arguments')})"
                     for c in msg.get("tool_calls") or []]
        else:
            text = choice.get("text", "")
    elif isinstance(resp.get("content"), list):  # Anthropic Messages
        for block in resp["content"]:
            if block.get("type") == "text":
                text += block.get("text", "")
            elif block.get("type") == "thinking":
                reasoning += block.get("thinking", "")
            elif block.get("type") == "tool_use":
                calls.append(f"{block.get('name')}({json.dumps(block.get('input', {}))})")
    elif isinstance(resp.get("output"), list):  # Responses
        for item in resp["output"]:
            if item.get("type") == "message":
                text += _content_text(item.get("content"))
            elif item.get("type") == "reasoning":
                reasoning += _content_text(item.get("summary") or item.get("content"))
            elif item.get("type") == "function_call":
                calls.append(f"{item.get('name')}({item.get('arguments')})")
    elif resp:
        text = json.dumps(resp, default=str)
    elif call.error:
        text = f"[failed: {call.error}]"
    return reasoning, text, calls


def _msg_html(role: str, text: str, calls: list[str]) -> str:
    body = f"<pre>{_e(text)}</pre>" if text else ""
    body += "".join(f"<pre class='call'>&rarr; {_e(c)}</pre>" for c in calls)
    return f"<div class='msg'><span class='role {html.escape(role)}'>{html.escape(role)}</span>{body}</div>"


def _trajectory_html(calls: list[Call]) -> str:
    if not calls:
        return "<p class='meta'>no model calls recorded</p>"
    out, seen = [], 0
    for i, call in enumerate(calls):
        msgs = request_messages(call)
        # Show only what is new since the previous call, unless the history was rewritten.
        new = msgs[seen:] if 0 < seen <= len(msgs) else msgs
        seen = len(msgs) + 1  # + the assistant turn this call produces
        reasoning, text, tool_calls = response_parts(call)
        turn = [f"<div class='meta'>call {i + 1} &middot; {html.escape(call.dialect)} &middot; "
                f"branch {call.branch} &middot; {len(call.prompt_ids)} prompt / "
                f"{len(call.completion_ids)} generated tokens &middot; finish "
                f"{html.escape(str(call.finish_reason))}</div>"]
        turn += [_msg_html(role, t, c) for role, t, c in new if role != "system" or i == 0]
        if reasoning:
            turn.append(_msg_html("reasoning", reasoning, []))
        turn.append(_msg_html("assistant", text, tool_calls))
        out.append("<div class='turn'>" + "".join(turn) + "</div>")
    return "".join(out)


def _sandbox(records: list[Any]) -> dict[str, Any]:
    """How the run's agents were isolated; a loud warning when some were not at all."""
    modes = sorted({r.sandbox for r in records if r.sandbox})
    unisolated = sum(1 for r in records if r.sandbox == "none")
    warning = None
    if unisolated:
        warning = (f"{unisolated} of {len(records)} attempts ran WITHOUT isolation (sandbox "
                   "none): their agents could read and write this user's files and read other "
                   "rollouts' tokens. docs/sandboxing.md says what each mode guarantees.")
    return {"modes": modes, "unisolated_attempts": unisolated, "warning": warning}


def _status_html(attempt: dict[str, Any]) -> str:
    status = attempt["status"]
    if status == "plugin_error":
        return "<span class='plugin'>plugin error</span>"
    if status in INFRA_STATUSES or status == "violation":
        return f"<span class='infra'>{html.escape(status)}</span>"
    cls = "ok" if attempt["passed"] else "fail"
    return f"<span class='{cls}'>{'passed' if attempt['passed'] else 'failed'}</span>"


def render_html(data: dict[str, Any], calls: dict[str, list[Call]],
                filmstrips: dict[str, str] | None = None) -> str:
    """The self-contained HTML page for a report dict and the recorded calls."""
    s = data["summary"]
    cfg = data.get("config") or {}
    engine = cfg.get("engine") or {}
    warning = (data.get("sandbox") or {}).get("warning")
    body = [f"<h1>openforge run {html.escape(str(data['run_id']))}</h1>",
            f"<p class='infra'><b>WARNING: {_e(warning)}</b></p>" if warning else "",
            f"<p class='meta'>harness {_e(cfg.get('harness', '?'))} &middot; environment "
            f"{_e(cfg.get('environment', '?'))} &middot; reward {_e(cfg.get('reward', '?'))} &middot; "
            f"engine {_e(engine.get('name', '?'))} ({_e(engine.get('model', '?'))})</p>",
            f"<p class='headline'>{_e(s.get('headline', ''))}</p>",
            f"<p>{s['tasks']} tasks, k={s['k']}, {s['attempts']} attempts: {s['scored']} scored, "
            f"{s['passed']} passed, <span class='plugin'>{s.get('plugin_errors', 0)} plugin "
            f"errors</span> and <span class='infra'>{s['infra_failures']} infrastructure "
            f"failures</span> (neither scored: left out of pass rates and training data), "
            f"mean reward {_fmt(s['mean_reward'])}.</p>",
            _plugin_errors_html(data["attempts"]),
            "<h2>pass@k</h2><table><tr><th>k</th><th>pass@k</th><th>pass^k</th></tr>"]
    for k in sorted(data["pass_at_k"], key=int):
        body.append(f"<tr><td>{k}</td><td class='num'>{_fmt(data['pass_at_k'][k])}</td>"
                    f"<td class='num'>{_fmt(data['pass_hat_k'].get(k))}</td></tr>")
    body.append("</table>" + _svg_curve(data["pass_at_k"], data["pass_hat_k"]))
    body.append(_trajectory_metrics_html(data.get("trajectories")))
    body.append(behaviours_html(data.get("behaviours")))
    body.append("<h2>Tasks</h2><table><tr><th>task</th><th>scored</th><th>passed</th>"
                "<th>plugin errors</th><th>infra</th><th>mean reward</th><th>pass@1</th></tr>")
    for row in data["tasks"]:
        body.append(f"<tr><td><a href='#t-{_e(row['task_id'])}'>{_e(row['task_id'])}</a></td>"
                    f"<td class='num'>{row['n']}</td><td class='num'>{row['passed']}</td>"
                    f"<td class='num'>{row.get('plugin_errors', 0)}</td>"
                    f"<td class='num'>{row['infra_failures']}</td>"
                    f"<td class='num'>{_fmt(row['mean_reward'], 2)}</td>"
                    f"<td class='num'>{_fmt((row.get('pass_at') or {}).get('1'))}</td></tr>")
    body.append("</table><h2>Attempts and trajectories</h2>")
    current = None
    for a in data["attempts"]:
        if a["task_id"] != current:
            current = a["task_id"]
            body.append(f"<h3 id='t-{_e(current)}'>{_e(current)}</h3>")
        reward = _fmt(a["reward"], 2)
        head = (f"attempt {a['attempt']} &middot; {_status_html(a)} &middot; reward {reward} "
                f"&middot; {a['duration_s']:.1f}s" + (f" &middot; {a['tries']} tries" if a["tries"] > 1 else ""))
        inner = []
        if a.get("error"):
            inner.append(f"<p><b>error</b></p><pre>{_e(a['error'])}</pre>")
        if a.get("infra_errors"):
            inner.append("<p><b>retried infrastructure failures</b></p>" +
                         "".join(f"<pre>{_e(e)}</pre>" for e in a["infra_errors"]))
        if a.get("reward_details"):
            inner.append(f"<p><b>reward {_e(cfg.get('reward', '?'))}: details</b></p>"
                         f"<pre>{_e(a['reward_details'])}</pre>")
        if a.get("logs"):
            links = " &middot; ".join(f"<a href='{html.escape(path, quote=True)}'>{_e(stream)}</a>"
                                      for stream, path in sorted(a["logs"].items()))
            inner.append(f"<p><b>agent output</b>: {links}</p>")
        if a.get("final_answer"):
            inner.append(f"<p><b>final answer</b></p><pre>{_e(a['final_answer'])}</pre>")
        inner.append((filmstrips or {}).get(a["session_id"], ""))  # GUI rollouts: screens
        inner.append(_trajectory_html(calls.get(a["session_id"], [])))
        body.append(f"<details><summary>{head}</summary>{''.join(inner)}</details>")
    template = resources.files("openforge.report").joinpath("template.html").read_text()
    return (template.replace("{{title}}", f"openforge run {html.escape(str(data['run_id']))}")
            .replace("{{body}}", "\n".join(body)))


def _plugin_errors_html(attempts: list[dict[str, Any]]) -> str:
    """The attempts a plugin broke, first thing on the page: bugs to fix, not agent failures."""
    errors = [a for a in attempts if a["status"] == "plugin_error"]
    if not errors:
        return ""
    items = "".join(f"<li><a href='#t-{_e(a['task_id'])}'>{_e(a['task_id'])}</a> attempt "
                    f"{a['attempt']}: <code>{_e(a.get('error') or '')}</code></li>"
                    for a in errors[:20])
    more = f"<li>... and {len(errors) - 20} more</li>" if len(errors) > 20 else ""
    return (f"<div class='plugin'><p><b>{len(errors)} attempts ended in a plugin error</b>: an "
            "exception in the environment, the reward or the harness adapter. They are not "
            f"scored and not retried; fix the plugin.</p><ul>{items}{more}</ul></div>")


def _trajectory_metrics_html(m: dict[str, Any] | None) -> str:
    if not m:
        return ""
    branches = ", ".join(f"{_e(reason)}: {n}" for reason, n in sorted(m["branches_opened"].items()))
    left = ", ".join(f"{_e(why)}: {n}" for why, n in sorted((m.get("sessions_left_out") or {}).items()))
    return ("<h2>Training data</h2><p>What <code>openforge export</code> writes: "
            f"sessions left out: {left or 'none'}. "
            f"{m['calls_recorded']} recorded calls ({m['failed_calls']} failed, "
            f"{m['retries_merged']} retries merged) became {m['samples']} samples over "
            f"{m['sessions']} sessions ({m['samples_per_session']:.2f} per session, "
            f"{m['calls_per_sample']:.2f} calls per sample); "
            f"{m['merged_calls']} calls merged into earlier turns; branches opened: "
            f"{branches or 'none'}; {m['mean_generated_tokens_per_sample']:.1f} generated tokens "
            f"per sample; exact token ids on {100 * m['exact_token_fraction']:.0f}% of calls.</p>")


__all__ = ["build_report", "render_html", "write_report", "MetricsSummary"]
