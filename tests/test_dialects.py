"""The four wire dialects: parsing what real harnesses send, answering what their SDKs accept.

Requests mirror the bodies Codex, Claude Code, OpenClaw, opencode and the official SDKs
were observed to send (docs/shared notes). Every response and every SSE frame is checked
by the official `openai` / `anthropic` SDK types, and the SDKs' own streaming clients
consume the streams from a small real HTTP server on a free port that answers through
the dialect (the gateway app itself is tested elsewhere).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import anthropic
import openai
import pytest
from anthropic.types import Message as AnthropicMessage
from anthropic.types import RawMessageStreamEvent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types import Completion as OpenAICompletion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from openforge.gateway import json_process
from openforge.gateway.conversation import ChatRequest, Completion, Message, ToolCall
from openforge.gateway.dialects import DIALECTS, KEEPALIVE_FRAME, Dialect, DialectError
from openforge.gateway.dialects.anthropic import AnthropicDialect, count_tokens_response
from openforge.gateway.dialects.base import load_json, split_deltas

CHAT = DIALECTS["chat"]
COMPLETIONS = DIALECTS["completions"]
RESPONSES = DIALECTS["responses"]
MESSAGES = cast(AnthropicDialect, DIALECTS["messages"])

STREAM_EVENT = TypeAdapter(ResponseStreamEvent)
ANTHROPIC_EVENT = TypeAdapter(RawMessageStreamEvent)


# --- completions to send back ---------------------------------------------------------------

TEXT = Completion(
    message=Message(role="assistant", content="The answer is 42. ünïcode ✓, and more text."),
    prompt_tokens=120, completion_tokens=14, cached_tokens=100,
)
TOOLS = Completion(
    message=Message(
        role="assistant",
        content="Let me look.",
        reasoning="The user wants the file list; call ls, then read the README.",
        tool_calls=[
            ToolCall(id="call_a1", name="exec_command", arguments='{"cmd": "ls -la"}'),
            ToolCall(id="call_b2", name="read", arguments='{"path": "README.md", "n": 3}'),
        ],
    ),
    finish_reason="tool_calls", prompt_tokens=300, completion_tokens=60, reasoning_tokens=20,
)
ONLY_CALL = Completion(
    message=Message(role="assistant",
                    tool_calls=[ToolCall(id="call_z", name="bash", arguments='{"command":"pwd"}')]),
    finish_reason="tool_calls", prompt_tokens=10, completion_tokens=9,
)
TRUNCATED = Completion(
    message=Message(role="assistant", content="I was cut o"),
    finish_reason="length", prompt_tokens=10, completion_tokens=16,
)
EMPTY = Completion(message=Message(role="assistant"), prompt_tokens=3, completion_tokens=1)
ALL = [TEXT, TOOLS, ONLY_CALL, TRUNCATED, EMPTY]
IDS = ["text", "tools", "only-call", "truncated", "empty"]

META: dict[str, Any] = {"response_id": "resp_abc123", "model": "policy", "created": 1_764_000_000}


# --- SSE helpers ---------------------------------------------------------------------------


def sse_frames(frames: Iterable[bytes]) -> list[tuple[str | None, str]]:
    """(event, data) per frame; each frame must be one complete `\\n\\n`-terminated block."""
    out: list[tuple[str | None, str]] = []
    for frame in frames:
        assert isinstance(frame, bytes)
        assert frame.endswith(b"\n\n") and frame.count(b"\n\n") == 1, frame
        event: str | None = None
        data: list[str] = []
        for line in frame.decode().strip("\n").split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
        out.append((event, "\n".join(data)))
    return out


# --- realistic requests --------------------------------------------------------------------

OPENCLAW_CHAT = {
    "model": "policy",
    "stream": True,
    "stream_options": {"include_usage": True},
    "tool_choice": "auto",
    "max_completion_tokens": 8192,
    "store": False,
    "messages": [
        {"role": "system", "content": "You are a personal assistant running inside OpenClaw."},
        {"role": "user", "content": "List the files and summarise the README."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "exec", "arguments": "{\"command\":\"ls\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "README.md\nsrc"},
        {"role": "user", "content": [{"type": "text", "text": "<internal-context>cwd=/w</internal-context>"}]},
    ],
    "tools": [
        {"type": "function", "function": {
            "name": "exec", "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                           "required": ["command"]}}},
        {"type": "function", "function": {"name": "tool_search"}},
    ],
}

OPENCODE_TITLE = {
    "model": "policy", "stream": True, "stream_options": {"include_usage": True},
    "max_tokens": 32000, "temperature": 0.5,
    "messages": [
        {"role": "system", "content": "You are a title generator."},
        {"role": "user", "content": "Generate a title for: fix the failing test"},
    ],
}

SDK_CHAT_IMAGES = {
    "model": "policy", "temperature": 0.2, "top_p": 0.9, "seed": 7, "stop": "###",
    "max_tokens": 100, "n": 1, "logprobs": False, "user": "u-1",
    "messages": [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "name": "alice", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=",
                                                "detail": "low"}},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        ]},
        {"role": "assistant", "content": "A cat.", "reasoning_content": "Looks feline."},
        {"role": "function", "name": "legacy", "content": "ignored"},
        {"role": "user", "content": "Sure?"},
    ],
}

CODEX_RESPONSES = {
    "model": "policy",
    "instructions": None,
    "input": [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "<permissions>sandbox</permissions>"}]},
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "You are Codex, a coding agent."}]},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "<environment_context>cwd</environment_context>"}]},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Create proof.txt containing TOOL_RAN"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [
            {"type": "summary_text", "text": "I should write the file."}],
         "content": None, "encrypted_content": None},
        {"type": "message", "role": "assistant", "id": "msg_1",
         "content": [{"type": "output_text", "text": "Writing it now.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "exec_command",
         "arguments": "{\"cmd\":\"echo TOOL_RAN > proof.txt\"}"},
        {"type": "function_call_output", "call_id": "call_1",
         "output": "Process exited with code 0"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
         "action": {"type": "search", "query": "x"}},
    ],
    "tools": [
        {"type": "function", "name": "exec_command", "description": "Runs a command in a PTY",
         "strict": False, "parameters": {"type": "object", "properties": {
             "cmd": {"type": "string"}}, "required": ["cmd"]}},
        {"type": "function", "name": "write_stdin", "description": "Write to a session",
         "strict": False, "parameters": None},
        {"type": "namespace", "name": "multi_agent_v1", "tools": [
            {"type": "function", "name": "spawn", "parameters": {}}]},
        {"type": "web_search", "external_web_access": False},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "019a-session",
    "client_metadata": {"originator": "codex_exec"},
    "max_output_tokens": 4096,
}

CLAUDE_CODE = {
    "model": "policy",
    "max_tokens": 32000,
    "stream": True,
    "system": [
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
         "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Use the tools available to you."},
    ],
    "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>todo list empty</system-reminder>"},
            {"type": "text", "text": "Run pwd", "cache_control": {"type": "ephemeral"}},
        ]},
        {"role": "system", "content": "# Environment\nWorking directory: /w"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I will run pwd.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Running it."},
            {"type": "tool_use", "id": "toolu_01", "name": "Bash",
             "input": {"command": "pwd", "description": "print cwd"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "/w",
             "is_error": False},
            {"type": "text", "text": "<system-reminder>keep going</system-reminder>"},
        ]},
    ],
    "tools": [
        {"name": "Bash", "description": "Run a bash command", "input_schema": {
            "type": "object", "properties": {"command": {"type": "string"}},
            "required": ["command"]}},
        {"name": "ToolSearch", "description": "Find deferred tools",
         "input_schema": {"type": "object"}, "type": "custom"},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    ],
    "thinking": {"type": "adaptive", "display": "omitted"},
    "output_config": {"effort": "high"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
    "metadata": {"user_id": "user_abc_account__session_x"},
    "temperature": 1,
}


# --- chat --------------------------------------------------------------------------------


def test_chat_parses_openclaw_request() -> None:
    req = CHAT.parse(OPENCLAW_CHAT)
    assert req.stream and req.include_usage
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool", "user"]
    call = req.messages[2].tool_calls[0]
    assert (call.id, call.name, call.arguments_dict()) == ("call_1", "exec", {"command": "ls"})
    assert req.messages[3].tool_call_id == "call_1"
    assert req.messages[3].content == "README.md\nsrc"
    assert [t.name for t in req.tools] == ["exec", "tool_search"]
    assert req.tools[0].parameters["required"] == ["command"]
    assert req.tools[1].parameters == {"type": "object", "properties": {}}
    assert req.sampling.max_tokens == 8192
    assert req.sampling.model_fields_set == {"max_tokens"}


def test_chat_parses_sdk_request_with_images_and_legacy_roles() -> None:
    req = CHAT.parse(SDK_CHAT_IMAGES)
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "user"]
    assert req.messages[1].content == "What is in this picture?"
    assert [i.url for i in req.messages[1].images] == ["data:image/png;base64,iVBORw0KGgo="]
    assert req.messages[2].reasoning == "Looks feline."
    s = req.sampling
    assert (s.temperature, s.top_p, s.seed, s.stop, s.max_tokens) == (0.2, 0.9, 7, ["###"], 100)
    assert not req.stream and not req.include_usage


def test_chat_title_call_has_no_tools() -> None:
    req = CHAT.parse(OPENCODE_TITLE)
    assert req.tools == [] and req.sampling.max_tokens == 32000


@pytest.mark.parametrize("completion", ALL, ids=IDS)
def test_chat_response_is_a_valid_chat_completion(completion: Completion) -> None:
    body = CHAT.response(completion, **META)
    parsed = ChatCompletion.model_validate(body)
    choice = parsed.choices[0]
    assert choice.message.content == (completion.message.content or (
        None if completion.message.tool_calls else ""))
    calls: list[Any] = choice.message.tool_calls or []
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        (c.id, c.name, c.arguments) for c in completion.message.tool_calls]
    assert choice.finish_reason == {"stop": "stop", "length": "length",
                                    "tool_calls": "tool_calls"}[completion.finish_reason]
    assert body["choices"][0]["message"].get("reasoning_content") == completion.message.reasoning
    assert parsed.usage is not None
    assert parsed.usage.total_tokens == completion.prompt_tokens + completion.completion_tokens


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("completion", ALL, ids=IDS)
def test_chat_stream_frames_and_accumulation(completion: Completion, include_usage: bool) -> None:
    request = ChatRequest(stream=True, include_usage=include_usage)
    frames = sse_frames(CHAT.stream(completion, **META, request=request))
    assert frames[-1] == (None, "[DONE]")
    chunks = [ChatCompletionChunk.model_validate(json.loads(d)) for _, d in frames[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    usage_chunks = [c for c in chunks if c.usage is not None]
    if include_usage:
        assert len(usage_chunks) == 1 and chunks[-1] is usage_chunks[0]
        assert chunks[-1].choices == []
        final = chunks[-2]
    else:
        assert usage_chunks == []
        final = chunks[-1]
    assert final.choices[0].finish_reason is not None
    assert all(c.choices[0].finish_reason is None for c in chunks if c is not final and c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content", "")
                        for c in chunks if c.choices)
    assert content == completion.message.content
    assert reasoning == (completion.message.reasoning or "")
    calls: dict[int, dict[str, str]] = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            if d.id:
                assert d.type == "function"
                entry["id"] = d.id
            if d.function and d.function.name:
                entry["name"] = d.function.name
            entry["arguments"] += (d.function.arguments or "") if d.function else ""
    assert [calls[i] for i in sorted(calls)] == [
        {"id": c.id, "name": c.name, "arguments": c.arguments} for c in completion.message.tool_calls
    ]


def test_chat_history_replay_reproduces_the_assistant_message() -> None:
    """What the harness sends back next turn parses to exactly what the policy produced."""
    message = CHAT.response(TOOLS, **META)["choices"][0]["message"]
    body = {"messages": [{"role": "user", "content": "go"}, message] + [
        {"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in TOOLS.message.tool_calls]}
    replayed = CHAT.parse(body).messages[1]
    assert replayed == TOOLS.message


# --- completions ----------------------------------------------------------------------------


@pytest.mark.parametrize(("prompt", "text", "ids"), [
    ("Once upon a time", "Once upon a time", None),
    ([14990, 1879], None, [14990, 1879]),
    (["single in a batch"], "single in a batch", None),
    ([[1, 2, 3]], None, [1, 2, 3]),
])
def test_completions_prompt_forms(prompt: Any, text: str | None, ids: list[int] | None) -> None:
    req = COMPLETIONS.parse({"model": "policy", "prompt": prompt, "echo": True, "suffix": None})
    assert (req.raw_prompt, req.raw_prompt_ids, req.messages) == (text, ids, [])
    assert req.sampling.max_tokens == 16  # OpenAI's default for this endpoint


def test_completions_sampling() -> None:
    req = COMPLETIONS.parse({"prompt": "x", "max_tokens": 5, "stop": ["\n", ""],
                             "temperature": 0, "stream": True,
                             "stream_options": {"include_usage": True}})
    assert (req.sampling.max_tokens, req.sampling.stop, req.sampling.temperature) == (
        5, ["\n"], 0.0)
    assert req.stream and req.include_usage


@pytest.mark.parametrize("completion", [TEXT, TRUNCATED, EMPTY], ids=["text", "length", "empty"])
def test_completions_response_and_stream(completion: Completion) -> None:
    body = COMPLETIONS.response(completion, **META)
    parsed = OpenAICompletion.model_validate(body)
    assert parsed.choices[0].text == completion.message.content
    assert parsed.choices[0].finish_reason == ("length" if completion is TRUNCATED else "stop")
    frames = sse_frames(COMPLETIONS.stream(completion, **META,
                                           request=ChatRequest(include_usage=True)))
    assert frames[-1] == (None, "[DONE]")
    chunks = [json.loads(d) for _, d in frames[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    *deltas, last, usage_chunk = chunks
    assert "".join(c["choices"][0]["text"] for c in deltas) == completion.message.content
    assert all(c["choices"][0]["finish_reason"] is None for c in deltas)
    OpenAICompletion.model_validate(last)
    OpenAICompletion.model_validate(usage_chunk)
    assert usage_chunk["usage"]["completion_tokens"] == completion.completion_tokens


# --- responses ------------------------------------------------------------------------------


def test_responses_parses_codex_request() -> None:
    req = RESPONSES.parse(CODEX_RESPONSES)
    roles = [m.role for m in req.messages]
    assert roles == ["system", "system", "user", "user", "assistant", "tool"]
    turn = req.messages[4]
    assert turn.content == "Writing it now."
    assert turn.reasoning == "I should write the file."
    assert [(c.id, c.name) for c in turn.tool_calls] == [("call_1", "exec_command")]
    assert req.messages[5].tool_call_id == "call_1"
    assert [t.name for t in req.tools] == ["exec_command", "write_stdin", "multi_agent_v1__spawn"]
    assert req.sampling.max_tokens == 4096 and req.stream


def test_responses_namespace_tools_round_trip_as_codex_runs_them() -> None:
    # Codex offers an MCP server's tools in one namespace and runs a call only when it names
    # the namespace: {"name": <function>, "namespace": <namespace>} (a flat name is refused).
    body = {"model": "m", "input": [
        {"role": "user", "content": "book it"},
        {"type": "function_call", "call_id": "c1", "name": "create_event",
         "namespace": "mcp__claw-eval", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_text", "text": "created"}]}],
        "tools": [{"type": "namespace", "name": "mcp__claw-eval", "description": "MCP tools",
                   "tools": [{"type": "function", "name": "create_event", "description": "Book",
                              "parameters": {"type": "object", "properties": {}}},
                             {"type": "custom", "name": "ignored"}]}]}
    req = RESPONSES.parse(body)
    (tool,) = req.tools
    assert (tool.name, tool.namespace, tool.description) == (
        "mcp__claw-eval__create_event", "mcp__claw-eval", "Book")
    assert req.messages[1].tool_calls[0].name == "mcp__claw-eval__create_event"
    call = ToolCall(id="c2", name="mcp__claw-eval__create_event", arguments='{"a": 1}')
    completion = Completion(message=Message(role="assistant", tool_calls=[call]),
                            finish_reason="tool_calls")
    out = RESPONSES.response(completion, response_id="resp_1", model="m", created=0,
                             request=req)["output"]
    assert [(i["name"], i.get("namespace")) for i in out] == [("create_event", "mcp__claw-eval")]
    frames = b"".join(RESPONSES.stream(completion, response_id="resp_1", model="m", created=0,
                                       request=req)).decode()
    assert '"namespace":"mcp__claw-eval"' in frames and '"name":"create_event"' in frames
    with pytest.raises(DialectError, match=r"tools\[0\]\.name"):
        RESPONSES.parse({"input": "x", "tools": [{"type": "namespace", "tools": []}]})


def test_responses_instructions_and_string_input() -> None:
    req = RESPONSES.parse({"model": "m", "instructions": "Be terse.", "input": "hi",
                           "temperature": 0.3})
    assert [(m.role, m.content) for m in req.messages] == [("system", "Be terse."), ("user", "hi")]
    assert req.sampling.temperature == 0.3 and req.sampling.model_fields_set == {"temperature"}


def test_responses_reasoning_without_assistant_item_is_dropped() -> None:
    req = RESPONSES.parse({"input": [
        {"role": "user", "content": "a"},
        {"type": "reasoning", "id": "r", "summary": [{"type": "summary_text", "text": "x"}]},
        {"role": "user", "content": "b"},
    ]})
    assert [(m.role, m.reasoning) for m in req.messages] == [("user", None), ("user", None)]


def test_responses_images() -> None:
    req = RESPONSES.parse({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"},
        {"type": "input_image", "file_id": "file-1"},
        {"type": "input_file", "file_id": "file-2"},
    ]}]})
    assert req.messages[0].content == "look"
    assert [i.url for i in req.messages[0].images] == ["https://example.com/a.png"]


@pytest.mark.parametrize("completion", ALL, ids=IDS)
def test_responses_response_is_a_valid_response(completion: Completion) -> None:
    request = RESPONSES.parse({"input": "x", "max_output_tokens": 64, "temperature": 0.5})
    body = RESPONSES.response(completion, **META, request=request)
    parsed = Response.model_validate(body)
    assert parsed.status == "completed" and parsed.id == META["response_id"]
    assert parsed.output_text == completion.message.content
    calls = [o for o in parsed.output if o.type == "function_call"]
    assert [(c.call_id, c.name, c.arguments, c.status) for c in calls] == [
        (c.id, c.name, c.arguments, "completed") for c in completion.message.tool_calls]
    assert all(c.id == f"fc_{c.call_id}" for c in calls)
    kinds = [o.type for o in parsed.output]
    assert kinds == sorted(kinds, key=["reasoning", "message", "function_call"].index)
    assert ("reasoning" in kinds) == bool(completion.message.reasoning)
    assert parsed.usage is not None
    assert parsed.usage.input_tokens_details.cached_tokens == completion.cached_tokens
    assert parsed.usage.output_tokens_details.reasoning_tokens == completion.reasoning_tokens
    assert parsed.max_output_tokens == 64 and parsed.temperature == 0.5


@pytest.mark.parametrize("completion", ALL, ids=IDS)
def test_responses_stream_event_sequence(completion: Completion) -> None:
    frames = sse_frames(RESPONSES.stream(completion, **META))
    events = [STREAM_EVENT.validate_python(json.loads(d)) for _, d in frames]
    assert [name for name, _ in frames] == [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    final = events[-1].response  # type: ignore[union-attr]
    assert final == Response.model_validate(RESPONSES.response(completion, **META))
    # Each item: added ... done, in output order, with its own inner sequence.
    text = ""
    args: dict[str, str] = {}
    for index, item in enumerate(final.output):
        start = next(i for i, e in enumerate(events)
                     if e.type == "response.output_item.added" and e.output_index == index)
        end = next(i for i, e in enumerate(events)
                   if e.type == "response.output_item.done" and e.output_index == index)
        inner = [e.type for e in events[start + 1:end]]
        assert events[end].item == item  # type: ignore[union-attr]
        if item.type == "message":
            assert inner[0] == "response.content_part.added"
            assert inner[-2:] == ["response.output_text.done", "response.content_part.done"]
            text += "".join(e.delta for e in events[start:end]  # type: ignore[union-attr]
                            if e.type == "response.output_text.delta")
        elif item.type == "function_call":
            assert inner[-1] == "response.function_call_arguments.done"
            args[item.call_id] = "".join(
                e.delta for e in events[start:end]  # type: ignore[union-attr]
                if e.type == "response.function_call_arguments.delta")
        else:
            assert inner[0] == "response.reasoning_summary_part.added"
    assert text == completion.message.content
    assert args == {c.id: c.arguments for c in completion.message.tool_calls}


def test_responses_history_replay_reproduces_the_assistant_message() -> None:
    output = RESPONSES.response(TOOLS, **META)["output"]
    body = {"input": [{"role": "user", "content": "go"}, *output] + [
        {"type": "function_call_output", "call_id": c.id, "output": "ok"}
        for c in TOOLS.message.tool_calls]}
    messages = RESPONSES.parse(body).messages
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1] == TOOLS.message


def test_responses_previous_response_id_is_refused_clearly() -> None:
    with pytest.raises(DialectError) as err:
        RESPONSES.parse({"input": "hi", "previous_response_id": "resp_1"})
    assert err.value.status == 400 and "full history" in err.value.message


# --- anthropic messages -------------------------------------------------------------------


def test_messages_parses_claude_code_request() -> None:
    req = MESSAGES.parse(CLAUDE_CODE)
    assert [m.role for m in req.messages] == ["system", "user", "system", "assistant", "tool",
                                              "user"]
    assert req.messages[0].content.startswith("You are Claude Code")
    assert req.messages[0].content.endswith("Use the tools available to you.")
    assert req.messages[1].content == "<system-reminder>todo list empty</system-reminder>\nRun pwd"
    assert req.messages[2].content == "# Environment\nWorking directory: /w"
    turn = req.messages[3]
    assert (turn.content, turn.reasoning) == ("Running it.", "I will run pwd.")
    assert turn.tool_calls[0].id == "toolu_01"
    assert turn.tool_calls[0].arguments_dict() == {"command": "pwd", "description": "print cwd"}
    assert (req.messages[4].tool_call_id, req.messages[4].content) == ("toolu_01", "/w")
    assert [t.name for t in req.tools] == ["Bash", "ToolSearch"]
    assert req.sampling.max_tokens == 32000 and req.sampling.temperature == 1.0


def test_messages_images_and_tool_result_blocks() -> None:
    req = MESSAGES.parse({"max_tokens": 10, "messages": [
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                         "data": "/9j/4AAQ"}},
            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
            {"type": "document", "source": {"type": "text", "data": "ignored"}},
            {"type": "text", "text": "what is this"},
        ]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": [
                {"type": "text", "text": "failed"},
                {"type": "image", "source": {"type": "url", "url": "https://x/z.png"}}]}]},
    ]})
    first, call, result = req.messages
    assert [i.url for i in first.images] == ["data:image/jpeg;base64,/9j/4AAQ", "https://x/y.png"]
    assert first.content == "what is this"
    assert call.tool_calls[0].arguments == "{}"
    assert (result.role, result.content, [i.url for i in result.images]) == (
        "tool", "failed", ["https://x/z.png"])


def test_messages_max_tokens_required_but_not_for_count_tokens() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(DialectError) as err:
        MESSAGES.parse(body)
    assert err.value.status == 400 and "max_tokens" in err.value.message
    assert MESSAGES.parse_count_tokens(body).messages[0].content == "hi"
    assert count_tokens_response(12) == {"input_tokens": 12}


@pytest.mark.parametrize("completion", ALL, ids=IDS)
def test_messages_response_is_a_valid_message(completion: Completion) -> None:
    parsed = AnthropicMessage.model_validate(MESSAGES.response(completion, **META))
    assert parsed.stop_reason == {"stop": "end_turn", "length": "max_tokens",
                                  "tool_calls": "tool_use"}[completion.finish_reason]
    assert parsed.stop_sequence is None
    texts = [b.text for b in parsed.content if b.type == "text"]
    assert "".join(texts) == completion.message.content
    thinking = [b.thinking for b in parsed.content if b.type == "thinking"]
    assert thinking == ([completion.message.reasoning] if completion.message.reasoning else [])
    uses = [(b.id, b.name, b.input) for b in parsed.content if b.type == "tool_use"]
    assert uses == [(c.id, c.name, c.arguments_dict()) for c in completion.message.tool_calls]
    assert parsed.usage.input_tokens == completion.prompt_tokens
    assert parsed.usage.cache_read_input_tokens == 0


@pytest.mark.parametrize("completion", ALL, ids=IDS)
def test_messages_stream_event_sequence(completion: Completion) -> None:
    frames = sse_frames(MESSAGES.stream(completion, **META))
    events: list[Any] = [ANTHROPIC_EVENT.validate_python(json.loads(d)) for _, d in frames]
    assert [name for name, _ in frames] == [e.type for e in events]
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    blocks: list[Any] = AnthropicMessage.model_validate(
        MESSAGES.response(completion, **META)).content
    pos = 1
    for index, block in enumerate(blocks):
        start = events[pos]
        assert start.type == "content_block_start" and start.index == index
        assert start.content_block.type == block.type
        pos += 1
        acc = ""
        while events[pos].type == "content_block_delta":
            delta = events[pos].delta  # type: ignore[union-attr]
            acc += getattr(delta, {"text_delta": "text", "thinking_delta": "thinking",
                                   "input_json_delta": "partial_json"}[delta.type])
            pos += 1
        assert events[pos].type == "content_block_stop" and events[pos].index == index
        pos += 1
        if block.type == "text":
            assert acc == block.text
        elif block.type == "thinking":
            assert acc == block.thinking
        else:
            assert json.loads(acc) == block.input
    assert pos == len(events) - 2
    delta = events[-2]
    assert delta.delta.stop_reason == AnthropicMessage.model_validate(  # type: ignore[union-attr]
        MESSAGES.response(completion, **META)).stop_reason
    assert delta.usage.output_tokens == completion.completion_tokens  # type: ignore[union-attr]


def test_messages_history_replay_reproduces_the_assistant_message() -> None:
    content = MESSAGES.response(TOOLS, **META)["content"]
    body = {"max_tokens": 5, "messages": [
        {"role": "user", "content": "go"}, {"role": "assistant", "content": content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.id, "content": "ok"}
                                     for c in TOOLS.message.tool_calls]}]}
    replayed = MESSAGES.parse(body).messages[1]
    assert replayed.content == TOOLS.message.content
    assert replayed.reasoning == TOOLS.message.reasoning
    assert [(c.id, c.name, c.arguments_dict()) for c in replayed.tool_calls] == [
        (c.id, c.name, c.arguments_dict()) for c in TOOLS.message.tool_calls]


# --- the official SDK clients consume our answers -------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    """Answers each POST through the server's dialect, as the gateway will."""

    server: _DialectServer

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        srv = self.server
        parsed = srv.dialect.parse(body)
        srv.seen.append(parsed)
        if parsed.stream:
            payload = b"".join(srv.dialect.stream(srv.completion, **META, request=parsed))
            kind = "text/event-stream"
        else:
            payload = json.dumps(srv.dialect.response(srv.completion, **META,
                                                      request=parsed)).encode()
            kind = "application/json"
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


