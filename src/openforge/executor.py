"""The Executor plugin kind: runs one rollout in isolation."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from openforge.options import Plugin
from openforge.types import RolloutResult, RolloutSpec


class Executor(Plugin, ABC):
    """Base class of executor plugins.

    `run` must enforce `spec.timeout_s` as a hard limit, leave no process or resource
    behind (after a timeout, a cancellation or a crash), and report infrastructure failures
    as `infra_error` / `timeout` results rather than raising.
    """

    # True when sandboxes see this machine's files, so a harness program installed here
    # once (`Harness.install`, called by the runner) can run in every rollout.
    kind = "executor"
    shares_filesystem: ClassVar[bool] = False

    @abstractmethod
    async def run(self, spec: RolloutSpec) -> RolloutResult:
        """Run one attempt and return its result."""

    async def close(self) -> None:
        """Release whatever the executor holds (called once at the end of a run)."""
