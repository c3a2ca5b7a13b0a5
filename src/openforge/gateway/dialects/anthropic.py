"""Anthropic Messages (`POST /v1/messages`): Claude Code, OpenClaw `anthropic-messages`, SDK.

Claude Code quirks handled here: from its second turn it puts a `role: "system"` entry
inside `messages`; it sends `thinking`, `output_config`, `context_management`, `metadata`
and `cache_control` markers, all accepted and ignored. Server tools (`web_search_...`,
`bash_...`, anything with a `type` other than `custom`) are not the policy's to call and
are dropped. `/v1/messages/count_tokens` bodies are parsed by `parse_count_tokens`.
"""

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
    check_depth,
    check_tool_results,
    default_error_type,
    dumps,
    finish_reason,
    opt_bool,
    opt_object,
    opt_str,
    read_parts,
    read_sampling,
    read_tool,
    require_object,
    split_deltas,
    sse_event,
)
from openforge.gateway.dialects.memo import HistoryMemo, Resume, resume

_ERROR_TYPES = {
    "invalid_request_error", "authentication_error", "permission_error", "not_found_error",
    "request_too_large", "rate_limit_error", "api_error", "overloaded_error",
}
_STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def _image(block: dict[str, Any], where: str) -> ImageRef | None:
    """An image block's source as a URL (base64 data becomes a data URL)."""
    source = opt_object(block, "source", f"{where}.source")
    if source is None:
        raise DialectError(f"'{where}.source' is required for an image block")
    kind = source.get("type")
    if kind == "base64":
        media = opt_str(source, "media_type", f"{where}.source.media_type") or "image/png"
        data = opt_str(source, "data", f"{where}.source.data")
        if not data:
            raise DialectError(f"'{where}.source.data' is required for a base64 image")
        return ImageRef(url=f"data:{media};base64,{data}")
    if kind == "url":
        url = opt_str(source, "url", f"{where}.source.url")
        if not url:
            raise DialectError(f"'{where}.source.url' is required for a url image")
        return ImageRef(url=url)
    return None  # a Files-API `file` source cannot be resolved here


def _text_and_images(value: Any, field: str) -> tuple[str, list[ImageRef]]:
    """Text blocks joined by newlines plus images; other block types are skipped."""
    return read_parts(value, field, text_types=("text",), image_type="image", read_image=_image)


def _user_messages(content: Any, where: str) -> list[Message]:
    """A user turn: runs of text/images become user messages, tool results tool messages."""
    if content is None or isinstance(content, str):
        return [Message(role="user", content=content or "")]
    out: list[Message] = []
    texts: list[str] = []
    images: list[ImageRef] = []

    def flush() -> None:
        if texts or images:
            out.append(Message(role="user", content="\n".join(texts), images=list(images)))
            texts.clear()
            images.clear()

    blocks = as_list(content, f"{where}.content")
    for i, raw in enumerate(blocks):
        at = f"{where}.content[{i}]"
        block = require_object(raw, at)
        kind = block.get("type")
        if kind == "text":
            texts.append(opt_str(block, "text", f"{at}.text") or "")
        elif kind == "image":
            image = _image(block, at)
            if image is not None:
                images.append(image)
        elif kind == "tool_result":
            flush()
            call_id = opt_str(block, "tool_use_id", f"{at}.tool_use_id")
            if not call_id:
                raise DialectError(f"'{at}.tool_use_id' is required for a tool_result")
            text, result_images = _text_and_images(block.get("content"), f"{at}.content")
            opt_bool(block, "is_error", f"{at}.is_error")
            out.append(Message(role="tool", content=text, images=result_images,
                               tool_call_id=call_id))
    flush()
    if not blocks:
        out.append(Message(role="user"))
    return out


def _assistant_message(content: Any, where: str) -> Message:
    if content is None or isinstance(content, str):
        return Message(role="assistant", content=content or "")
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for i, raw in enumerate(as_list(content, f"{where}.content")):
        at = f"{where}.content[{i}]"
        block = require_object(raw, at)
        kind = block.get("type")
        if kind == "text":
            texts.append(opt_str(block, "text", f"{at}.text") or "")
        elif kind == "thinking":
            thoughts.append(opt_str(block, "thinking", f"{at}.thinking") or "")
        elif kind == "tool_use":
            call_id = opt_str(block, "id", f"{at}.id")
            name = opt_str(block, "name", f"{at}.name")
            if not call_id or not name:
                raise DialectError(f"'{at}' (tool_use) needs 'id' and 'name'")
            arguments = opt_object(block, "input", f"{at}.input") or {}
            check_depth(arguments, f"{at}.input")
            calls.append(ToolCall(id=call_id, name=name, arguments=dumps(arguments)))
        # redacted_thinking carries only ciphertext; server tool blocks are not the policy's.
    reasoning = "\n".join(t for t in thoughts if t) or None
    return Message(role="assistant", content="\n".join(texts), reasoning=reasoning,
                   tool_calls=calls)


def _message_item(raw: Any, i: int) -> list[Message]:
    """The canonical messages of `messages[i]` (a user turn may hold several)."""
    where = f"messages[{i}]"
    msg = require_object(raw, where)
    role = opt_str(msg, "role", f"{where}.role")
    content = msg.get("content")
    if role == "user":
        return _user_messages(content, where)
    if role == "assistant":
        return [_assistant_message(content, where)]
    if role == "system":
        text, _ = _text_and_images(content, f"{where}.content")
        return [Message(role="system", content=text)]
    raise DialectError(f"'{where}.role' must be 'user' or 'assistant', got {role!r}")


