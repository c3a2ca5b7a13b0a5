"""The plugin module named in pyproject.toml's `openforge` entry point.

`online-mind2web` is registered here only (openforge-gui keeps the loader it builds on).
`mind2web-judge` is openforge-gui's `webjudge` with one difference: the judge model
defaults to `openai/o4-mini`, the backbone the benchmark recommends for WebJudge, where
`webjudge` asks for one. Every stage, option and the judge log are `openforge_gui.judge`'s.
"""

from __future__ import annotations

from typing import ClassVar

from openforge_gui.judge import WebJudgeReward

from openforge.hookspecs import hookimpl
from openforge_mind2web.environment import OnlineMind2WebEnvironment


class Mind2WebJudgeReward(WebJudgeReward):
    """WebJudge (openforge-gui's `webjudge`) with `openai/o4-mini` as the default judge."""

    label: ClassVar[str] = "mind2web-judge"
    default_model: ClassVar[str | None] = "openai/o4-mini"


@hookimpl
def register_environments(register):
    register("online-mind2web", OnlineMind2WebEnvironment)


@hookimpl
def register_rewards(register):
    register("mind2web-judge", Mind2WebJudgeReward)
