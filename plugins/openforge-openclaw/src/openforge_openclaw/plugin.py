"""The module named in the `openforge` entry point: registers the `openclaw` harness."""

from __future__ import annotations

from typing import Any

from openforge.hookspecs import Register, hookimpl


def openclaw(**options: Any) -> Any:
    """OpenClaw (`openclaw agent exec`, npm openclaw): chat, Responses or Messages by option `api`."""
    from openforge_openclaw.harness import create

    return create(**options)


@hookimpl
def register_harnesses(register: Register) -> None:
    register("openclaw", openclaw)
