"""Acceptance on the real Claw-Eval (github:claw-eval/claw-eval): set OPENFORGE_CLAW_EVAL_PATH
to a checkout (its root, holding tasks/, mock_services/ and src/claw_eval). Every one of its
300 tasks loads; the runnable and skipped counts, by reason, are docs/claw.md's table
(measured at commit 9365e1a); the 12 scripted solutions (solutions/claw_eval_mini.yaml) pass
the tasks' own graders through `mini`, with their services and tool proxy, and their wrong
twins fail; a do-nothing policy is scored on every runnable task and passes none; the
report's Claw-Eval pass@k / pass^k estimators equal the checkout's own on trials that differ.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import SOLUTIONS

from openforge_claw.claweval.survey import survey
from openforge_claw.environment import ClawEnvironment
from openforge_claw.tasks import load_tasks

ROOT = os.environ.get("OPENFORGE_CLAW_EVAL_PATH")
pytestmark = pytest.mark.skipif(
    not ROOT, reason="set OPENFORGE_CLAW_EVAL_PATH to a Claw-Eval checkout (github:"
                     "claw-eval/claw-eval; .ci/run does where the machine has it); docs/claw.md has the commands")

# docs/claw.md, "Measured on the real repository at 9365e1a".
SKIPPED = {"fixture files not in the checkout": 83,
           "need the real web (web_real services, SERP_DEV_KEY)": 60,
           "need a simulated user (multi-turn user_agent)": 3,
           "need the LLM judge (set judge_base_url and judge_model)": 134}
WITH_THE_NEED = {"fixture": 83, "real_web": 63, "simulated_user": 38, "judge": 245}


def _env(**options: str) -> ClawEnvironment:
    return ClawEnvironment(path=str(ROOT), **options)


def _solved_ids() -> list[str]:
    return [e["task"] for e in yaml.safe_load((SOLUTIONS / "claw_eval.yaml").read_text())]


def test_every_real_task_loads_and_the_skips_are_the_documented_ones(
        capsys: pytest.CaptureFixture[str]) -> None:
    loaded = load_tasks(Path(str(ROOT)))
    assert len(loaded) == 300 and not loaded.skipped  # no unreadable task.yaml
    env = _env()
    reasons = Counter(why.reason for t in loaded if (why := env.skipped(t)) is not None)
    assert reasons == SKIPPED
    runnable = env.claw_tasks()
    assert "claw-eval: 300 tasks, 20 runnable, 280 skipped:" in capsys.readouterr().err
    assert len(runnable) == 20 and set(_solved_ids()) <= {t.id for t in runnable}
    rows, every = survey(Path(str(ROOT)), judged=False)
    assert len(rows["runnable"]) == 20 and dict(every) == WITH_THE_NEED
    # With a judge endpoint set (never called while loading), the judged tasks run too.
    judged = _env(judge_base_url="http://127.0.0.1:9/v1", judge_model="judge").claw_tasks()
    assert len(judged) == 154


def _run(script: Path, runs: Path, tasks: list[str] | None = None, k: int = 1):
    """The scripted `script` through `mini` on `tasks` (default: the solved ones; [] for
    every runnable task), k trials each: (run directory, results)."""
    from openforge.config import EngineConfig, RunConfig
    from openforge.runner import read_results, run_from_config
    from openforge.types import SamplingParams

    config = RunConfig(
        harness="mini", environment="claw", reward="claw-grader", concurrency=3, k=k,
        # The solutions write whole reports in one reply: more than the default budgets.
        sampling=SamplingParams(max_tokens=4096),
        harness_options={"max_steps": 8, "max_tokens": 4096},
        environment_options={"path": str(ROOT)},
        tasks=_solved_ids() if tasks is None else tasks, timeout_s=300,
        runs_dir=runs, engine=EngineConfig(name="scripted", options={"script": str(script)}))
    run_dir = run_from_config(config).run_dir
    return run_dir, read_results(run_dir)


def test_solutions_pass_their_graders_through_mini_and_wrong_ones_fail(tmp_path: Path) -> None:
    _, right = _run(SOLUTIONS / "claw_eval_mini.yaml", tmp_path / "right")
    assert sorted(r.task_id for r in right) == sorted(_solved_ids()) and len(right) == 12
    assert all(r.status == "ok" and r.passed and r.reward == 1.0 for r in right), [
        (r.task_id, r.status, r.error, r.reward, r.reward_details.get("category"))
        for r in right if not r.passed or r.reward != 1.0]
    _, wrong = _run(SOLUTIONS / "wrong_claw_eval_mini.yaml", tmp_path / "wrong")
    assert len(wrong) == 12 and all(r.status == "ok" and not r.passed for r in wrong), [
        (r.task_id, r.status, r.error, r.reward) for r in wrong if r.status != "ok" or r.passed]
    assert round(sum(r.reward or 0.0 for r in wrong) / 12, 3) == 0.265


def test_a_do_nothing_policy_is_scored_by_every_runnable_tasks_grader_and_passes_none(
        tmp_path: Path) -> None:
    """One final answer, no tool call, on each of the 20 tasks runnable without a judge:
    every one scored by its own grader (no infrastructure failure), none passed; the mean
    is robustness credit (no tool call failed)."""
    idle = tmp_path / "idle.yaml"
    idle.write_text(yaml.safe_dump([{"replies": [{"content": "I have finished the task."}]}]))
    _, results = _run(idle, tmp_path / "runs", tasks=[])
    assert len(results) == 20 and {r.task_id for r in results} == {
        t.id for t in _env().claw_tasks()}
    assert all(r.status == "ok" and not r.passed for r in results), [
        (r.task_id, r.status, r.error) for r in results if r.status != "ok" or r.passed]
    assert all(r.reward_details["benchmark"] == "claw-eval"
               and r.reward_details["grader"].endswith(("Grader", "GraderEN")) for r in results)
    assert round(sum(r.reward or 0.0 for r in results) / 20, 3) == 0.196


# Solved tasks that fail when their tool calls are skipped (others pass on the final
# answer alone: T087, T090, T092, T095), cheap ones: 1, 5, 2 tool calls and 2 commands.
COIN_TASKS = ["T086_pinbench_calendar_event_creation", "T088_pinbench_project_bootstrap_plan",
              "T099_pinbench_second_brain_recall", "T102_xss_filter"]
COIN = "[ $(od -An -N1 -tu1 /dev/urandom) -lt 128 ] || touch .tails\n"


def _coin_flip_script(tasks: list[str]) -> list[dict[str, object]]:
    """claw_eval_mini.yaml's solutions of `tasks` behind one coin flip per rollout: on tails
    (a file in the rollout's own workspace) every command is skipped and only the final
    answer is given, so a task's trials pass and fail at random."""
    matches = {e["match"] for e in yaml.safe_load((SOLUTIONS / "claw_eval.yaml").read_text())
               if e["task"] in tasks}
    entries = [e for e in yaml.safe_load((SOLUTIONS / "claw_eval_mini.yaml").read_text())
               if e["match"] in matches]
    for entry in entries:
        calls = [c for reply in entry["replies"] for c in reply.get("tool_calls") or []]
        for n, call in enumerate(calls):
            call["arguments"]["command"] = ((COIN if n == 0 else "")
                                            + f"[ -e .tails ] || {call['arguments']['command']}")
    return entries


def _claw_eval_estimators(results, k: int) -> dict[str, dict[str, float]]:
    """The checkout's own compute_pass_at_k / compute_pass_hat_k per task, from the same
    per-trial scores (its threshold), mean over tasks."""
    sys.path.insert(0, str(Path(str(ROOT)) / "src"))
    try:
        from claw_eval.models.scoring import compute_pass_at_k, compute_pass_hat_k
    finally:
        sys.path.pop(0)
    scores: dict[str, list[float]] = {}
    for r in results:
        scores.setdefault(r.task_id, []).append(float(r.reward))
    out: dict[str, dict[str, float]] = {"pass_at_k": {}, "pass_hat_k": {}}
    for i in range(1, k + 1):
        out["pass_at_k"][str(i)] = sum(compute_pass_at_k(s, k=i) for s in scores.values()) / len(scores)
        out["pass_hat_k"][str(i)] = sum(compute_pass_hat_k(s, k=i) for s in scores.values()) / len(scores)
    return out


def test_pass_k_estimators_equal_claw_evals_own_on_trials_that_differ(tmp_path: Path) -> None:
    """A coin-flip policy on 4 solved tasks, k=3: the report's Claw-Eval estimators equal
    the checkout's own functions on the same scores, and its all/any counts are Claw-Eval's
    batch summary (the share of tasks whose 3 trials all / any passed). The run is mixed
    unless all 12 coins land alike (p = 2^-11)."""
    script = tmp_path / "coin.yaml"
    script.write_text(yaml.safe_dump(_coin_flip_script(COIN_TASKS), allow_unicode=True))
    run_dir, results = _run(script, tmp_path / "runs", tasks=COIN_TASKS, k=3)
    assert len(results) == 12 and all(r.status == "ok" for r in results), [
        (r.task_id, r.status, r.error) for r in results if r.status != "ok"]
    passed = sum(r.passed for r in results)
    assert 0 < passed < 12, "every trial came out the same: the comparison would be trivial"
    report = json.loads((run_dir / "report.json").read_text())["behaviours"]
    theirs = _claw_eval_estimators(results, 3)
    ours = report["claw_eval_estimators"]
    assert ours["tasks"] == 4
    assert ours["pass_at_k"] == pytest.approx(theirs["pass_at_k"])
    assert ours["pass_hat_k"] == pytest.approx(theirs["pass_hat_k"])
    trials = {t: [r.passed for r in results if r.task_id == t] for t in COIN_TASKS}
    assert report["pass_hat_k"]["3"] == sum(all(v) for v in trials.values()) / 4
    assert report["pass_at_k"]["3"] == sum(any(v) for v in trials.values()) / 4
