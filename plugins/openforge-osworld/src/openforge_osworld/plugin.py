"""The plugin module named in pyproject.toml's `openforge` entry point.

Every openforge process that looks a plugin up loads this module (each rollout's supervisor
too), so it imports nothing of its own: `lazy` imports the environment and the reward when a
run uses them.
"""

from __future__ import annotations

from openforge.hookspecs import Register, hookimpl
from openforge.plugins import lazy


@hookimpl
def register_environments(register: Register) -> None:
    register("osworld", lazy("openforge_osworld.environment:OSWorldEnvironment"),
             "OSWorld desktop tasks on a DesktopEnv VM (docker, vmware, virtualbox, aws, ...).")


@hookimpl
def register_rewards(register: Register) -> None:
    register("osworld", lazy("openforge_osworld.reward:OSWorldReward"),
             "OSWorld's programmatic evaluator for the task (DesktopEnv.evaluate()); needs env osworld.")
