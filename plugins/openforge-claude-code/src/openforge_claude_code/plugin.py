"""The module named in the `openforge` entry point: registers the `claude-code` harness."""

from __future__ import annotations

from openforge.hookspecs import Register, hookimpl
from openforge.plugins import lazy


@hookimpl
def register_harnesses(register: Register) -> None:
    register("claude-code", lazy("openforge_claude_code.harness:ClaudeCodeHarness"),
             "Claude Code (`claude -p`, npm @anthropic-ai/claude-code), Anthropic Messages API.")
