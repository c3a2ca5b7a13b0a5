"""A rollout as Claw-Eval's grader reads it: `messages` and `dispatches`.

`messages` is the conversation of the last model call (its request's history plus its
answer), the way Claw-Eval's runner logs it: the user's prompt, each assistant turn (text
blocks, `tool_use` blocks), the tool results as a user message of `tool_result` blocks; no
system prompt. Tool names of the task's MCP server (`mcp__claw-eval__gmail_list_messages`)
are given back their task names.

`dispatches` is every tool call: the task's tools from the tool proxy (trusted: recorded
where the call was made), plus the harness's own shell and file tools under the names
Claw-Eval gives its sandbox tools (`Bash`, `Read`, `Write`, `Edit`, `Glob`, `Grep`), with
status 200 (a harness does not report one). A shell call that runs `claw-tool` is the
transport of a task tool call (the proxy recorded it), not a `Bash` action of its own.
Both lists are plain JSON here; `grade_main.py` validates them into the checkout's models.
"""

from __future__ import annotations

import json
import re
import shlex
from datetime import UTC, datetime
from typing import Any

from openforge.gateway.conversation import Message
from openforge.gateway.dialects import DIALECTS, DialectError
from openforge.types import Call

from openforge_claw.formats.claw_eval import TOOL_CLI

# Harness tools -> the sandbox tool Claw-Eval's runner would have used for the same action.
SANDBOX_TOOLS = {
    "shell": "Bash", "bash": "Bash", "Bash": "Bash", "exec": "Bash", "exec_command": "Bash",
    "local_shell": "Bash", "write_file": "Write", "write": "Write", "Write": "Write",
    "read": "Read", "read_file": "Read", "Read": "Read", "edit": "Edit", "Edit": "Edit",
    "MultiEdit": "Edit", "apply_patch": "Edit", "Glob": "Glob", "glob": "Glob", "Grep": "Grep",
    "grep": "Grep",
}
_COMMAND_KEYS = ("command", "cmd")


def task_tool_name(name: str, tools: set[str]) -> str:
    """A tool's task name: `mcp__claw-eval__x`, `claw-eval__x`, `claw-eval.x` -> `x`."""
    if name in tools:
        return name
    for tool in tools:
        if re.fullmatch(rf"(mcp__)?[\w.-]*?(__|\.|/){re.escape(tool)}", name):
            return tool
    return name


def _conversation(call: Call) -> list[Message]:
    """The call's request history followed by its answer, parsed by its own dialect."""
    body = dict(call.request or {})
    answer = call.response or {}
    if call.dialect == "chat":
        choice = (answer.get("choices") or [{}])[0]
        body["messages"] = [*body.get("messages", []), choice.get("message") or {}]
    elif call.dialect == "messages":
        body["messages"] = [*body.get("messages", []),
                            {"role": "assistant", "content": answer.get("content") or []}]
    elif call.dialect == "responses":
        history = body.get("input") or []
        if isinstance(history, str):
            history = [{"role": "user", "content": history}]
        body["input"] = [*history, *(answer.get("output") or [])]
    else:
        return []
    try:
        return DIALECTS[call.dialect].parse(body).messages
    except DialectError as exc:  # recorded by the gateway, so it parsed once: never silent
        raise ValueError(f"the recorded call {call.id} cannot be read as a conversation: "
                         f"{exc}") from None


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def messages(calls: list[Call] | None, prompt: str, final_answer: str,
             tools: set[str]) -> list[dict[str, Any]]:
    """Claw-Eval `Message`s of the rollout (without a gateway: the prompt and the answer)."""
    ok = sorted((c for c in calls or [] if c.status == "ok" and c.response), key=lambda c: c.index)
    history = _conversation(ok[-1]) if ok else []
    if not history:
        return [{"role": "user", "content": [_text(prompt)]},
                {"role": "assistant", "content": [_text(final_answer)] if final_answer else []}]
    out: list[dict[str, Any]] = []
    for msg in history:
        if msg.role == "system":
            continue
        if msg.role == "tool":
            block = {"type": "tool_result", "tool_use_id": msg.tool_call_id or "",
                     "content": [_text(msg.content)], "is_error": False}
            if out and out[-1]["role"] == "user" and all(
                    b["type"] == "tool_result" for b in out[-1]["content"]):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif msg.role == "assistant":
            content = [_text(msg.content)] if msg.content else []
            content += [{"type": "tool_use", "id": c.id, "name": task_tool_name(c.name, tools),
                         "input": c.arguments_dict()} for c in msg.tool_calls]
            out.append({"role": "assistant", "content": content,
                        "reasoning_content": msg.reasoning})
        else:
            out.append({"role": "user", "content": [_text(msg.content)]})
    return out


def _is_tool_cli(arguments: dict[str, Any]) -> bool:
    command = next((arguments[k] for k in _COMMAND_KEYS if isinstance(arguments.get(k), str)), "")
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return bool(words) and words[0].rsplit("/", 1)[-1] == TOOL_CLI


def harness_dispatches(calls: list[Call] | None) -> list[dict[str, Any]]:
    """The harness's own shell and file tool calls as Claw-Eval sandbox-tool dispatches."""
    out: list[dict[str, Any]] = []
    for call in sorted((c for c in calls or [] if c.status == "ok" and c.response),
                       key=lambda c: c.index):
        history = _conversation(call)
        if not history or history[-1].role != "assistant":
            continue
        when = datetime.fromtimestamp(call.finished_at or 0, UTC).isoformat()
        for tool_call in history[-1].tool_calls:
            name = SANDBOX_TOOLS.get(tool_call.name)
            arguments = tool_call.arguments_dict()
            if name is None or (name == "Bash" and _is_tool_cli(arguments)):
                continue
            out.append({"tool_use_id": tool_call.id, "tool_name": name,
                        "endpoint_url": f"harness:{tool_call.name}", "request_body": arguments,
                        "response_status": 200, "response_body": None, "latency_ms": 0.0,
                        "timestamp": when})
    return out


def dispatches(proxied: list[dict[str, Any]], calls: list[Call] | None) -> list[dict[str, Any]]:
    """The task's tool calls and the harness's own, in the order they happened."""
    merged = [*proxied, *harness_dispatches(calls)]
    return sorted(merged, key=lambda d: d.get("timestamp") or "")


def events(task_id: str, trace_id: str, msgs: list[dict[str, Any]],
           dispatch_list: list[dict[str, Any]],
           audit_data: dict[str, Any]) -> list[dict[str, Any]]:
    """The rollout as Claw-Eval trace events (one JSON object per line of its trace file)."""
    out: list[dict[str, Any]] = [{"type": "trace_start", "trace_id": trace_id,
                                  "task_id": task_id, "model": "openforge"}]
    out += [{"type": "message", "trace_id": trace_id, "message": m} for m in msgs]
    out += [{"type": "tool_dispatch", "trace_id": trace_id, **d} for d in dispatch_list]
    out += [{"type": "audit_snapshot", "trace_id": trace_id, "service_name": name,
             "audit_url": "", "audit_data": data} for name, data in audit_data.items()]
    return out


def dumps(lines: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
