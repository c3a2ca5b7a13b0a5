"""Acceptance on the real QwenClawBench (github:SKYLENAGE-AI/QwenClawBench): set
OPENFORGE_QCB_PATH to a checkout (its root, holding data/ and scripts/). Every task loads;
the scripted solutions in openforge_claw/solutions pass the benchmark's own graders through
`mini` (and, with OPENFORGE_E2E=1, through OpenClaw) and their wrong twins fail; pass@k and
pass^k equal what the benchmark's own scripts/lib_grading.py computes from the same runs (all
passing, and coin-flip trials that differ); a do-nothing policy is scored by every task's
checks (on every fifth task) and passes none; the one grader that runs the agent's module
in its own process is skipped unless asked for.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from conftest import IN_PROCESS_FORGER, SOLUTIONS

from openforge_claw.tasks import load_tasks

ROOT = os.environ.get("OPENFORGE_QCB_PATH")
pytestmark = pytest.mark.skipif(
    not ROOT, reason="set OPENFORGE_QCB_PATH to a QwenClawBench checkout (github:"
                     "SKYLENAGE-AI/QwenClawBench; .ci/run does where the machine has it); docs/claw.md has the commands")
DATASET = "data/qwenclawbench-v1.1-100"


def _solved_ids() -> list[str]:
    entries = yaml.safe_load((SOLUTIONS / "qwenclawbench_mini.yaml").read_text())
    tasks = load_tasks(Path(ROOT or ".") / DATASET)
    return [next(t.id for t in tasks if re.search(e["match"], t.prompt)) for e in entries]


def test_every_real_task_loads() -> None:
    tasks = load_tasks(Path(ROOT or ".") / DATASET)
    assert len(tasks) == 100 and not tasks.skipped
    assert sum(len(t.workspace_files) for t in tasks) == 1164
    assert sum(len(t.files) for t in tasks) == 23
    assert all(t.qwenclawbench and compile(t.qwenclawbench.code or "", t.id, "exec")
               for t in tasks)


def _run(harness: str, script: Path, runs: Path, k: int, tasks: list[str] | None = None):
    """The scripted `script` through `harness` on `tasks` (default: the solved ones), k
    trials each, scored by the automated checks: (run directory, results)."""
    from openforge.config import EngineConfig, RunConfig
    from openforge.runner import read_results, run_from_config
    from openforge.types import SamplingParams

    config = RunConfig(
        harness=harness, environment="claw", reward="claw-grader", concurrency=2, k=k,
        # The solutions write whole reports in one reply: more than the default budgets.
        sampling=SamplingParams(max_tokens=4096),
        harness_options={"max_tokens": 4096} if harness == "mini" else {},
        environment_options={"path": str(Path(ROOT or ".") / DATASET), "scoring": "automated"},
        tasks=_solved_ids() if tasks is None else tasks, timeout_s=300, runs_dir=runs,
        engine=EngineConfig(name="scripted", options={"script": str(script)}))
    result = run_from_config(config)
    return result.run_dir, read_results(result.run_dir)


def _benchmark_pass_k(records, k: int) -> dict[str, float]:
    """pass@k / pass^k by the benchmark's own code, from the same per-run scores."""
    sys.path.insert(0, str(Path(ROOT or ".") / "scripts"))
    try:
        from lib_grading import pass_k_stats  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    grades: dict[str, dict[str, list[dict[str, float]]]] = {}
    for r in records:
        grades.setdefault(r.task_id, {"runs": []})["runs"].append({"score": r.reward})
    return pass_k_stats(grades, k)


@pytest.mark.parametrize("harness", ["mini", "openclaw"])
def test_solutions_pass_the_benchmarks_graders_and_wrong_ones_fail(
        tmp_path: Path, harness: str) -> None:
    import json

    if harness == "openclaw":
        if os.environ.get("OPENFORGE_E2E") != "1":
            pytest.skip("real OpenClaw from npm: set OPENFORGE_E2E=1 (nox -s e2e does)")
        pytest.importorskip("openforge_openclaw", reason="pip install ./plugins/openforge-openclaw")
    k = 2 if harness == "mini" else 1
    run_dir, right = _run(harness, SOLUTIONS / f"qwenclawbench_{harness}.yaml",
                          tmp_path / "right", k)
    assert len(right) == 10 * k
    assert all(r.status == "ok" and r.passed and r.reward == 1.0 for r in right), [
        (r.task_id, r.status, r.error, r.reward_details.get("automated_breakdown"))
        for r in right if not r.passed]
    source = "openclaw" if harness == "openclaw" else "recorded calls"
    assert all(r.reward_details["transcript_source"] == source for r in right)
    report = json.loads((run_dir / "report.json").read_text())
    ours = {f"pass@{i}": report["pass_at_k"][str(i)] for i in range(1, k + 1)} | {
        f"pass^{i}": report["pass_hat_k"][str(i)] for i in range(1, k + 1)}
    theirs = _benchmark_pass_k(right, k)
    assert ours == {key: theirs[key] for key in ours} == {key: 1.0 for key in ours}
    _, wrong = _run(harness, SOLUTIONS / f"qwenclawbench_wrong_{harness}.yaml",
                    tmp_path / "wrong", 1)
    assert len(wrong) == 10 and all(r.status == "ok" and not r.passed for r in wrong)
    assert _benchmark_pass_k(wrong, 1)["pass@1"] == 0.0


