"""openforge-gui's plugins, declared under the `openforge` entry-point group.

Implementations are imported on first use, so `openforge plugins` stays fast and does not
need Playwright or litellm loaded. The `online-mind2web` environment is the
openforge-mind2web plugin's (on this package's loader and browser environment).
"""

from __future__ import annotations

from openforge.hookspecs import Register, hookimpl
from openforge.plugins import lazy


@hookimpl
def register_harnesses(register: Register) -> None:
    register("gui-agent", lazy("openforge_gui.harness:GuiAgentHarness"),
             "A computer-use loop: screenshot -> model (multimodal chat) -> action -> computer API.")


@hookimpl
def register_environments(register: Register) -> None:
    register("miniwob", lazy("openforge_gui.miniwob:MiniWobEnvironment"),
             "MiniWoB++ pages (PyPI miniwob) in headless Chromium, fixed seeds, reward read from the page.")
    register("webvoyager", lazy("openforge_gui.webtasks:WebVoyagerEnvironment"),
             "WebVoyager tasks ({web_name,id,ques,web} JSONL) on the live web in headless Chromium.")


@hookimpl
def register_rewards(register: Register) -> None:
    register("webjudge", lazy("openforge_gui.judge:WebJudgeReward"),
             "WebJudge-style LLM judge (key points -> key screenshots -> verdict) through litellm.")
