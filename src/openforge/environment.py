"""The Environment plugin kind: a task source plus a workspace preparer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from openforge.options import Plugin
from openforge.types import RewardResult, Task


class Environment(Plugin, ABC):
    """Base class of environment plugins."""

    kind = "environment"

    @abstractmethod
    def tasks(self, split: str | None = None) -> Iterable[Task]:
        """The tasks of this environment (of one split, when `split` is given)."""

    def prepare(self, task: Task, workspace: Path) -> None:
        """Lay out the workspace the rollout starts in (default: leave it empty)."""

    def final_state(self, task: Task, workspace: Path) -> dict[str, Any]:
        """Capture what rewards read once the harness has ended (default: nothing)."""
        return {}

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult | None:
        """A programmatic verdict for `task`, when the environment has one (the `checker` reward)."""
        return None

    def close(self) -> None:
        """Tear down whatever `prepare` started (services, browsers)."""
