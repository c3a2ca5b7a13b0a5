"""Parse the JSONL events of `codex exec --json` into one summary of the run.

Events seen from Codex 0.171: `thread.started`, `turn.started`, `item.started` /
`item.updated` / `item.completed` (items `agent_message{text}`, `reasoning{text}`,
`command_execution{command, aggregated_output, exit_code, status}`, `file_change`,
`error{message}`, ...), `turn.completed{usage}`, `turn.failed{error{message}}` and a
top-level `error{message}`. Lines that are not JSON (a warning printed by the shim) are
skipped.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field


class CodexRun(BaseModel):
    """What the event stream says about one `codex exec` run."""

    events: list[dict[str, Any]] = Field(default_factory=list)
    thread_id: str | None = None
    completed: bool = False  # a `turn.completed` was seen (and no `turn.failed` after it)
    failed: bool = False
    error: str | None = None
    final_message: str | None = None  # the last `agent_message` text
    commands: list[dict[str, Any]] = Field(default_factory=list)  # completed command_execution items
    usage: dict[str, Any] = Field(default_factory=dict)


def _error_text(event: dict[str, Any]) -> str:
    err = event.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(event.get("message") or err or event)


def parse_events(stdout: str) -> CodexRun:
    """Read every JSON event line of `stdout`, in order."""
    run = CodexRun()
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        run.events.append(event)
        kind = event.get("type")
        if kind == "thread.started":
            run.thread_id = event.get("thread_id")
        elif kind == "turn.completed":
            run.completed, run.failed = True, False
            if isinstance(event.get("usage"), dict):
                run.usage = event["usage"]
        elif kind == "turn.failed":
            run.completed, run.failed = False, True
            run.error = _error_text(event)
        elif kind == "error":
            run.error = _error_text(event)
        elif kind == "item.completed" and isinstance(event.get("item"), dict):
            item = event["item"]
            if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                run.final_message = item["text"]
            elif item.get("type") == "command_execution":
                run.commands.append({k: item.get(k) for k in
                                     ("command", "exit_code", "status", "aggregated_output")})
    return run
