"""The `osworld` reward: the task's own OSWorld evaluator, run by DesktopEnv.evaluate().

DesktopEnv runs the task's `postconfig`, its result and expected getters and its metric(s)
(with their `and`/`or` conjunction); an infeasible task scores 1 only when the agent's last
action was FAIL (`fail` in the computer API), and any other task scores 0 after a FAIL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openforge.environment import Environment
from openforge.reward import Reward
from openforge.types import Call, RewardResult, Task
from openforge_osworld.environment import OSWorldEnvironment, score_result


class OSWorldReward(Reward):
    """OSWorld's programmatic evaluator for the task (DesktopEnv.evaluate()); needs env osworld."""

    def score(self, task: Task, environment: Environment, workspace: Path,
              final_state: dict[str, Any], calls: list[Call] | None = None) -> RewardResult:
        if not isinstance(environment, OSWorldEnvironment):
            raise TypeError("the osworld reward scores rollouts of the osworld environment only "
                            f"(got {type(environment).__name__}); run with --env osworld")
        return score_result(task, environment.evaluate(), final_state)
