"""The Reward plugin kind: scores a finished rollout."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from openforge.environment import Environment
from openforge.options import Plugin
from openforge.types import Call, RewardResult, Task


class Reward(Plugin, ABC):
    """Base class of reward plugins.

    A reward that reads the trajectory sets `wants_calls = True`: the rollout then fetches
    the session's recorded calls from the gateway (with the session's own token) and passes
    them as `calls`.
    """

    kind = "reward"
    wants_calls: bool = False

    @abstractmethod
    def score(
        self,
        task: Task,
        environment: Environment,
        workspace: Path,
        final_state: dict[str, Any],
        calls: list[Call] | None = None,
    ) -> RewardResult:
        """Score one finished rollout. `calls` is the recorded trajectory when available."""
