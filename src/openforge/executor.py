"""The Executor plugin kind: runs one rollout in isolation."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from openforge.options import Plugin
from openforge.types import RolloutResult, RolloutSpec


class Executor(Plugin, ABC):
    """Base class of executor plugins.

    `run` must enforce `spec.timeout_s` as a hard limit, leave no process or resource
    behind (after a timeout, a cancellation or a crash), and report infrastructure failures
    as `infra_error` / `timeout` results rather than raising. The result it returns must be
    one the agent could not have written (docs/sandboxing.md: the invariant every executor
    keeps); the rollout stack refuses a result for another rollout, task, attempt or session.
    """

    kind = "executor"
    # True when sandboxes see this machine's files, so a harness program installed here
    # once (`Harness.install`, called by the runner) can run in every rollout.
    shares_filesystem: ClassVar[bool] = False

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.protected: list[Path] = []

    def protect(self, *paths: Path) -> None:
        """Folders no sandbox may see (the run directory with its store); the runner calls
        this before the first rollout. Executors whose sandboxes share this machine's files
        keep them out of every sandbox's view."""
        self.protected.extend(Path(p).resolve() for p in paths)

    @abstractmethod
    async def run(self, spec: RolloutSpec) -> RolloutResult:
        """Run one attempt and return its result."""

    async def find_attempt(self, run_id: str, task_id: str, attempt: int) -> str | None:
        """The rollout id of the last try of attempt `attempt` of `task_id` whose sandbox an
        earlier process of run `run_id` left behind, alive or finished with its result (a
        resumed run then continues that try). Default: none survive their process."""
        return None

    async def adoptable(self, spec: RolloutSpec) -> bool:
        """Whether `run(spec)` would take over a sandbox an earlier process started for this
        very attempt (a resumed run then reuses the attempt's session instead of opening a
        new one). Default: sandboxes die with the process that started them."""
        return False

    def progress(self) -> str:
        """What rollouts wait for right now (a quota, an image pull), for the progress line."""
        return ""

    async def close(self) -> None:
        """Release whatever the executor holds (called once at the end of a run)."""
