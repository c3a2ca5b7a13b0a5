"""The module named in the `openforge` entry point: environment, rewards and recipe of
OpenForgeClaw. Implementations are imported on first use."""

from __future__ import annotations

from typing import Any

from openforge.hookspecs import Register, hookimpl


def claw(**options: Any) -> Any:
    """Claw tasks with local mock services (mail, calendar, notes, REST), fixtures and graders."""
    from openforge_claw.environment import ClawEnvironment

    return ClawEnvironment(**options)


def claw_grader(**options: Any) -> Any:
    """Claw-Eval score: safety x (0.8 completion + 0.2 robustness) from programmatic checks; pass >= 0.75."""
    from openforge_claw.rewards import GraderReward

    return GraderReward(**options)


def claw_judge(**options: Any) -> Any:
    """The task's rubric scored by a judge model through litellm (hybrid with the grader by default)."""
    from openforge_claw.rewards import JudgeReward

    return JudgeReward(**options)


def claw_recipe(**options: Any) -> Any:
    """Train claw agents: veRL config for a Qwen model, or the local trainer for small models."""
    from openforge_claw.recipes import ClawRecipe

    return ClawRecipe(**options)


@hookimpl
def register_environments(register: Register) -> None:
    register("claw", claw)


@hookimpl
def register_rewards(register: Register) -> None:
    register("claw-grader", claw_grader)
    register("claw-judge", claw_judge)


@hookimpl
def register_recipes(register: Register) -> None:
    register("claw", claw_recipe)