class _DialectServer(ThreadingHTTPServer):
    def __init__(self, dialect: Dialect, completion: Completion) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.dialect = dialect
        self.completion = completion
        self.seen: list[ChatRequest] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/s/tok"


@contextmanager
def dialect_server(dialect: Dialect, completion: Completion) -> Iterator[_DialectServer]:
    """A real HTTP server on a free port that answers through `dialect`."""
    server = _DialectServer(dialect, completion)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def openai_client(server: _DialectServer) -> openai.OpenAI:
    return openai.OpenAI(api_key="tok", base_url=server.url + "/v1", max_retries=0)


CHAT_TOOL: Any = {"type": "function", "function": {
    "name": "exec_command", "parameters": {"type": "object", "properties": {
        "cmd": {"type": "string"}}}}}


def test_openai_sdk_chat_streaming_and_not() -> None:
    with dialect_server(CHAT, TOOLS) as server:
        _chat_through_sdk(openai_client(server), server.seen)


def _chat_through_sdk(client: openai.OpenAI, seen: list[ChatRequest]) -> None:
    messages: list[Any] = [{"role": "user", "content": "list files"}]
    plain = client.chat.completions.create(model="policy", messages=messages, tools=[CHAT_TOOL])
    assert plain.choices[0].message.tool_calls[0].function.name == "exec_command"  # type: ignore[index,union-attr]
    with client.chat.completions.stream(model="policy", messages=messages,
                                        tools=[CHAT_TOOL],
                                        stream_options={"include_usage": True}) as stream:
        final = stream.get_final_completion()
    msg = final.choices[0].message
    assert msg.content == TOOLS.message.content
    assert [(c.id, c.function.arguments) for c in msg.tool_calls or []] == [
        (c.id, c.arguments) for c in TOOLS.message.tool_calls]
    assert final.usage is not None and final.usage.completion_tokens == 60
    assert [r.stream for r in seen] == [False, True] and seen[1].include_usage


