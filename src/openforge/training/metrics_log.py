"""Per-step training metrics: JSON lines always, TensorBoard when `tensorboard` is installed.

`metrics.jsonl` is the source of truth (one object per step, appended and flushed as each
step ends, so a killed run keeps every finished step and `--resume` appends after them).
TensorBoard is optional: openforge does not depend on it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


def _tensorboard_writer(log_dir: Path) -> Any:
    try:
        import tensorboard  # noqa: F401  (torch's SummaryWriter needs it)
        from torch.utils.tensorboard import SummaryWriter
    except Exception:
        return None
    return SummaryWriter(log_dir=str(log_dir))


class MetricsLog:
    """Appends one JSON object per step to `<dir>/metrics.jsonl` (and TensorBoard scalars)."""

    def __init__(self, directory: Path, tensorboard: bool = True) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / METRICS_FILE
        self._file = open(self.path, "a")
        self._tb = _tensorboard_writer(directory / "tensorboard") if tensorboard else None

    @property
    def has_tensorboard(self) -> bool:
        return self._tb is not None

    def log(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                 for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        if self._tb is not None:
            step = int(record.get("step", 0))
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                    self._tb.add_scalar(f"{record.get('phase', 'train')}/{key}", value, step)
            self._tb.flush()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl; a line torn by a crash is skipped."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records
