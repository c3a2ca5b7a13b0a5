"""The `checker` reward: the environment's own programmatic verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openforge.environment import Environment
from openforge.errors import OpenforgeError
from openforge.reward import Reward
from openforge.types import Call, RewardResult, Task


class NoCheckerError(OpenforgeError):
    """The environment has no programmatic checker for the `checker` reward to call."""


class CheckerReward(Reward):
    """The environment's own programmatic checker: 1.0 when it passes, else its partial score."""

    def score(self, task: Task, environment: Environment, workspace: Path,
              final_state: dict[str, Any], calls: list[Call] | None = None) -> RewardResult:
        verdict = environment.check(task, workspace, final_state)
        if verdict is None:
            raise NoCheckerError(
                f"environment {type(environment).__name__} has no programmatic checker for task "
                f"{task.id!r}; choose another reward (--reward)")
        return verdict