def test_openai_sdk_completions_stream() -> None:
    with dialect_server(COMPLETIONS, TEXT) as server:
        text = "".join(c.choices[0].text for c in openai_client(server).completions.create(
            model="policy", prompt=[1, 2, 3], stream=True) if c.choices)
    assert text == TEXT.message.content and server.seen[0].raw_prompt_ids == [1, 2, 3]


def test_openai_sdk_responses_streaming_and_not() -> None:
    with dialect_server(RESPONSES, TOOLS) as server:
        _responses_through_sdk(openai_client(server), server.seen)


def _responses_through_sdk(client: openai.OpenAI, seen: list[ChatRequest]) -> None:
    tools: list[Any] = [{"type": "function", "name": "exec_command", "parameters": {},
                         "strict": False}]
    plain = client.responses.create(model="policy", input="go", tools=tools)
    assert [o.type for o in plain.output] == ["reasoning", "message", "function_call",
                                              "function_call"]
    with client.responses.stream(model="policy", input="go", tools=tools) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text == TOOLS.message.content
    assert [o.call_id for o in final.output if o.type == "function_call"] == ["call_a1",
                                                                             "call_b2"]
    # The harness's next turn, built from the SDK objects, parses back to the same turn.
    history: list[Any] = [{"role": "user", "content": "go"},
                          *[o.model_dump(exclude_none=True) for o in final.output],
                          *[{"type": "function_call_output", "call_id": c.id, "output": "ok"}
                            for c in TOOLS.message.tool_calls]]
    client.responses.create(model="policy", input=history)
    assert seen[-1].messages[1] == TOOLS.message


