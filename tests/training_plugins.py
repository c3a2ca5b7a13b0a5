"""Plugins for the training tests, loaded as `training_plugins:Name` (PYTHONPATH reaches the sandbox)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openforge.environment import Environment
from openforge.reward import Reward
from openforge.types import Call, RewardResult, Task


class AnswerParityReward(Reward):
    """1.0 when the final answer has an even number of characters, else 0.0.

    An untrained model's answers are noise, so rewards within a GRPO group differ: what the
    verl test needs to see non-zero advantages and gradients, from a real reward plugin.
    """

    def score(self, task: Task, environment: Environment, workspace: Path,
              final_state: dict[str, Any], calls: list[Call] | None = None) -> RewardResult:
        answer = final_state.get("final_answer") or ""
        score = 1.0 if len(answer) % 2 == 0 else 0.0
        return RewardResult(score=score, passed=score == 1.0, details={"length": len(answer)})
