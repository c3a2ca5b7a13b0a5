"""The Reward plugin kind: scores a finished rollout."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from openforge.environment import Environment
from openforge.types import Call, RewardResult, Task


class Reward(ABC):
    """Base class of reward plugins.

    A reward that reads the trajectory sets `wants_calls = True`: the rollout supervisor then
    fetches the session's recorded calls on the trusted side, after every process of the agent
    is gone (`GET /scoring/sessions/{id}/calls` with the session's scoring credential, which the
    agent never holds), and passes them as `calls`.

    `score` runs on the trusted side, after the agent ended: it may read the workspace (what
    the agent left) and the environment's `data_paths` (which the agent could not change).
    An exception it raises makes the attempt a `plugin_error` (not scored, not retried).
    """

    wants_calls: bool = False

    def __init__(self, **options: Any) -> None:
        self.options = options

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
