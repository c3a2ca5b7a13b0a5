"""The Environment plugin kind: a task source plus a workspace preparer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openforge.options import Plugin
from openforge.types import RewardResult, Task

if TYPE_CHECKING:
    from openforge.harness import McpServer


class Environment(Plugin, ABC):
    """Base class of environment plugins."""

    kind = "environment"

    @abstractmethod
    def tasks(self, split: str | None = None) -> Iterable[Task]:
        """The tasks of this environment (of one split, when `split` is given)."""

    def prepare(self, task: Task, workspace: Path) -> None:
        """Lay out the workspace the rollout starts in (default: leave it empty)."""

    def mcp_servers(self, task: Task, workspace: Path) -> list[McpServer]:
        """The MCP servers that offer `task`'s own tools to the agent, after `prepare`
        (default: none). Harnesses that take MCP servers write them into their config.

        A server is a program the harness starts, so it runs inside the agent's sandbox
        with the agent's rights: it may only forward calls to something `prepare` started
        on the trusted side (which records them); never trust what it reports."""
        return []

    def data_paths(self, task: Task) -> list[Path]:
        """Files and folders outside the workspace that `task` reads and the agent may see:
        its reference data, inputs the agent works from, files the reward compares with.

        The agent sees them read-only (the isolating sandbox modes map them read-only;
        without isolation the supervisor hashes them before the agent starts and checks them
        before scoring: a change makes the attempt a `violation`, and the runner scores no
        later attempt against the changed data). Do not list what the agent must not read
        (a grader's expected answers): leave it out, and no sandbox maps it; the reward
        still reads it, on the trusted side. Anything the agent may change belongs in the
        workspace. Default: none.
        """
        return []

    def hidden_paths(self, task: Task) -> list[Path]:
        """Folders the agent must not read although a folder the sandbox maps holds them:
        answer keys (a task's expected results, scripted solutions) that the plugin ships
        inside its installed package, which the isolating sandboxes map read-only with the
        Python paths. Each is overmounted with an empty read-only folder in the agent's
        sandbox (and in the sandboxes that run its code while scoring), and a link the agent
        leaves into one is removed before scoring. Default: none.
        """
        return []

    def final_state(self, task: Task, workspace: Path) -> dict[str, Any]:
        """Capture what rewards read once the harness has ended (default: nothing)."""
        return {}

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult | None:
        """A programmatic verdict for `task`, when the environment has one (the `checker` reward)."""
        return None

    def close(self) -> None:
        """Tear down whatever `prepare` started (services, browsers)."""
