"""The module named in the `openforge` entry point: registers the `codex` harness."""

from __future__ import annotations

from openforge.hookspecs import Register, hookimpl
from openforge.plugins import lazy


@hookimpl
def register_harnesses(register: Register) -> None:
    register("codex", lazy("openforge_codex.harness:CodexHarness"), "OpenAI Codex CLI (`codex exec`, npm @openai/codex), Responses API.")
