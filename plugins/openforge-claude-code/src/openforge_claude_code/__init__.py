"""openforge harness plugin for Claude Code (`claude -p`), speaking the Anthropic Messages API.

The harness lives in `openforge_claude_code.harness` (imported only when a run uses it).
"""
