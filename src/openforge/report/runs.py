"""`openforge runs`: the run folders under a runs directory, each with its headline figures.

The figures come from each run's results.jsonl through the same `metrics.summarize` the
report uses, so they agree with report.json, and a run still in progress shows what it has
finished so far.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from openforge.metrics import MetricsSummary, summarize


class RunRow(BaseModel):
    """One run folder as `openforge runs` lists it: what ran, and its figures."""

    run_id: str
    path: Path
    started: str
    config: dict[str, Any]
    metrics: MetricsSummary
    reported: bool = False  # report.json is there (the run ended, or was reported)

    def setting(self, *keys: str) -> str:
        """A value of the run's config.yaml ("?" when missing), e.g. setting("engine", "name")."""
        value: Any = self.config
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return "?" if value is None else str(value)


def _config(run_dir: Path) -> dict[str, Any]:
    from openforge.runner import CONFIG_FILE

    try:
        data = yaml.safe_load((run_dir / CONFIG_FILE).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def run_row(run_dir: Path) -> RunRow:
    from openforge.runner import RESULTS_FILE, read_results

    config = _config(run_dir)
    records = read_results(run_dir)
    k = int(config.get("k") or 1)
    metrics = summarize([r.outcome() for r in records], k)
    stamp = (run_dir / RESULTS_FILE) if (run_dir / RESULTS_FILE).exists() else run_dir
    return RunRow(
        run_id=str(config.get("run_id") or run_dir.name), path=run_dir,
        started=time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp.stat().st_ctime)),
        config=config, metrics=metrics, reported=(run_dir / "report.json").exists())


def list_runs(runs_dir: Path) -> list[RunRow]:
    """Every run folder directly under `runs_dir` (one holding config.yaml or
    results.jsonl), oldest first."""
    from openforge.runner import CONFIG_FILE, RESULTS_FILE

    if not runs_dir.is_dir():
        return []
    folders = [p for p in runs_dir.iterdir()
               if p.is_dir() and ((p / CONFIG_FILE).exists() or (p / RESULTS_FILE).exists())]
    rows = [run_row(p) for p in folders]
    return sorted(rows, key=lambda r: (r.started, r.run_id))
