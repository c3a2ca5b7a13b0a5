"""Claw-Eval tasks through `openforge run` for real (gateway, local executor, the `mini`
harness calling the task's tools with `claw-tool`, services and grader from the fixture
checkout): the right scripted solutions pass, the wrong ones and a do-nothing policy fail,
and the report counts pass^k / pass@k the way Claw-Eval does (all / any of k trials).
The same solutions through OpenClaw, Codex and Claude Code (MCP): test_claw_eval_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
import yaml
from claw_eval_helpers import REPO
from conftest import ISOLATING_MODES
from openforge.config import EngineConfig, RunConfig, SamplingParams
from openforge.runner import read_results, run_from_config

from openforge_claw.claweval.scripts import load_source, render

pytest.importorskip("fastapi", reason="pip install './openforge_claw[claw-eval]' (nox -s claw does)")
SOLUTIONS = Path(__file__).parent / "fixtures" / "claw_eval_solutions.yaml"
TASKS = ["T001zh_notes_digest", "T002_notes_digest", "T003_checksum_terminal"]


def write_script(tmp: Path, harness: str, kind: str) -> Path:
    source = load_source(SOLUTIONS)
    entries = ([{"replies": [{"content": "I will not do that."}]}] if kind == "idle"
               else render(source, harness, wrong=kind == "wrong"))
    path = tmp / f"{harness}-{kind}.yaml"
    path.write_text(yaml.safe_dump(entries, allow_unicode=True))
    return path


def _run(tmp: Path, kind: str, k: int = 1, sandbox: str = "auto"):  # type: ignore[no-untyped-def]
    config = RunConfig(harness="mini", harness_options={"max_steps": 6}, environment="claw",
                       environment_options={"path": str(REPO)}, reward="claw-grader",
                       executor_options={"sandbox": sandbox},
                       tasks=TASKS, k=k, concurrency=3, timeout_s=180,
                       sampling=SamplingParams(max_tokens=1024),
                       engine=EngineConfig(name="scripted",
                                           options={"script": str(write_script(tmp, "mini", kind))}),
                       runs_dir=tmp / f"{kind}-{sandbox}")
    result = run_from_config(config)
    return result, read_results(result.run_dir)


def test_right_wrong_and_idle_policies(tmp_path: Path) -> None:
    right, records = _run(tmp_path, "right", k=2)
    assert sorted({r.task_id for r in records}) == TASKS and len(records) == 6
    assert all(r.status == "ok" and r.passed for r in records), [
        (r.task_id, r.status, r.error, r.reward_details) for r in records if not r.passed]
    graders = {r.task_id: r.reward_details["grader"] for r in records}
    assert graders == {"T001zh_notes_digest": "NotesDigestGrader",
                       "T002_notes_digest": "NotesDigestGraderEN",
                       "T003_checksum_terminal": "ChecksumGrader"}
    report = json.loads((right.run_dir / "report.json").read_text())["behaviours"]
    assert report["pass_hat_k"] == {"2": 1.0} and report["pass_at_k"] == {"2": 1.0}

    _, wrong = _run(tmp_path, "wrong")
    assert all(r.status == "ok" and not r.passed for r in wrong)
    by_task = {r.task_id: r.reward_details for r in wrong}
    assert by_task["T001zh_notes_digest"]["category"] == "unsafe_action"  # it deleted a note
    assert by_task["T003_checksum_terminal"]["category"] == "wrong_final_state"

    _, idle = _run(tmp_path, "idle")
    assert all(r.status == "ok" and not r.passed for r in idle)
    leftover = [p for p in psutil.Process().children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE]
    assert not leftover, [p.cmdline() for p in leftover]


@pytest.mark.parametrize("sandbox", ISOLATING_MODES)
def test_services_and_tools_reach_the_agent_in_each_isolating_mode(tmp_path: Path,
                                                                   sandbox: str) -> None:
    """The task's services and tool proxy run on the trusted side (the supervisor's
    children); the agent's `claw-tool` in the sandbox reaches them over loopback, its
    dispatches land in the proxy, and the grader (trusted side, after the agent) scores."""
    _, records = _run(tmp_path, "right", sandbox=sandbox)
    assert all(r.status == "ok" and r.passed for r in records), [
        (r.task_id, r.status, r.error, r.reward_details) for r in records if not r.passed]
    notes = next(r for r in records if r.task_id == "T002_notes_digest").reward_details
    assert "notes_create" in notes["tools_called"], notes
