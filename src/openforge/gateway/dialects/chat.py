"""OpenAI chat completions (`POST /v1/chat/completions`): OpenClaw, opencode, SDKs, litellm."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from openforge.gateway.conversation import (
    ChatRequest,
    Completion,
    ImageRef,
    Message,
    Tool,
    ToolCall,
)
from openforge.gateway.dialects.base import (
    Dialect,
    DialectError,
    as_list,
    bad_type,
    check_tool_results,
    finish_reason,
    openai_error,
    openai_stream_end,
    openai_usage,
    opt_bool,
    opt_int,
    opt_list,
    opt_object,
    opt_str,
    read_sampling,
    read_tool,
    require_object,
    split_deltas,
    sse_data,
    tool_arguments,
)
from openforge.gateway.dialects.memo import HistoryMemo, resume

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
          "tool": "tool"}


def read_content(value: Any, field: str) -> tuple[str, list[ImageRef]]:
    """Text and images of a chat `content`: a string, null, or a list of content parts.

    Text parts are joined with newlines; parts the policy cannot use (audio, files,
    refusals) are skipped.
    """
    if value is None:
        return "", []
    if isinstance(value, str):
        return value, []
    if not isinstance(value, list):
        raise bad_type(field, "a string or an array of content parts", value)
    texts: list[str] = []
    images: list[ImageRef] = []
    for i, part in enumerate(value):
        where = f"{field}[{i}]"
        if isinstance(part, str):
            texts.append(part)
            continue
        part = require_object(part, where)
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            text = opt_str(part, "text", f"{where}.text")
            texts.append(text or "")
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url:
                raise DialectError(f"'{where}.image_url.url' must be a non-empty string")
            images.append(ImageRef(url=url))
    return "\n".join(texts), images


def _tool_calls(value: Any, field: str) -> list[ToolCall]:
    calls: list[ToolCall] = []
    for i, raw in enumerate(as_list(value, field)):
        where = f"{field}[{i}]"
        call = require_object(raw, where)
        fn = opt_object(call, "function", f"{where}.function")
        if fn is None:
            raise DialectError(f"'{where}.function' is required")
        name = opt_str(fn, "name", f"{where}.function.name")
        if not name:
            raise DialectError(f"'{where}.function.name' is required")
        call_id = opt_str(call, "id", f"{where}.id")
        if not call_id:
            raise DialectError(f"'{where}.id' is required")
        arguments = tool_arguments(fn.get("arguments"), f"{where}.function.arguments")
        calls.append(ToolCall(id=call_id, name=name, arguments=arguments))
    return calls


def _message(raw: Any, i: int) -> Message | None:
    where = f"messages[{i}]"
    msg = require_object(raw, where)
    role = opt_str(msg, "role", f"{where}.role")
    if role is None:
        raise DialectError(f"'{where}.role' is required")
    if role == "function":
        return None  # legacy function-calling result: superseded by tool messages
    if role not in _ROLES:
        raise DialectError(
            f"'{where}.role' must be one of system, developer, user, assistant, tool; "
            f"got '{role}'"
        )
    text, images = read_content(msg.get("content"), f"{where}.content")
    out = Message(role=_ROLES[role], content=text, images=images)  # type: ignore[arg-type]
    if out.role == "assistant":
        out.tool_calls = _tool_calls(msg.get("tool_calls"), f"{where}.tool_calls")
        reasoning = msg.get("reasoning_content", msg.get("reasoning"))
        if isinstance(reasoning, str) and reasoning:
            out.reasoning = reasoning
    elif out.role == "tool":
        call_id = opt_str(msg, "tool_call_id", f"{where}.tool_call_id")
        if not call_id:
            raise DialectError(f"'{where}.tool_call_id' is required for a tool message")
        out.tool_call_id = call_id
        name = msg.get("name")
        out.name = name if isinstance(name, str) and name else None
    return out


def read_tools(value: Any) -> list[Tool]:
    """Function tools of a chat request; other tool types are ignored."""
    tools: list[Tool] = []
    for i, raw in enumerate(as_list(value, "tools")):
        tool = require_object(raw, f"tools[{i}]")
        if tool.get("type", "function") != "function":
            continue
        fn = opt_object(tool, "function", f"tools[{i}].function")
        if fn is None:
            raise DialectError(f"'tools[{i}].function' is required")
        tools.append(read_tool(fn, f"tools[{i}].function", "parameters"))
    return tools


def usage(completion: Completion) -> dict[str, Any]:
    """OpenAI chat usage, with the cached and reasoning token details."""
    return {
        **openai_usage(completion),
        "prompt_tokens_details": {"cached_tokens": completion.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": completion.reasoning_tokens},
    }


def check_n(body: dict[str, Any]) -> None:
    n = opt_int(body, "n")
    if n is not None and n != 1:
        raise DialectError("'n' must be 1: the gateway generates one choice per request")


class ChatDialect(Dialect):
    """OpenAI chat completions."""

    name = "chat"
    paths = ("/chat/completions",)
    id_prefix = "chatcmpl-"

    def parse(self, body: Any, *, memo: HistoryMemo | None = None) -> ChatRequest:
        body = require_object(body)
        model = opt_str(body, "model") or ""
        raw_messages = opt_list(body, "messages")
        if not raw_messages:
            raise DialectError("'messages' must be a non-empty array")
        parsed = resume(memo, self.name, raw_messages)
        messages = parsed.messages
        for i in range(parsed.n, len(raw_messages)):
            message = _message(raw_messages[i], i)
            if message is not None:
                messages.append(message)
            parsed.ends.append(len(messages))
        if not messages:
            raise DialectError("'messages' has no system, user, assistant or tool message")
        check_tool_results(parsed)
        check_n(body)
        options = opt_object(body, "stream_options") or {}
        raw_tools = body.get("tools")
        tools = memo.reuse_tools(self.name, raw_tools) if memo else None
        if tools is None:
            tools = read_tools(raw_tools)
        # model_construct: every field is typed by the parser above; validating a long
        # history again on every request would cost more than parsing its new items.
        request = ChatRequest.model_construct(
            model=model,
            messages=messages,
            tools=tools,
            sampling=read_sampling(body, max_tokens_keys=("max_completion_tokens", "max_tokens")),
            stream=bool(opt_bool(body, "stream")),
            include_usage=bool(opt_bool(options, "include_usage", "stream_options.include_usage")),
        )
        if memo is not None:
            memo.remember(self.name, parsed, raw_tools, tools)
        return request

    def response(
        self,
        completion: Completion,
        *,
        response_id: str,
        model: str,
        created: int,
        request: ChatRequest | None = None,
    ) -> dict[str, Any]:
        msg = completion.message
        message: dict[str, Any] = {
            "role": "assistant",
            # OpenAI sends null content next to tool calls; harnesses test for it.
            "content": msg.content if msg.content or not msg.tool_calls else None,
        }
        if msg.reasoning:
            message["reasoning_content"] = msg.reasoning
        if msg.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in msg.tool_calls
            ]
        return {
            "id": response_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": finish_reason(completion)}],
            "usage": usage(completion),
        }

    def stream(
        self,
        completion: Completion,
        *,
        response_id: str,
        model: str,
        created: int,
        request: ChatRequest | None = None,
    ) -> Iterator[bytes]:
        head = {"id": response_id, "object": "chat.completion.chunk", "created": created,
                "model": model}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return sse_data({**head, "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

        msg = completion.message
        yield chunk({"role": "assistant", "content": ""})
        for piece in split_deltas(msg.reasoning or ""):
            yield chunk({"reasoning_content": piece})
        for piece in split_deltas(msg.content):
            yield chunk({"content": piece})
        for index, call in enumerate(msg.tool_calls):
            yield chunk({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                         "function": {"name": call.name, "arguments": ""}}]})
            for piece in split_deltas(call.arguments):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        yield chunk({}, finish_reason(completion))
        yield from openai_stream_end(head, usage(completion), request)

    def error(self, status: int, message: str, error_type: str = "") -> dict[str, Any]:
        return openai_error(status, message, error_type)