def test_anthropic_sdk_streaming_and_not() -> None:
    with dialect_server(MESSAGES, TOOLS) as server:
        client = anthropic.Anthropic(api_key="tok", base_url=server.url, max_retries=0)
        _messages_through_sdk(client, server.seen)


def _messages_through_sdk(client: anthropic.Anthropic, seen: list[ChatRequest]) -> None:
    tools: list[Any] = [{"name": "exec_command", "input_schema": {"type": "object"}}]
    messages: list[Any] = [{"role": "user", "content": "go"}]
    plain = client.messages.create(model="policy", max_tokens=100, messages=messages,
                                   tools=tools)
    assert plain.stop_reason == "tool_use"
    with client.messages.stream(model="policy", max_tokens=100, messages=messages,
                                tools=tools) as stream:
        final = stream.get_final_message()
    assert final.model_dump() == plain.model_dump()
    replay: list[Any] = [*messages, {"role": "assistant", "content": final.content},
                         {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": c.id, "content": "ok"}
                             for c in TOOLS.message.tool_calls]}]
    client.messages.create(model="policy", max_tokens=100, messages=replay)
    assert seen[-1].messages[1].tool_calls == [
        ToolCall(id=c.id, name=c.name, arguments=json.dumps(c.arguments_dict(),
                                                            separators=(",", ":")))
        for c in TOOLS.message.tool_calls]


