"""`mind2web-judge`: openforge-gui's `webjudge` with one difference, the judge model
defaults to `openai/o4-mini`, the backbone the benchmark recommends for WebJudge, where
`webjudge` asks for one. Every stage, option and the judge log are `openforge_gui.judge`'s.
"""

from __future__ import annotations

from typing import ClassVar

from openforge_gui.judge import WebJudgeReward


class Mind2WebJudgeReward(WebJudgeReward):
    """WebJudge (openforge-gui's `webjudge`) with `openai/o4-mini` as the default judge."""

    label: ClassVar[str] = "mind2web-judge"
    default_model: ClassVar[str | None] = "openai/o4-mini"
