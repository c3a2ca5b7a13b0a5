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
import struct
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from openforge_gui.actions import Action
from openforge_gui.computer import ActionFailed, Computer, ComputerEnvironment

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


class OSWorldEnvironment(ComputerEnvironment):
    """OSWorld desktop tasks on a DesktopEnv VM (docker, vmware, virtualbox, aws, ...)."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("max_steps", 15)  # OSWorld-Verified's smallest step budget
        super().__init__(**options)
        self.action_space = str(options.get("action_space", "pyautogui"))
        if self.action_space not in ACTION_SPACES:
            raise ValueError(f"osworld: action_space must be one of {', '.join(ACTION_SPACES)}, "
                             f"not {self.action_space!r}")
        self.computer: OSWorldComputer | None = None
        self._score: float | None = None

    # --- tasks -------------------------------------------------------------------------

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        """Task files under `tasks_dir` (its `examples/` folder when it has one), selected by
        the `index` option or, for a split, by the index file `<tasks_dir>/<split>.json`."""
        if not self.options.get("tasks_dir"):
            raise TaskFileError("osworld: set the `tasks_dir` option to a folder of OSWorld task "
                                "files (e.g. OSWorld's evaluation_examples)")
        root = Path(self.options["tasks_dir"]).expanduser()
        examples = root / "examples" if (root / "examples").is_dir() else root
        index = self.options.get("index")
        index_path = (root / index) if index else None
        if split is not None and index_path is None:
            index_path = root / f"{split}.json"
            if not index_path.is_file():
                raise TaskFileError(f"osworld: no index {index_path} for the split {split!r}")
        domains = self.options.get("domains")
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
            "provider_name": opts.get("provider", "docker"),
            "action_space": self.action_space,
            "cache_dir": str(Path(opts.get("cache_dir") or workspace / ".openforge" / "osworld-cache")),
            "screen_size": [int(opts.get("screen_width", 1920)), int(opts.get("screen_height", 1080))],
            "headless": True,
            "require_a11y_tree": False,
        }
        kwargs.update({k: opts[k] for k in _DESKTOP_OPTIONS if k in opts})
        if kwargs.get("path_to_vm") and kwargs["provider_name"] in ("vmware", "virtualbox"):
            # A local VM file: absolute, since the worker runs in another working directory.
            kwargs["path_to_vm"] = str(Path(kwargs["path_to_vm"]).expanduser().resolve())
        return kwargs

    def open_computer(self, task: Task, workspace: Path) -> Computer:
        if "osworld" not in task.data:
            raise ValueError(f"osworld: task {task.id} carries no OSWorld task JSON")
        log_dir = workspace / ".openforge"
        log_dir.mkdir(parents=True, exist_ok=True)
        worker_env = {str(k): str(v) for k, v in (self.options.get("worker_env") or {}).items()}
        desktop = DesktopClient(str(self.options.get("python") or sys.executable), env=worker_env,
                                stderr_path=log_dir / "desktop-env.log", cwd=log_dir)
        setup_timeout = float(self.options.get("setup_timeout_s", 1800))
        try:
            desktop.call("start", options=self.desktop_options(workspace), timeout_s=setup_timeout)
            desktop.call("reset", task_config=task.data["osworld"], timeout_s=setup_timeout)
        except Exception:
            desktop.close()
            raise
        self._score = None
        self.computer = OSWorldComputer(desktop, self.action_space,
                                        pause=float(self.options.get("pause", 2.0)),
                                        step_timeout_s=float(self.options.get("step_timeout_s", 300)))
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
            timeout = float(self.options.get("setup_timeout_s", 1800))
            self._score = float(self.computer.desktop.call("evaluate", timeout_s=timeout)["score"])
        return self._score

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        return score_result(task, self.evaluate(), final_state)

    def close(self) -> None:
        super().close()
        self.computer = None


def score_result(task: Task, raw: float, final_state: dict[str, Any]) -> RewardResult:
    """DesktopEnv's score as a RewardResult: passed is a full score."""
    score = min(1.0, max(0.0, raw))
    evaluator = task.data.get("osworld", {}).get("evaluator", {})
    osworld = final_state.get("osworld", {})
    return RewardResult(score=score, passed=score >= 1.0,
                        details={"evaluator": evaluator.get("func"), "raw_score": raw,
                                 "last_action": osworld.get("last_action"),
                                 "steps": final_state.get("episode", {}).get("steps")})