# --- errors -----------------------------------------------------------------------------


BAD_REQUESTS: list[tuple[Dialect, Any, str]] = [
    (CHAT, [], "JSON object"),
    (CHAT, {"model": "m"}, "messages"),
    (CHAT, {"messages": []}, "messages"),
    (CHAT, {"messages": "hi"}, "messages"),
    (CHAT, {"messages": [{"content": "hi"}]}, "role"),
    (CHAT, {"messages": [{"role": "robot", "content": "hi"}]}, "role"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "content"),
    (CHAT, {"messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
    (CHAT, {"messages": [{"role": "user", "content": "a"},
                         {"role": "tool", "tool_call_id": "nope", "content": "x"}]}, "nope"),
    (CHAT, {"messages": [{"role": "user", "content": "a"}], "temperature": "hot"},
     "temperature"),
    (CHAT, {"messages": [{"role": "user", "content": "a"}], "max_tokens": 0}, "max_tokens"),
    (CHAT, {"messages": [{"role": "user", "content": "a"}], "n": 3}, "'n'"),
    (CHAT, {"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]},
     "tools[0].function"),
    (CHAT, {"messages": [{"role": "user", "content": "a"}], "stop": [1]}, "stop"),
    (CHAT, {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]},
     "tool_calls[0].id"),
    (COMPLETIONS, {"model": "m"}, "prompt"),
    (COMPLETIONS, {"prompt": ""}, "prompt"),
    (COMPLETIONS, {"prompt": ["a", "b"]}, "batched"),
    (COMPLETIONS, {"prompt": [1, -2]}, "token ids"),
    (COMPLETIONS, {"prompt": [True]}, "prompt"),
    (RESPONSES, {"model": "m"}, "input"),
    (RESPONSES, {"input": []}, "input"),
    (RESPONSES, {"input": 3}, "input"),
    (RESPONSES, {"input": [{"role": "wizard", "content": "x"}]}, "role"),
    (RESPONSES, {"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
     "'c'"),
    (RESPONSES, {"input": [{"type": "function_call", "name": "f"}]}, "call_id"),
    (RESPONSES, {"input": "x", "instructions": ["a"]}, "instructions"),
    (MESSAGES, {"max_tokens": 5}, "messages"),
    (MESSAGES, {"max_tokens": "5", "messages": [{"role": "user", "content": "x"}]},
     "max_tokens"),
    (MESSAGES, {"max_tokens": 5, "messages": [{"role": "bot", "content": "x"}]}, "role"),
    (MESSAGES, {"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "missing", "content": "x"}]}]}, "missing"),
    (MESSAGES, {"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64"}}]}]}, "data"),
    (MESSAGES, {"max_tokens": 5, "system": 7, "messages": [{"role": "user", "content": "x"}]},
     "system"),
]


