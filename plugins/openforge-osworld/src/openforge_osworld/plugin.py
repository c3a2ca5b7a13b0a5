"""The plugin module named in pyproject.toml's `openforge` entry point."""

from __future__ import annotations

from openforge.hookspecs import hookimpl
from openforge_osworld.environment import OSWorldEnvironment
from openforge_osworld.reward import OSWorldReward


@hookimpl
def register_environments(register):
    register("osworld", OSWorldEnvironment)


@hookimpl
def register_rewards(register):
    register("osworld", OSWorldReward)
