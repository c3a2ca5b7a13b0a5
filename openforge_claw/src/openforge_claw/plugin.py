"""The module named in the `openforge` entry point: environment, rewards and recipe of
OpenForgeClaw. Implementations are imported on first use."""

from __future__ import annotations

from openforge.hookspecs import Register, hookimpl
from openforge.plugins import lazy


@hookimpl
def register_environments(register: Register) -> None:
    register("claw", lazy("openforge_claw.environment:ClawEnvironment"),
             "Claw tasks with local mock services (mail, calendar, notes, REST), fixtures and graders.")


@hookimpl
def register_rewards(register: Register) -> None:
    register("claw-grader", lazy("openforge_claw.rewards:GraderReward"),
             "Claw-Eval score: safety x (0.8 completion + 0.2 robustness) from programmatic "
             "checks; pass >= 0.75.")
    register("claw-judge", lazy("openforge_claw.rewards:JudgeReward"),
             "The task's rubric scored by a judge model through litellm (hybrid with the grader "
             "by default).")


@hookimpl
def register_recipes(register: Register) -> None:
    register("claw", lazy("openforge_claw.recipes:ClawRecipe"),
             "Train claw agents: veRL config for a Qwen model, or the local trainer for small models.")
