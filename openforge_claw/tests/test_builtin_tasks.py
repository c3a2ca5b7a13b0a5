"""The built-in task set: its shape, and every grader shown able to pass and to fail.

Each task is prepared for real (fixtures copied, mock services started on loopback), the
scripted solutions' shell commands are run in the workspace exactly as the agent's shell
tool would run them, and the claw-grader scores the final state: the right script passes
every task, the deliberately wrong one and an untouched workspace fail every task.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import SOLUTIONS, run_direct

from openforge_claw.environment import ClawEnvironment
from openforge_claw.grading import CHECKS
from openforge_claw.tasks import builtin_tasks

TASKS = list(ClawEnvironment().tasks())
IDS = [t.id for t in TASKS]


def test_at_least_forty_tasks_across_categories_and_splits() -> None:
    assert len(TASKS) >= 40 and len(set(IDS)) == len(IDS)
    categories = Counter(t.data["category"] for t in TASKS)
    assert set(categories) == {"files", "shell", "services", "plan"}
    assert min(categories.values()) >= 8
    splits = Counter(t.split for t in TASKS)
    assert splits["train"] >= 30 and splits["test"] >= 8
    env = ClawEnvironment()
    assert {t.id for t in env.tasks("test")}.isdisjoint(t.id for t in env.tasks("train"))


def test_every_check_type_is_known_and_every_task_has_a_rubric() -> None:
    for ct in builtin_tasks():
        assert ct.rubric and ct.grader.checks
        for check in [*ct.grader.checks, *ct.grader.robustness, *ct.grader.safety]:
            assert check.type in CHECKS, (ct.id, check.type)


@pytest.mark.parametrize("harness", ["mini", "openclaw"])
def test_each_task_matches_exactly_one_script_entry(harness: str) -> None:
    for name in (f"{harness}.yaml", f"wrong_{harness}.yaml"):
        entries = yaml.safe_load((SOLUTIONS / name).read_text())
        for task in TASKS:
            hits = [e for e in entries if re.search(e["match"], task.prompt)]
            assert len(hits) == 1, (name, task.id, len(hits))


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_right_script_passes_wrong_script_and_nothing_fail(task, tmp_path: Path) -> None:
    env = ClawEnvironment()
    good, _ = run_direct(env, task, tmp_path / "good", SOLUTIONS / "mini.yaml")
    assert good.passed and good.score == 1.0, good.details
    bad, _ = run_direct(env, task, tmp_path / "bad", SOLUTIONS / "wrong_mini.yaml")
    assert not bad.passed, bad.details
    assert bad.details["category"] in ("wrong_final_state", "unsafe_action", "tool_error")
    idle, _ = run_direct(env, task, tmp_path / "idle", None)
    assert not idle.passed, idle.details