def _every_fifth() -> list[str]:
    return sorted(t.id for t in load_tasks(Path(ROOT or ".") / DATASET))[::5]


def test_a_do_nothing_policy_is_scored_by_every_tasks_grader_and_passes_none(
        tmp_path: Path) -> None:
    """One final answer ("Done."), no tool call, scored by each task's own automated checks
    (scoring=automated). On every fifth task by id (20: task_00001, task_00006, ...,
    task_00096), as all 100 take ~3-5 minutes on 2 cores (docs/claw.md has that run):
    every one scored, none passed; task_00001 gives partial credit for doing nothing
    (0.25), task_00096's grader raises on the empty workspace (0, as the benchmark)."""
    idle = tmp_path / "idle.yaml"
    idle.write_text(yaml.safe_dump([{"replies": [{"content": "Done."}]}]))
    tasks = _every_fifth()
    _, results = _run("mini", idle, tmp_path / "runs", 1, tasks=tasks)
    assert sorted(r.task_id for r in results) == tasks and len(tasks) == 20
    assert all(r.status == "ok" and not r.passed for r in results), [
        (r.task_id, r.status, r.error) for r in results if r.status != "ok" or r.passed]
    # Each scored by its own checks (an `automated` task's is its full benchmark score).
    assert all(r.reward_details["scoring"] in ("automated-only", "benchmark")
               and r.reward_details["automated_breakdown"] is not None for r in results)
    credited = {r.task_id[:10]: r.reward for r in results if r.reward}
    raised = [r.task_id[:10] for r in results if r.reward_details.get("grader_error")]
    assert credited == {"task_00001": 0.25} and raised == ["task_00096"]


def test_pass_k_equals_the_benchmarks_own_on_trials_that_differ(tmp_path: Path) -> None:
    """The coin-flip script (each solution's last step done with probability 1/2) on 4
    solved tasks and one it answers "Done." (task_00001, never a pass), k=4: the report's
    pass@k and pass^k for k=1..4 equal scripts/lib_grading.pass_k_stats on the same per-run
    scores (its 4-decimal rounding). Mixed unless all 16 coins land alike (p = 2^-15)."""
    import json

    tasks = _solved_ids()[:4] + [_every_fifth()[0]]
    run_dir, results = _run("mini", SOLUTIONS / "qwenclawbench_coinflip_mini.yaml",
                            tmp_path / "runs", 4, tasks=tasks)
    assert len(results) == 20 and all(r.status == "ok" for r in results), [
        (r.task_id, r.status, r.error) for r in results if r.status != "ok"]
    passed = sum(r.passed for r in results)
    assert 0 < passed < 16, "every coin landed alike: the comparison would be trivial"
    report = json.loads((run_dir / "report.json").read_text())
    theirs = _benchmark_pass_k(results, 4)
    for i in range(1, 5):
        assert round(report["pass_at_k"][str(i)], 4) == theirs[f"pass@{i}"]
        assert round(report["pass_hat_k"][str(i)], 4) == theirs[f"pass^{i}"]


def test_the_grader_that_runs_the_agents_module_in_its_process_is_skipped_unless_asked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """task_00059's grader loads the agent's discount_calculator.py into its own process
    (`spec_from_file_location`), the only one of the 100 that does: code there can write any
    result. Skipped by default with its reason; with agent_code_in_grader=score it is scored
    as the benchmark does, and a module that writes its own result passes it."""
    from openforge_claw.environment import ClawEnvironment

    path = str(Path(ROOT or ".") / DATASET)
    ids = [t.id for t in ClawEnvironment(path=path, scoring="automated").tasks()]
    err = capsys.readouterr().err
    assert len(ids) == 99 and not [i for i in ids if i.startswith("task_00059")]
    assert ("qwenclawbench: 100 tasks, 99 runnable, 1 skipped:\n  1 skipped: its grader runs "
            "the agent's code in its own process (spec_from_file_location() at line 43)") in err
    env = ClawEnvironment(path=path, scoring="automated", agent_code_in_grader="score")
    task = next(t for t in env.tasks() if t.id.startswith("task_00059"))
    ws = tmp_path / "ws"
    ws.mkdir()
    env.prepare(task, ws)
    (ws / "discount_calculator.py").write_text(IN_PROCESS_FORGER)
    verdict = env.check(task, ws, env.final_state(task, ws))
    assert verdict.passed and verdict.details["automated_breakdown"] == {"forged": 1.0}
    assert verdict.details["agent_code_in_grader"] == (
        f"ran workspace code: {ws / 'discount_calculator.py'}")
