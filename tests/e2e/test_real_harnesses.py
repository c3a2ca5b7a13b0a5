"""Real Codex CLI and Claude Code, unmodified, against the real gateway (`nox -s e2e`).

For each harness, `openforge run --harness X --env demo --task hello-file` runs in a
subprocess with the plugin distribution installed for real (pip, entry point):

- with the `scripted` engine, turn 1 calls the harness's OWN shell tool (Codex
  `exec_command{cmd}`, Claude Code `Bash{command, description}`) to create hello.txt and
  turn 2 answers: the demo checker passes; every call was streamed; the recorded calls
  are exactly the model requests the harness reports in its own output; the trajectory
  merges into one sample of exact token ids;
- with the tiny untrained `local` model, arbitrary output must not crash the gateway or
  the harness: the attempt ends labelled (`ok` or `harness_error`, never an infra
  failure), the call count still matches, and every extra sample is explained by a
  branch reason in the trajectory metrics.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness_plugins import CLAUDE_CODE, CODEX, installed, pip_install, with_path

from openforge.store import Store
from openforge.trajectory import build_samples

HERE = Path(__file__).parent
HARNESSES = {
    "codex": (CODEX, HERE / "codex_script.yaml", []),
    # Claude Code asks for max_tokens=32000, which overrides the run's sampling.max_tokens:
    # cap it so the untrained model's rambling ends quickly on 2 CPU cores.
    "claude-code": (CLAUDE_CODE, HERE / "claude_code_script.yaml",
                    ["--set", "harness_options.max_output_tokens=48"]),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the plugin distributions the environment lacks (the nox session
    installs them; a second copy on PYTHONPATH would register each harness twice)."""
    target = tmp_path_factory.mktemp("site")
    missing = [p for p in (CODEX, CLAUDE_CODE) if not installed(p.name)]
    if missing:
        pip_install(target, *missing)
    return target


def openforge_run(site: Path, runs: Path, harness: str, *args: str) -> tuple[dict[str, Any], Path]:
    """Run one attempt of `hello-file`; return its results.jsonl record and the run dir."""
    argv = [sys.executable, "-m", "openforge.cli", "run", "--harness", harness, "--env", "demo",
            "--task", "hello-file", "--runs-dir", str(runs), "--timeout", "240",
            "--set", "max_infra_retries=0", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, env=with_path(site), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [run_dir] = [p for p in runs.iterdir() if p.is_dir()]
    [line] = (run_dir / "results.jsonl").read_text().splitlines()
    return json.loads(line), run_dir


def session_facts(run_dir: Path) -> dict[str, Any]:
    """Recorded calls, the harness's own request count and the trajectory metrics."""
    with Store(run_dir / "store.sqlite") as store:
        [session] = store.list_sessions()
        calls = store.list_calls(session.id)
        result = store.get_result(session.id)
        assert result is not None
        transcript = result.harness_output.get("transcript") or {}
        trajectory = build_samples(calls, session)
    return {"calls": calls, "ok_calls": [c for c in calls if c.status == "ok"],
            "model_requests": transcript.get("model_requests"), "metrics": trajectory.metrics,
            "samples": trajectory.samples, "result": result}


def assert_branches_explained(facts: dict[str, Any]) -> None:
    metrics = facts["metrics"]
    assert metrics.samples == 1 + sum(metrics.branches_opened.values()), metrics
    assert metrics.calls_used == metrics.samples + metrics.merged_calls


@pytest.mark.parametrize("harness", sorted(HARNESSES))
def test_scripted_task_passes_and_is_recorded_exactly(site: Path, tmp_path: Path, harness: str) -> None:
    _project, script, extra = HARNESSES[harness]
    record, run_dir = openforge_run(site, tmp_path / "runs", harness, "--engine", "scripted",
                                    "--script", str(script), *extra)
    assert record["status"] == "ok" and record["passed"], record
    assert record["final_answer"] == "Created hello.txt."
    facts = session_facts(run_dir)
    # Turn 1 (the shell tool call) and turn 2 (the answer): both recorded, both streamed.
    assert len(facts["ok_calls"]) == facts["model_requests"] == 2
    assert all(c.request.get("stream") is True for c in facts["calls"])
    assert all(c.exact_tokens for c in facts["calls"])
    # The second call extends the first token for token: one sample, nothing rewritten.
    assert facts["metrics"].samples == 1 and facts["metrics"].merged_calls == 1, facts["metrics"]
    assert_branches_explained(facts)
    [sample] = facts["samples"]
    generated = sum(sample.response_mask)
    assert generated == sum(len(c.completion_ids) for c in facts["ok_calls"])


@pytest.mark.parametrize("harness", sorted(HARNESSES))
def test_tiny_model_output_is_survived_and_labelled(site: Path, tmp_path: Path, harness: str) -> None:
    _project, _script, extra = HARNESSES[harness]
    record, run_dir = openforge_run(site, tmp_path / "runs", harness, "--engine", "local",
                                    "--set", "sampling.max_tokens=48", *extra)
    # Whatever the untrained model said, the harness ended its own way and was scored.
    assert record["status"] in ("ok", "harness_error"), record
    assert record["reward"] is not None
    facts = session_facts(run_dir)
    assert len(facts["ok_calls"]) >= 1
    assert len(facts["ok_calls"]) == facts["model_requests"], (
        [c.status for c in facts["calls"]], facts["model_requests"])
    assert_branches_explained(facts)
