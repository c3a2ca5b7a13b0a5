"""The `osworld` environment: OSWorld tasks on a DesktopEnv VM, served as the computer API.

Each rollout starts a DesktopEnv (in a worker process, see `worker.py`) with the provider
the user configured (docker, vmware, virtualbox, aws, ...), resets it to the task (its
`config` setup steps run in the VM), and serves the VM screen through openforge_gui's
computer API; the harness's actions become pyautogui snippets or computer_13 actions. When
the harness is done, the episode's end (`answer` -> DONE, `fail` -> FAIL) is sent to
DesktopEnv, and `evaluate()` runs the task's own evaluator: that is the `osworld` reward.
"""

from __future__ import annotations

import base64
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from openforge_gui.actions import Action
from openforge_gui.computer import ActionFailed, Computer, ComputerEnvironment, ComputerOptions
from pydantic import Field

from openforge.types import RewardResult, Task
from openforge_osworld.actions import (
    ACTION_SPACES,
    UnsupportedAction,
    final_action,
    to_computer_13,
    to_pyautogui,
)
from openforge_osworld.desktop import DesktopClient
from openforge_osworld.tasks import TaskFileError, iter_tasks

ENV_NAME = "osworld"
# DesktopEnv keyword arguments the environment passes through from its options.
_DESKTOP_OPTIONS = ("path_to_vm", "region", "snapshot_name", "headless", "require_a11y_tree",
                    "os_type", "client_password", "enable_proxy")


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or len(png) < 24:
        raise ValueError("the VM screenshot is not a PNG")
    width, height = struct.unpack(">II", png[16:24])
    return width, height


class OSWorldComputer(Computer):
    """A DesktopEnv VM as an openforge_gui `Computer`."""

    def __init__(self, desktop: DesktopClient, action_space: str = "pyautogui",
                 pause: float = 2.0, step_timeout_s: float = 300.0) -> None:
        self.desktop = desktop
        self.action_space = action_space
        self.pause = pause
        self.step_timeout_s = step_timeout_s
        self.sent: list[Any] = []  # what DesktopEnv.step received, in order

    def screenshot(self) -> tuple[bytes, int, int]:
        png = base64.b64decode(self.desktop.call("screenshot", timeout_s=self.step_timeout_s)["png"])
        return (png, *png_size(png))

    def perform(self, action: Action) -> None:
        try:
            step = to_pyautogui(action) if self.action_space == "pyautogui" \
                else to_computer_13(action)
        except UnsupportedAction as exc:
            raise ActionFailed(str(exc)) from None
        self.step(step)

    def step(self, step: Any) -> None:
        self.desktop.call("step", action=step, pause=self.pause, timeout_s=self.step_timeout_s)
        self.sent.append(step)

    def close(self) -> None:
        self.desktop.close()


class OSWorldOptions(ComputerOptions):
    """Options of the `osworld` environment."""

    max_steps: int = Field(default=15, ge=1)
    """Actions per episode at most (OSWorld-Verified's smallest step budget)."""
    tasks_dir: Path | None = None
    """A folder of OSWorld task files, e.g. OSWorld's evaluation_examples (required)."""
    index: str | None = None
    """An index file under tasks_dir selecting the tasks (default: <split>.json for a split)."""
    domains: list[str] | str | None = None
    """Only these domains (a list, or a comma-separated string)."""
    action_space: str = "pyautogui"
    """How actions reach DesktopEnv: pyautogui or computer_13."""
    provider: str = "docker"
    """DesktopEnv's provider_name: docker, vmware, virtualbox, aws, ..."""
    cache_dir: Path | None = None
    """DesktopEnv's cache_dir (default: a folder of the rollout's own outside the workspace,
    removed at its end). Never in the agent's reach: DesktopEnv's getters take a file
    already there for the download, the expected file of `get_cloud_file` included."""
    screen_width: int = 1920
    """The VM's screen width."""
    screen_height: int = 1080
    """The VM's screen height."""
    python: str | None = None
    """The interpreter that has desktop-env (default: this one)."""
    worker_env: dict[str, str] = Field(default_factory=dict)
    """Environment variables of the DesktopEnv worker process."""
    setup_timeout_s: float = 1800.0
    """Seconds for DesktopEnv's start, reset and evaluate."""
    pause: float = 2.0
    """Seconds DesktopEnv waits after each action."""
    step_timeout_s: float = 300.0
    """Seconds per action."""
    path_to_vm: str | None = None
    """Passed to DesktopEnv as is."""
    region: str | None = None
    """Passed to DesktopEnv as is."""
    snapshot_name: str | None = None
    """Passed to DesktopEnv as is."""
    headless: bool | None = None
    """Passed to DesktopEnv as is."""
    require_a11y_tree: bool | None = None
    """Passed to DesktopEnv as is."""
    os_type: str | None = None
    """Passed to DesktopEnv as is."""
    client_password: str | None = None
    """Passed to DesktopEnv as is."""
    enable_proxy: bool | None = None
    """Passed to DesktopEnv as is."""