@pytest.mark.parametrize(("dialect", "body", "needle"), BAD_REQUESTS,
                         ids=[f"{d.name}-{i}" for i, (d, _, _) in enumerate(BAD_REQUESTS)])
def test_bad_requests_get_a_clear_4xx(dialect: Dialect, body: Any, needle: str) -> None:
    with pytest.raises(DialectError) as err:
        dialect.parse(body)
    assert 400 <= err.value.status < 500
    assert needle in err.value.message
    assert "\n" not in err.value.message


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_error_bodies_match_the_sdks(name: str) -> None:
    dialect = DIALECTS[name]
    body = dialect.error(404, "unknown model 'x'", "")
    frame = dialect.error_stream_frame(503, "engine down", "")
    assert frame.endswith(b"\n\n")
    if name == "messages":
        parsed = anthropic.types.ErrorResponse.model_validate(body)
        assert (parsed.error.type, parsed.error.message) == ("not_found_error", "unknown model 'x'")
        (event, data), = sse_frames([frame])
        assert event == "error" and json.loads(data)["error"]["type"] == "overloaded_error"
    else:
        assert body == {"error": {"message": "unknown model 'x'", "type": "not_found_error",
                                  "param": None, "code": None}}
        (_, data), = sse_frames([frame])
        assert "engine down" in data


