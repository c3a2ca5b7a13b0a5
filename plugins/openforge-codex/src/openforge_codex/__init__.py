"""openforge harness plugin for the OpenAI Codex CLI (`codex exec`), speaking the Responses API.

The harness lives in `openforge_codex.harness` (imported only when a run uses it).
"""
