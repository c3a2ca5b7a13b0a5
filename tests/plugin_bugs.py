"""Plugins with bugs, for the tests that a plugin error shows up as one (`plugin_bugs:Name`).

The rollout subprocess imports them through PYTHONPATH, like tests/executor_plugins.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openforge.builtin.checker import CheckerReward
from openforge.builtin.tasks import TasksEnvironment
from openforge.environment import Environment
from openforge.types import Call, RewardResult, Task


class PrepareBugEnvironment(TasksEnvironment):
    """The `tasks` environment, whose prepare raises for tasks whose id has 'prepare-bug'."""

    def prepare(self, task: Task, workspace: Path) -> None:
        if "prepare-bug" in task.id:
            raise KeyError("fixture")
        super().prepare(task, workspace)


class ScoreBugReward(CheckerReward):
    """The checker, except that score raises for tasks whose id has 'score-bug'."""

    def score(self, task: Task, environment: Environment, workspace: Path,
              final_state: dict[str, Any], calls: list[Call] | None = None) -> RewardResult:
        if "score-bug" in task.id:
            raise ZeroDivisionError("division by zero")
        return super().score(task, environment, workspace, final_state, calls)