def _messages(body: dict[str, Any], memo: HistoryMemo | None = None) -> Resume:
    """The conversation (`.messages`), parsed from its items `system`, then each message,
    reusing what the session's `HistoryMemo` has of them."""
    system = body.get("system")
    value = body.get("messages")
    parsed = resume(memo, AnthropicDialect.name,
                    [system, *value] if isinstance(value, list) else [system])
    out = parsed.messages
    if parsed.n == 0:
        if system is not None:
            text, _ = _text_and_images(system, "system")
            if text:
                out.append(Message(role="system", content=text))
        parsed.ends.append(len(out))
    raw_messages = as_list(value, "messages")
    if not raw_messages:
        raise DialectError("'messages' must be a non-empty array")
    for i in range(max(parsed.n - 1, 0), len(raw_messages)):
        out.extend(_message_item(raw_messages[i], i))
        parsed.ends.append(len(out))
    check_tool_results(parsed)
    return parsed


def _tools(value: Any) -> list[Tool]:
    tools: list[Tool] = []
    for i, raw in enumerate(as_list(value, "tools")):
        tool = require_object(raw, f"tools[{i}]")
        if tool.get("type", "custom") not in ("custom", None):
            continue
        tools.append(read_tool(tool, f"tools[{i}]", "input_schema"))
    return tools


def usage(completion: Completion) -> dict[str, Any]:
    return {
        "input_tokens": completion.prompt_tokens,
        "output_tokens": completion.completion_tokens,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }


def _blocks(completion: Completion) -> list[dict[str, Any]]:
    """Finished content blocks: thinking?, text?, tool_use*; never an empty list."""
    msg = completion.message
    blocks: list[dict[str, Any]] = []
    if msg.reasoning:
        blocks.append({"type": "thinking", "thinking": msg.reasoning, "signature": ""})
    if msg.content or not msg.tool_calls:
        blocks.append({"type": "text", "text": msg.content})
    for call in msg.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                       "input": call.arguments_dict()})
    return blocks


def count_tokens_response(input_tokens: int) -> dict[str, Any]:
    """The body of `/v1/messages/count_tokens`."""
    return {"input_tokens": input_tokens}


class AnthropicDialect(Dialect):
    """Anthropic Messages."""

    name = "messages"
    paths = ("/messages",)
    id_prefix = "msg_"
    count_tokens_path = "/messages/count_tokens"

    def parse(self, body: Any, *, memo: HistoryMemo | None = None) -> ChatRequest:
        body = require_object(body)
        if body.get("max_tokens") is None:
            raise DialectError("'max_tokens' is required")
        return self._parse(body, memo)

    def parse_count_tokens(self, body: Any) -> ChatRequest:
        """A count_tokens body: a Messages request without `max_tokens`."""
        return self._parse(require_object(body), None)

    def count_tokens_response(self, input_tokens: int) -> dict[str, Any]:
        return count_tokens_response(input_tokens)

    def context_error(self, message: str, prompt_tokens: int, limit: int) -> dict[str, Any]:
        # The wording of Anthropic's own error, which Claude Code matches to compact.
        return self.error(400, f"prompt is too long: {prompt_tokens} tokens > {limit} maximum",
                          "invalid_request_error")

    def _parse(self, body: dict[str, Any], memo: HistoryMemo | None) -> ChatRequest:
        model = opt_str(body, "model") or ""
        parsed = _messages(body, memo)
        raw_tools = body.get("tools")
        tools = memo.reuse_tools(self.name, raw_tools) if memo else None
        if tools is None:
            tools = _tools(raw_tools)
        # model_construct: every field is typed by the parser above; validating a long
        # history again on every request would cost more than parsing its new items.
        request = ChatRequest.model_construct(
            model=model,
            messages=parsed.messages,
            tools=tools,
            sampling=read_sampling(body, max_tokens_keys=("max_tokens",),
                                   stop_key="stop_sequences"),
            stream=bool(opt_bool(body, "stream")),
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
        return {
            "id": response_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": _blocks(completion),
            "stop_reason": _STOP_REASONS[finish_reason(completion)],
            "stop_sequence": None,
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
        start_usage = {**usage(completion), "output_tokens": 0}
        yield sse_event("message_start", {"type": "message_start", "message": {
            "id": response_id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage,
        }})
        for index, block in enumerate(_blocks(completion)):
            yield from _stream_block(index, block)
        yield sse_event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": _STOP_REASONS[finish_reason(completion)],
                      "stop_sequence": None},
            "usage": usage(completion),
        })
        yield sse_event("message_stop", {"type": "message_stop"})

    def error(self, status: int, message: str, error_type: str = "") -> dict[str, Any]:
        kind = error_type if error_type in _ERROR_TYPES else default_error_type(status)
        return {"type": "error", "error": {"type": kind, "message": message}}

    def error_stream_frame(self, status: int, message: str, error_type: str = "") -> bytes:
        return sse_event("error", self.error(status, message, error_type))


def _stream_block(index: int, block: dict[str, Any]) -> Iterator[bytes]:
    kind = block["type"]
    if kind == "thinking":
        start, key, delta_type, text = (
            {**block, "thinking": ""}, "thinking", "thinking_delta", block["thinking"])
    elif kind == "text":
        start, key, delta_type, text = ({**block, "text": ""}, "text", "text_delta",
                                        block["text"])
    else:
        start, key, delta_type, text = ({**block, "input": {}}, "partial_json",
                                        "input_json_delta", dumps(block["input"]))
    yield sse_event("content_block_start", {"type": "content_block_start", "index": index,
                                            "content_block": start})
    for piece in split_deltas(text):
        yield sse_event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                "delta": {"type": delta_type, key: piece}})
    yield sse_event("content_block_stop", {"type": "content_block_stop", "index": index})

