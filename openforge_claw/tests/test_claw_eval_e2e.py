"""The fixture checkout's Claw-Eval tasks through the real harnesses, the task's tools
offered as an MCP server in each one's own config: OpenClaw (`claw-eval__<tool>`), Codex
(`mcp__claw_eval__<tool>`, a Responses namespace) and Claude Code (`mcp__claw-eval__<tool>`).
Right scripts pass, wrong ones fail, scored by the tasks' own graders. Runs only with
OPENFORGE_E2E=1 and the harness plugins installed (`nox -s e2e`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from claw_eval_helpers import REPO
from test_claw_eval_run import write_script

pytestmark = pytest.mark.e2e
TASKS = ["T001zh_notes_digest", "T002_notes_digest", "T003_checksum_terminal"]
PLUGINS = {"openclaw": "openforge_openclaw", "codex": "openforge_codex",
           "claude-code": "openforge_claude_code"}


@pytest.mark.parametrize("harness", sorted(PLUGINS))
@pytest.mark.parametrize(("kind", "passes"), [("right", True), ("wrong", False)])
def test_mcp_tools_through_the_real_harness(tmp_path: Path, harness: str, kind: str,
                                            passes: bool) -> None:
    pytest.importorskip(PLUGINS[harness], reason=f"pip install ./plugins/openforge-{harness} "
                                                 "(nox -s e2e does)")
    argv = [sys.executable, "-m", "openforge.cli", "run", "--harness", harness, "--env", "claw",
            "--set", f"environment_options.path={REPO}", "--set", "sampling.max_tokens=1024",
            "--reward", "claw-grader", "--engine", "scripted",
            "--script", str(write_script(tmp_path, harness, kind)), "--runs-dir", str(tmp_path),
            "--timeout", "300", "--concurrency", "2", *[a for t in TASKS for a in ("--task", t)]]
    if harness == "openclaw":  # its prompt alone is ~25k tokens: room to answer without compaction
        argv += ["--set", "harness_options.context_window=131072"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=2400,
                          env=dict(os.environ), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in records) == TASKS
    assert all(r["status"] == "ok" and r["passed"] is passes for r in records), [
        (r["task_id"], r["status"], r["error"], r["reward_details"]) for r in records]
    if passes:  # the task tools went through MCP: the proxy recorded them
        notes = next(r for r in records if r["task_id"] == "T001zh_notes_digest")
        assert notes["reward_details"]["tools_called"] == ["notes_create", "notes_list"]
