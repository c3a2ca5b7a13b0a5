"""The real OpenClaw (npm `openclaw`, Node 24) on a handful of claw tasks, right and wrong
scripts: `openforge run --harness openclaw --env claw --reward claw-grader --engine scripted`.
Runs only with OPENFORGE_E2E=1 and the openforge-openclaw plugin installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SOLUTIONS

TASKS = ["files-greeting", "shell-fix-script", "calendar-conflict", "plan-mail-to-calendar"]
pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(("script", "passes"), [("openclaw.yaml", True),
                                                ("wrong_openclaw.yaml", False)])
def test_openclaw_runs_claw_tasks(tmp_path: Path, script: str, passes: bool) -> None:
    pytest.importorskip("openforge_openclaw", reason="pip install ./plugins/openforge-openclaw (nox -s e2e does)")
    argv = [sys.executable, "-m", "openforge.cli", "run", "--harness", "openclaw", "--env",
            "claw", "--reward", "claw-grader", "--engine", "scripted", "--script",
            str(SOLUTIONS / script), "--runs-dir", str(tmp_path), "--timeout", "240",
            *[a for t in TASKS for a in ("--task", t)]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1500,
                          env=dict(os.environ), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in records) == sorted(TASKS)
    assert all(r["status"] == "ok" and r["passed"] is passes for r in records), records
