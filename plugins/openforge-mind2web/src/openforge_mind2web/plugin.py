"""The plugin module named in pyproject.toml's `openforge` entry point.

`online-mind2web` is registered here only (openforge-gui keeps the loader it builds on);
`mind2web-judge` is in judge.py. Every openforge process that looks a plugin up loads this
module (each rollout's supervisor too), so it imports nothing of its own: `lazy` imports
the environment and the judge when a run uses them (eagerly they cost every such process
0.47 s: httpx, the browser, the judge).
"""

from __future__ import annotations

from openforge.hookspecs import Register, hookimpl
from openforge.plugins import lazy


@hookimpl
def register_environments(register: Register) -> None:
    register("online-mind2web", lazy("openforge_mind2web.environment:OnlineMind2WebEnvironment"),
             "Online-Mind2Web tasks ({task_id,website,confirmed_task,...}) in headless Chromium.")


@hookimpl
def register_rewards(register: Register) -> None:
    register("mind2web-judge", lazy("openforge_mind2web.judge:Mind2WebJudgeReward"),
             "WebJudge (openforge-gui's `webjudge`) with `openai/o4-mini` as the default judge.")
