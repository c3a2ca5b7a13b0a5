"""The module named in the `openforge` entry point: registers the `zeroclaw` harness."""

from __future__ import annotations

from typing import Any

from openforge.hookspecs import Register, hookimpl


def zeroclaw(**options: Any) -> Any:
    """ZeroClaw (`zeroclaw agent -m`, Rust binary from ZEROCLAW_BIN or PATH): chat, Responses or Messages."""
    from openforge_zeroclaw.harness import create

    return create(**options)


@hookimpl
def register_harnesses(register: Register) -> None:
    register("zeroclaw", zeroclaw)
