"""A rollout's conversation as OpenClaw session events, the transcript QwenClawBench grades.

OpenClaw stores a session as events, one JSON object each (what QwenClawBench reads from
`~/.openclaw/agents/<agent>/sessions/*.jsonl` and hands to its graders)::

    {"type": "session", "version": 4, "id": ..., "timestamp": ..., "cwd": ...}
    {"type": "message", "id": ..., "parentId": ..., "timestamp": ...,
     "message": {"role": "user", "content": "<the prompt>", "timestamp": <ms>}}
    {"type": "message", ..., "message": {"role": "assistant",
        "content": [{"type": "thinking", "thinking": ...}, {"type": "text", "text": ...},
                    {"type": "toolCall", "id": ..., "name": ..., "arguments": {...}}],
        "api": ..., "provider": ..., "model": ..., "usage": {...},
        "stopReason": "toolUse" | "stop" | "length", "timestamp": <ms>}}
    {"type": "message", ..., "message": {"role": "toolResult", "toolCallId": ...,
        "toolName": ..., "content": [{"type": "text", "text": ...}], "isError": false,
        "timestamp": <ms>}}

(plus `model_change`, `thinking_level_change` and `custom` events that graders skip).

`from_calls` builds these events from the session's recorded calls, for any harness: the
conversation of the last successful call (parsed by its wire dialect) plus that call's
answer. `assistant_turns` projects either transcript onto what the policy said and
called, so a harness's own transcript can be checked against the recorded calls.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from openforge.gateway.conversation import Message, ToolCall
from openforge.gateway.dialects import DIALECTS, DialectError
from openforge.types import Call

SESSION_VERSION = 4
# The api name OpenClaw records for each wire dialect.
_API = {"chat": "openai-completions", "responses": "openai-responses",
        "messages": "anthropic-messages", "completions": "openai-completions"}
_STOP = {"tool_calls": "toolUse", "length": "length", "stop": "stop"}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def _loads(arguments: str) -> Any:
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return arguments


def response_message(call: Call) -> Message | None:
    """What the policy answered in `call`, whatever the wire dialect; None if unreadable."""
    resp = call.response or {}
    if resp.get("choices"):  # chat completions
        msg = (resp["choices"][0] or {}).get("message") or {}
        calls = [ToolCall(id=str(c.get("id") or ""), name=str(c["function"]["name"]),
                          arguments=str(c["function"].get("arguments") or "{}"))
                 for c in msg.get("tool_calls") or [] if isinstance(c, dict)]
        return Message(role="assistant", content=str(msg.get("content") or ""),
                       reasoning=msg.get("reasoning_content") or msg.get("reasoning"),
                       tool_calls=calls)
    if isinstance(resp.get("content"), list):  # Anthropic Messages
        text, reasoning, calls = "", "", []
        for block in resp["content"]:
            kind = block.get("type")
            if kind == "text":
                text += str(block.get("text") or "")
            elif kind == "thinking":
                reasoning += str(block.get("thinking") or "")
            elif kind == "tool_use":
                calls.append(ToolCall(id=str(block.get("id") or ""), name=str(block["name"]),
                                      arguments=json.dumps(block.get("input") or {})))
        return Message(role="assistant", content=text, reasoning=reasoning or None,
                       tool_calls=calls)
    if isinstance(resp.get("output"), list):  # Responses
        text, reasoning, calls = "", "", []
        for item in resp["output"]:
            kind = item.get("type")
            if kind == "message":
                text += "".join(str(p.get("text") or "") for p in item.get("content") or []
                                if isinstance(p, dict))
            elif kind == "reasoning":
                reasoning += "".join(str(p.get("text") or "") for p in
                                     (item.get("summary") or item.get("content") or [])
                                     if isinstance(p, dict))
            elif kind == "function_call":
                calls.append(ToolCall(id=str(item.get("call_id") or item.get("id") or ""),
                                      name=str(item["name"]),
                                      arguments=str(item.get("arguments") or "{}")))
        return Message(role="assistant", content=text, reasoning=reasoning or None,
                       tool_calls=calls)
    return None


def _conversation(call: Call) -> list[Message] | None:
    dialect = DIALECTS.get(call.dialect)
    if dialect is None or call.dialect == "completions":
        return None
    try:
        return list(dialect.parse(call.request).messages)
    except (DialectError, ValueError, KeyError, TypeError):
        return None


def _usage(call: Call) -> dict[str, Any]:
    resp = call.response or {}
    usage = resp.get("usage") or {}
    inp = int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
    out = int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
    return {"input": inp, "output": out, "cacheRead": 0, "cacheWrite": 0,
            "totalTokens": inp + out,
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}}


def _message_body(msg: Message, ts_ms: int, tool_names: dict[str, str],
                  call: Call | None) -> dict[str, Any] | None:
    if msg.role == "user":
        return {"role": "user", "content": msg.content, "timestamp": ts_ms}
    if msg.role == "assistant":
        blocks: list[dict[str, Any]] = []
        if msg.reasoning:
            blocks.append({"type": "thinking", "thinking": msg.reasoning})
        if msg.content:
            blocks.append({"type": "text", "text": msg.content})
        for tc in msg.tool_calls:
            tool_names[tc.id] = tc.name
            blocks.append({"type": "toolCall", "id": tc.id, "name": tc.name,
                           "arguments": _loads(tc.arguments)})
        body: dict[str, Any] = {"role": "assistant", "content": blocks,
                                "stopReason": "toolUse" if msg.tool_calls else "stop",
                                "timestamp": ts_ms}
        if call is not None:
            body.update(api=_API.get(call.dialect, call.dialect), provider="openforge",
                        model=str((call.request or {}).get("model") or ""),
                        usage=_usage(call))
            if call.finish_reason:
                body["stopReason"] = _STOP.get(call.finish_reason, body["stopReason"])
        return body
    if msg.role == "tool":
        call_id = msg.tool_call_id or ""
        return {"role": "toolResult", "toolCallId": call_id,
                "toolName": tool_names.get(call_id, msg.name or ""),
                "content": [{"type": "text", "text": msg.content}], "isError": False,
                "timestamp": ts_ms}
    return None  # system prompts are not part of an OpenClaw session transcript


def events(messages: list[Message], *, session_id: str, cwd: str, started: float,
           calls: list[Call] | None = None) -> list[dict[str, Any]]:
    """`messages` as OpenClaw session events; `calls[i]` produced the i-th assistant turn."""
    out: list[dict[str, Any]] = [{"type": "session", "version": SESSION_VERSION,
                                  "id": session_id, "timestamp": _iso(started), "cwd": cwd}]
    parent: str | None = None
    tool_names: dict[str, str] = {}
    turns = iter(calls or [])
    for msg in messages:
        call = next(turns, None) if msg.role == "assistant" else None
        ts = (call.finished_at or call.started_at) if call is not None else started
        body = _message_body(msg, int(ts * 1000), tool_names, call)
        if body is None:
            continue
        event_id = uuid.uuid4().hex[:8]
        out.append({"type": "message", "id": event_id, "parentId": parent,
                    "timestamp": _iso(ts), "message": body})
        parent = event_id
    return out


def from_calls(calls: list[Call], *, session_id: str = "", cwd: str = "") -> list[dict[str, Any]] | None:
    """The session's conversation as OpenClaw events, from its recorded calls; None when
    no successful call can be read."""
    ok = [c for c in calls if c.status == "ok"]
    for last in reversed(ok):
        history = _conversation(last)
        answer = response_message(last)
        if history is None or answer is None:
            continue
        messages = [*history, answer]
        # The assistant turns of the history were answered by the earlier calls, in order.
        turns = sum(1 for m in messages if m.role == "assistant")
        upto = ok[:ok.index(last) + 1]
        producers = upto[-turns:] if len(upto) >= turns else None
        return events(messages, session_id=session_id or last.session_id, cwd=cwd,
                      started=ok[0].started_at or 0.0, calls=producers)
    return None


def from_answer(prompt: str, answer: str, *, cwd: str = "") -> list[dict[str, Any]]:
    """The smallest transcript: the prompt and the final answer (no calls recorded)."""
    messages = [Message(role="user", content=prompt)]
    if answer:
        messages.append(Message(role="assistant", content=answer))
    return events(messages, session_id="", cwd=cwd, started=0.0)


def assistant_turns(transcript: list[dict[str, Any]]) -> list[tuple[str, list[tuple[str, str]]]]:
    """(text, [(tool, canonical JSON arguments)]) of every assistant message, in order."""
    turns = []
    for event in transcript:
        if not isinstance(event, dict) or event.get("type") != "message":
            continue
        msg = event.get("message") or {}
        if msg.get("role") != "assistant":
            continue
        text, tools = "", []
        content = msg.get("content")
        for block in content if isinstance(content, list) else [{"type": "text",
                                                                  "text": content or ""}]:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                text += str(block.get("text") or "")
            elif block.get("type") == "toolCall":
                args = block.get("arguments")
                tools.append((str(block.get("name")), json.dumps(args, sort_keys=True)))
        turns.append((text.strip(), tools))
    return turns