@pytest.mark.parametrize(("raw", "needle"), [
    (b"{not json", "not valid JSON"),
    (b"", "body is empty"),
    (b"[" + b"1" * 5000 + b"]", "not valid JSON"),  # beyond Python's integer digit limit
    (b"{\"a\": \"\xff\"}", "UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"messages": "\\ud800"}', "surrogate"),
])
def test_load_json_rejects_bad_bodies(raw: bytes, needle: str) -> None:
    with pytest.raises(DialectError) as err:
        load_json(raw)
    assert err.value.status == 400 and needle in err.value.message


PAD = b" " * (json_process.PROCESS_BYTES + 1)  # JSON whitespace: the body becomes "large"


@pytest.mark.parametrize(("raw", "needle"), [
    (b"{not json" + PAD, "not valid JSON"),
    (b"[" + b"1" * 5000 + b"]" + PAD, "not valid JSON"),
    (b"{\"a\": \"\xff\"}" + PAD, "UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000 + PAD, "nested too deeply"),
    (b'{"messages": "\\ud800"}' + PAD, "surrogate"),
    (b'{"messages": ["ok", "\xed\xa0\x80"]}' + PAD, "surrogate"),  # as UTF-8 bytes
    (b'{"messages": "\xed\xa0\x80"}', "surrogate"),
])
def test_large_bodies_are_refused_as_small_ones_are(raw: bytes, needle: str) -> None:
    test_load_json_rejects_bad_bodies(raw, needle)


def test_large_bodies_are_decoded_in_the_helper_process_to_the_same_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    value = {"model": "m", "seed": 2**70, "n": -(2**65), "x": [1.5, -0.0, 1e300, None, True],
             "messages": [{"role": "user", "content": "h\u00e9llo \U0001F600 " * 100_000}]}
    raw = json.dumps(value).encode()
    assert len(raw) > json_process.PROCESS_BYTES
    decoded_here: list[int] = []
    real_parse = json_process.parse

    def counting(data: Any) -> Any:
        decoded_here.append(len(data))
        return real_parse(data)

    monkeypatch.setattr(json_process, "parse", counting)
    assert load_json(raw) == value  # big integers stay integers
    assert decoded_here == []  # the helper decoded it
    assert load_json(b'{"small": 1}') == {"small": 1} and decoded_here == [12]


def test_large_bodies_are_decoded_here_when_the_helper_cannot_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_process, "_helper", None)
    monkeypatch.setattr(json_process.sys, "executable", "/nonexistent/python")
    raw = json.dumps({"content": "x" * (json_process.PROCESS_BYTES + 1)}).encode()
    assert load_json(raw) == {"content": "x" * (json_process.PROCESS_BYTES + 1)}
    # A helper that dies between bodies is replaced by a new one.
    monkeypatch.undo()
    load_json(raw)
    assert json_process._helper is not None
    first = json_process._helper[1]
    first.kill()
    first.wait()
    assert load_json(raw)["content"] == "x" * (json_process.PROCESS_BYTES + 1)
    assert json_process._helper is not None and json_process._helper[1] is not first


def test_load_json_keeps_escaped_surrogate_pairs() -> None:
    raw = json.dumps({"text": "emoji \U0001F600"}).encode()  # ASCII-escaped pair
    assert b"\\ud83d" in raw and load_json(raw) == {"text": "emoji \U0001F600"}


def test_deeply_nested_tool_schema_is_refused() -> None:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(100):
        schema = {"type": "object", "properties": {"x": schema}}
    body = {"messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}
    with pytest.raises(DialectError) as err:
        CHAT.parse(body)
    assert "nested" in err.value.message


def test_frames_survive_unencodable_text() -> None:
    frames = list(CHAT.stream(TEXT, response_id="r", model="bad\udc80name", created=1))
    assert all(f.endswith(b"\n\n") for f in frames)
    assert json.loads(sse_frames(frames[:1])[0][1])["model"] == "bad\udc80name"


def test_keepalive_is_an_sse_comment() -> None:
    assert KEEPALIVE_FRAME.startswith(b":") and KEEPALIVE_FRAME.endswith(b"\n\n")


@given(st.text(max_size=200), st.integers(min_value=1, max_value=10))
def test_split_deltas_concatenates_back(text: str, parts: int) -> None:
    pieces = split_deltas(text, parts)
    assert "".join(pieces) == text and len(pieces) <= parts and all(pieces)


# --- fuzz: nothing but DialectError comes out of parse ---------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=10,
)
KEYS = ["model", "messages", "input", "prompt", "system", "tools", "instructions", "role",
        "content", "type", "text", "tool_calls", "tool_call_id", "function", "name",
        "arguments", "call_id", "output", "tool_use_id", "id", "source", "image_url", "url",
        "data", "max_tokens", "max_output_tokens", "max_completion_tokens", "temperature",
        "top_p", "stop", "stop_sequences", "seed", "stream", "stream_options", "n",
        "previous_response_id", "summary", "input_schema", "parameters", "thinking", "input"]
TYPES = ["text", "image", "image_url", "input_text", "output_text", "input_image", "message",
         "function_call", "function_call_output", "reasoning", "tool_use", "tool_result",
         "thinking", "function", "custom", "base64", "url", "summary_text"]
ROLES = ["system", "developer", "user", "assistant", "tool", "function"]
# Values shaped like the wire schemas, so the fuzzer reaches deep parsing code.
SHAPED = st.recursive(
    JSON | st.sampled_from(TYPES + ROLES),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(KEYS), inner | st.sampled_from(TYPES + ROLES), max_size=6),
    max_leaves=15,
)

