"""The module named in the `openforge` entry point: registers the `openclaw` harness."""

from __future__ import annotations

from openforge.hookspecs import Register, hookimpl
from openforge.plugins import lazy


@hookimpl
def register_harnesses(register: Register) -> None:
    register("openclaw", lazy("openforge_openclaw.harness:create"),
             "OpenClaw (`openclaw agent exec`, npm openclaw): chat, Responses or Messages by option `api`.")
