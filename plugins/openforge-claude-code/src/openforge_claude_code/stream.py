"""Parse `claude -p --output-format stream-json --verbose` into one summary of the run.

Lines seen from Claude Code 2.1.332: `{"type":"system","subtype":"init",tools,model,...}`,
`{"type":"assistant","message":{id, content[...], usage}}` (one line per content block;
the blocks of one model response share the message `id`), `{"type":"user", ...}` (tool
results) and, last, `{"type":"result","subtype":"success"|"error_...","is_error",
"result","num_turns","usage","terminal_reason",...}`. `--output-format json` prints only
that result object, which this parser reads as well. When the API fails, Claude Code
adds an assistant message of its own (`"model": "<synthetic>"`) holding the error text.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

SYNTHETIC_MODEL = "<synthetic>"


class ClaudeRun(BaseModel):
    """What Claude Code's JSON output says about one run."""

    lines: list[dict[str, Any]] = Field(default_factory=list)
    init: dict[str, Any] | None = None
    result: dict[str, Any] | None = None  # the final `result` object
    assistant_message_ids: list[str] = Field(default_factory=list)  # in order, unique
    tool_uses: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def model_requests(self) -> int:
        """Main-loop model responses (distinct assistant message ids)."""
        return len(self.assistant_message_ids)

    @property
    def succeeded(self) -> bool:
        r = self.result or {}
        return r.get("subtype") == "success" and not r.get("is_error", False)

    @property
    def final_answer(self) -> str | None:
        value = (self.result or {}).get("result")
        return value if isinstance(value, str) else None

    @property
    def error(self) -> str | None:
        r = self.result
        if r is None:
            return None
        if self.succeeded:
            return None
        errors = r.get("errors")
        detail = "; ".join(str(e) for e in errors) if isinstance(errors, list) and errors else \
            (r.get("result") if isinstance(r.get("result"), str) else None)
        # A run that ended on an API error still says subtype "success" (with is_error).
        kind = r.get("api_error") or r.get("terminal_reason") or r.get("subtype") or "error"
        return f"{kind}: {detail}" if detail else str(kind)


def parse_stream(stdout: str) -> ClaudeRun:
    """Read every JSON line of `stdout`, in order; non-JSON lines are skipped."""
    run = ClaudeRun()
    seen: set[str] = set()
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict):
            continue
        run.lines.append(item)
        kind = item.get("type")
        if kind == "system" and item.get("subtype") == "init":
            run.init = item
        elif kind == "result":
            run.result = item
        elif kind == "assistant" and isinstance(item.get("message"), dict):
            message = item["message"]
            # Sub-agent turns carry a parent_tool_use_id; they are model requests too. A
            # `<synthetic>` message is Claude Code's own (an API error text), not a response.
            message_id = message.get("id")
            synthetic = message.get("model") == SYNTHETIC_MODEL
            if isinstance(message_id, str) and not synthetic and message_id not in seen:
                seen.add(message_id)
                run.assistant_message_ids.append(message_id)
            for block in message.get("content") or []:
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    run.tool_uses.append({"name": block.get("name"), "input": block.get("input")})
    return run
