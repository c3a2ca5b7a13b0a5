"""The module named in the `openforge` entry point: registers the `codex` harness."""

from __future__ import annotations

from typing import Any

from openforge.hookspecs import Register, hookimpl


def _codex(**options: Any) -> Any:
    from openforge_codex.harness import CodexHarness

    return CodexHarness(**options)


@hookimpl
def register_harnesses(register: Register) -> None:
    register("codex", _codex, "OpenAI Codex CLI (`codex exec`, npm @openai/codex), Responses API.")
