"""Plugins with bugs, for the tests that a plugin error shows up as one (`plugin_bugs:Name`),
and plugins whose infrastructure fails, which say so (`RolloutInfraError`).

The rollout subprocess imports them through PYTHONPATH, like tests/executor_plugins.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openforge.builtin.checker import CheckerReward
from openforge.builtin.mini import MiniHarness
from openforge.builtin.tasks import TasksEnvironment
from openforge.environment import Environment
from openforge.errors import RolloutInfraError
from openforge.harness import Command, HarnessContext, HarnessOutput, ProcessOutput
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


class BuggyHarness(MiniHarness):
    """The `mini` harness, whose adapter raises in the method a task's id names:
    'harness-prepare-bug', 'harness-command-bug', 'harness-parse-bug' (after the agent ran)."""

    def prepare(self, ctx: HarnessContext) -> None:
        if "harness-prepare-bug" in ctx.task.id:
            raise FileNotFoundError("settings.json")
        super().prepare(ctx)

    def command(self, ctx: HarnessContext) -> Command:
        if "harness-command-bug" in ctx.task.id:
            raise TypeError("'NoneType' object is not iterable")
        return super().command(ctx)

    def parse_output(self, ctx: HarnessContext, proc: ProcessOutput) -> HarnessOutput:
        if "harness-parse-bug" in ctx.task.id:
            raise IndexError("list index out of range")
        return super().parse_output(ctx, proc)


class FlakyServiceEnvironment(TasksEnvironment):
    """The `tasks` environment, whose service does not come up for 'service-down' tasks: an
    infrastructure failure, said so with `RolloutInfraError`."""

    def prepare(self, task: Task, workspace: Path) -> None:
        if "service-down" in task.id:
            raise RolloutInfraError("the task's database did not come up")
        super().prepare(task, workspace)


class FlakyJudgeReward(CheckerReward):
    """The checker, whose judge endpoint is down for 'judge-down' tasks (after the agent ran)."""

    def score(self, task: Task, environment: Environment, workspace: Path,
              final_state: dict[str, Any], calls: list[Call] | None = None) -> RewardResult:
        if "judge-down" in task.id:
            raise RolloutInfraError("the judge endpoint answered 503")
        return super().score(task, environment, workspace, final_state, calls)
