"""The `online-mind2web` environment: Online-Mind2Web tasks in headless Chromium.

Tasks come from Online-Mind2Web's task file, a JSON list (or JSONL) of

    {"task_id": str, "website": str, "confirmed_task": str, "reference_length": int, ...}

read by openforge-gui's `load_online_mind2web`; each rollout opens a fresh browser at the
task's `website` (the benchmark's rule: start from the given site) through openforge-gui's
`WebTaskEnvironment` (options `path`, `width` x `height`, `max_steps`, `chromium`). What
this plugin adds:

- `sites`: maps a website to another URL, e.g. a local copy or a stand-in:
  `{"https://www.x.com": "http://127.0.0.1:8000/"}` (matched with and without its slash);
- the episode in Online-Mind2Web's result layout under `.openforge/mind2web/<task_id>/`:
  `result.json` (`task_id`, `task`, `website`, `action_history`, `thoughts`,
  `final_result_response`) and `trajectory/<n>_full_screenshot.png`, for the benchmark's
  own evaluation scripts; its folder is `mind2web_result` in the final state.

Score it with `webjudge` (or `mind2web-judge`, the same judge with the benchmark's
recommended judge model as default).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from openforge_gui.webtasks import WebTaskEnvironment, WebTaskOptions, load_online_mind2web
from pydantic import Field

from openforge.sandbox.scrub import fresh_path
from openforge.types import Task

ENV_NAME = "online-mind2web"
RESULT_DIR = Path(".openforge") / "mind2web"


class Mind2WebOptions(WebTaskOptions):
    """Options of the `online-mind2web` environment."""

    sites: dict[str, str] = Field(default_factory=dict)
    """Task website -> the URL to open instead (a local copy, a stand-in)."""


class OnlineMind2WebEnvironment(WebTaskEnvironment):
    """Online-Mind2Web tasks ({task_id,website,confirmed_task,...}) in headless Chromium."""

    name = ENV_NAME
    options_model = Mind2WebOptions
    options: Mind2WebOptions

    def load(self) -> list[Task]:
        return load_online_mind2web(self.path, self.name)

    def start_url(self, task: Task) -> str:
        """The task's website, or what the `sites` option maps it to."""
        website = super().start_url(task)
        sites = self.options.sites
        for key in (website, website.rstrip("/"), website.rstrip("/") + "/"):
            if key in sites:
                return sites[key]
        return website

    def final_state(self, task: Task, workspace: Path) -> dict[str, Any]:
        state = super().final_state(task, workspace)
        episode = state.get("episode")
        if episode is not None:
            state["mind2web_result"] = str(write_result(task, episode, workspace))
        return state


def write_result(task: Task, episode: dict[str, Any], workspace: Path) -> Path:
    """The episode in Online-Mind2Web's layout; returns the task's result folder.

    The answer is not part of `action_history` (the benchmark's rule): it is
    `final_result_response`.
    """
    # The benchmark's scripts read this folder: nothing the agent left there may remain.
    folder = fresh_path(workspace, RESULT_DIR / task.id)
    trajectory = folder / "trajectory"
    trajectory.mkdir(parents=True)
    history = [h for h in episode["history"] if h["action"]["type"] not in ("answer", "fail")]
    for n, entry in enumerate(episode["history"]):
        if entry.get("screenshot") and Path(entry["screenshot"]).is_file():
            shutil.copyfile(entry["screenshot"], trajectory / f"{n}_full_screenshot.png")
    result = {"task_id": task.id, "task": task.data["task_text"],
              "website": task.data["start_url"],
              "action_history": [h["action_text"] for h in history],
              "thoughts": [], "final_result_response": episode.get("answer") or "",
              "failed": episode.get("failed")}
    (folder / "result.json").write_text(json.dumps(result, indent=2))
    return folder