class OSWorldEnvironment(ComputerEnvironment):
    """OSWorld desktop tasks on a DesktopEnv VM (docker, vmware, virtualbox, aws, ...)."""

    options_model = OSWorldOptions
    options: OSWorldOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.action_space = self.options.action_space
        if self.action_space not in ACTION_SPACES:
            raise ValueError(f"osworld: action_space must be one of {', '.join(ACTION_SPACES)}, "
                             f"not {self.action_space!r}")
        self.computer: OSWorldComputer | None = None
        self._score: float | None = None
        self._cache: Path | None = None  # the default cache_dir, this rollout's own

    # --- tasks -------------------------------------------------------------------------

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        """Task files under `tasks_dir` (its `examples/` folder when it has one), selected by
        the `index` option or, for a split, by the index file `<tasks_dir>/<split>.json`."""
        if not self.options.tasks_dir:
            raise TaskFileError("osworld: set the `tasks_dir` option to a folder of OSWorld task "
                                "files (e.g. OSWorld's evaluation_examples)")
        root = Path(self.options.tasks_dir).expanduser()
        examples = root / "examples" if (root / "examples").is_dir() else root
        index = self.options.index
        index_path = (root / index) if index else None
        if split is not None and index_path is None:
            index_path = root / f"{split}.json"
            if not index_path.is_file():
                raise TaskFileError(f"osworld: no index {index_path} for the split {split!r}")
        domains = self.options.domains
        if isinstance(domains, str):
            domains = [d.strip() for d in domains.split(",") if d.strip()]
        for domain, task in iter_tasks(examples, index_path, domains):
            yield Task(id=task.id, prompt=task.instruction, environment=ENV_NAME, split=split,
                       data={"osworld": task.model_dump(mode="json", exclude_none=True),
                             "domain": domain})

    # --- one rollout --------------------------------------------------------------------

    def desktop_options(self, workspace: Path) -> dict[str, Any]:
        """DesktopEnv's keyword arguments for this rollout."""
        opts = self.options
        kwargs: dict[str, Any] = {
            "provider_name": opts.provider,
            "action_space": self.action_space,
            "cache_dir": str(Path(opts.cache_dir) if opts.cache_dir else self._private_cache()),
            "screen_size": [opts.screen_width, opts.screen_height],
            "headless": True,
            "require_a11y_tree": False,
        }
        given = opts.model_dump(include=set(_DESKTOP_OPTIONS), exclude_none=True)
        kwargs.update(given)
        if kwargs.get("path_to_vm") and kwargs["provider_name"] in ("vmware", "virtualbox"):
            # A local VM file: absolute, since the worker runs in another working directory.
            kwargs["path_to_vm"] = str(Path(kwargs["path_to_vm"]).expanduser().resolve())
        return kwargs

    def _private_cache(self) -> Path:
        """The rollout's cache_dir outside the workspace: OSWorld's `get_cloud_file` skips
        the download of a file already in the cache, so an expected (gold) file the agent
        could place there would be the one its result is compared with."""
        if self._cache is None:
            self._cache = Path(tempfile.mkdtemp(prefix="openforge-osworld-cache-"))
        return self._cache

    def open_computer(self, task: Task, workspace: Path) -> Computer:
        if "osworld" not in task.data:
            raise ValueError(f"osworld: task {task.id} carries no OSWorld task JSON")
        log_dir = workspace / ".openforge"
        log_dir.mkdir(parents=True, exist_ok=True)
        worker_env = dict(self.options.worker_env)
        desktop = DesktopClient(self.options.python or sys.executable, env=worker_env,
                                stderr_path=log_dir / "desktop-env.log", cwd=log_dir)
        setup_timeout = self.options.setup_timeout_s
        try:
            desktop.call("start", options=self.desktop_options(workspace), timeout_s=setup_timeout)
            desktop.call("reset", task_config=task.data["osworld"], timeout_s=setup_timeout)
        except Exception:
            desktop.close()
            raise
        self._score = None
        self.computer = OSWorldComputer(desktop, self.action_space,
                                        pause=self.options.pause,
                                        step_timeout_s=self.options.step_timeout_s)
        return self.computer

    def final_state(self, task: Task, workspace: Path) -> dict[str, Any]:
        state = super().final_state(task, workspace)
        episode = self.episode
        # The episode's end is DesktopEnv's last action: infeasible tasks pass on FAIL only.
        if episode is not None and self.computer is not None and (episode.answer is not None
                                                                  or episode.failed is not None):
            end = final_action("fail" if episode.failed is not None else "answer")
            self.computer.step(end)
        sent = self.computer.sent if self.computer is not None else []
        state["osworld"] = {"actions": sent, "last_action": sent[-1] if sent else None,
                            "domain": task.data.get("domain", "")}
        return state

    def evaluate(self) -> float:
        """DesktopEnv.evaluate() for this rollout's task (postconfig, getters, metric), once."""
        if self.computer is None:
            raise RuntimeError("osworld: evaluate() before prepare(): no DesktopEnv is running")
        if self._score is None:
            timeout = self.options.setup_timeout_s
            self._score = float(self.computer.desktop.call("evaluate", timeout_s=timeout)["score"])
        return self._score

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        return score_result(task, self.evaluate(), final_state)

    def close(self) -> None:
        super().close()
        self.computer = None
        if self._cache is not None:
            shutil.rmtree(self._cache, ignore_errors=True)
            self._cache = None


def score_result(task: Task, raw: float, final_state: dict[str, Any]) -> RewardResult:
    """DesktopEnv's score as a RewardResult: passed is a full score."""
    score = min(1.0, max(0.0, raw))
    evaluator = task.data.get("osworld", {}).get("evaluator", {})
    osworld = final_state.get("osworld", {})
    return RewardResult(score=score, passed=score >= 1.0,
                        details={"evaluator": evaluator.get("func"), "raw_score": raw,
                                 "last_action": osworld.get("last_action"),
                                 "steps": final_state.get("episode", {}).get("steps")})
