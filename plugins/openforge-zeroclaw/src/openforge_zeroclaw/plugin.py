"""The module named in the `openforge` entry point: registers the `zeroclaw` harness."""

from __future__ import annotations

from openforge.hookspecs import Register, hookimpl
from openforge.plugins import lazy


@hookimpl
def register_harnesses(register: Register) -> None:
    register("zeroclaw", lazy("openforge_zeroclaw.harness:create"),
             "ZeroClaw (`zeroclaw agent -m`, Rust binary from ZEROCLAW_BIN or PATH): chat, Responses or Messages.")