# Wire-shaped pieces with fuzzed leaves: blocks / parts / items, messages, tool calls.
LEAF = st.text(max_size=6) | st.sampled_from(["call_1", "t1", "{}", '{"a": 1}', "[]"]) | JSON
BLOCK = st.fixed_dictionaries(
    {"type": st.sampled_from(TYPES)},
    optional={k: LEAF for k in (
        "text", "role", "content", "id", "call_id", "tool_use_id", "name", "arguments",
        "input", "output", "source", "image_url", "thinking", "summary", "function")},
)
CALL = st.fixed_dictionaries(
    {"id": LEAF, "function": st.fixed_dictionaries(
        {"name": LEAF}, optional={"arguments": LEAF})},
    optional={"type": st.just("function")},
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(ROLES)},
    optional={"content": st.text(max_size=6) | st.lists(BLOCK, max_size=4) | LEAF,
              "tool_calls": st.lists(CALL, max_size=2) | LEAF,
              "tool_call_id": LEAF, "type": st.sampled_from(TYPES)},
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(MESSAGE | BLOCK, min_size=1, max_size=6),
       tools=st.lists(BLOCK | LEAF, max_size=2))
def test_fuzz_wire_shaped_requests_raise_only_dialect_errors(items: list[Any],
                                                             tools: list[Any]) -> None:
    for key in ("messages", "input"):
        body = {"max_tokens": 8, key: items, "tools": tools}
        for dialect in DIALECTS.values():
            _only_dialect_errors(dialect.parse, body)


def _only_dialect_errors(parse: Callable[[Any], Any], body: Any) -> None:
    try:
        parse(body)
    except DialectError as err:
        assert 400 <= err.status < 500 and err.message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=JSON | SHAPED)
def test_fuzz_parse_raises_only_dialect_errors(body: Any) -> None:
    for dialect in DIALECTS.values():
        _only_dialect_errors(dialect.parse, body)
    _only_dialect_errors(MESSAGES.parse_count_tokens, body)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(SHAPED, min_size=1, max_size=5), extra=st.dictionaries(
    st.sampled_from(KEYS), SHAPED, max_size=4))
def test_fuzz_message_lists_raise_only_dialect_errors(messages: list[Any],
                                                      extra: dict[str, Any]) -> None:
    for key in ("messages", "input", "prompt"):
        body = {"max_tokens": 8, **extra, key: messages}
        for dialect in DIALECTS.values():
            _only_dialect_errors(dialect.parse, body)
