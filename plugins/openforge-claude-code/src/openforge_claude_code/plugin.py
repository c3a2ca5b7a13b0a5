"""The module named in the `openforge` entry point: registers the `claude-code` harness."""

from __future__ import annotations

from typing import Any

from openforge.hookspecs import Register, hookimpl


def _claude_code(**options: Any) -> Any:
    from openforge_claude_code.harness import ClaudeCodeHarness

    return ClaudeCodeHarness(**options)


@hookimpl
def register_harnesses(register: Register) -> None:
    register("claude-code", _claude_code,
             "Claude Code (`claude -p`, npm @anthropic-ai/claude-code), Anthropic Messages API.")
