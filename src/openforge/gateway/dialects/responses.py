"""OpenAI Responses (`POST /v1/responses`): Codex CLI, OpenClaw `openai-responses`, SDKs.

Requests are stateless here: the harness replays the whole history in `input` (Codex does,
with `store: false`). `previous_response_id` would need server-side storage of earlier
responses and is refused with a message saying so.

The items of one assistant turn (reasoning, a text message, function calls) arrive as
separate `input` items; they are merged back into one assistant `Message`, so the
rendered history matches what the policy generated.

Functions grouped in a `namespace` tool (Codex puts each MCP server's tools in one,
`mcp__<server>`) reach the policy as `<namespace>__<function>`; a call of such a name goes
back as `{"name": <function>, "namespace": <namespace>}`, the form Codex runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
    id_suffix,
    openai_error,
    opt_bool,
    opt_str,
    read_parts,
    read_sampling,
    read_tool,
    require_object,
    split_deltas,
    sse_event,
    tool_arguments,
)
from openforge.gateway.dialects.memo import OPEN, HistoryMemo, Resume, resume

NAMESPACE_SEPARATOR = "__"
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def _input_image(part: dict[str, Any], where: str) -> ImageRef | None:
    url = opt_str(part, "image_url", f"{where}.image_url")
    return ImageRef(url=url) if url else None  # a `file_id` reference cannot be resolved here


def _read_content(value: Any, field: str) -> tuple[str, list[ImageRef]]:
    """Text and images of a message's `content` (string or list of content parts)."""
    return read_parts(value, field, text_types=_TEXT_PARTS, image_type="input_image",
                      read_image=_input_image)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """A reasoning item's text: its full `content` when present, else its summary."""
    text, _ = _read_content(item.get("content"), f"{where}.content")
    if not text:
        text, _ = _read_content(item.get("summary"), f"{where}.summary")
    return text


class _History:
    """Builds the message list, merging the output items of one assistant turn."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.pending_reasoning: str | None = None

    def _assistant(self) -> Message:
        """The current assistant turn: the last message if it is one, else a new one."""
        last = self.messages[-1] if self.messages else None
        if last is None or last.role != "assistant":
            last = Message(role="assistant")
            self.messages.append(last)
        if self.pending_reasoning:
            last.reasoning = (
                f"{last.reasoning}\n{self.pending_reasoning}"
                if last.reasoning else self.pending_reasoning
            )
        self.pending_reasoning = None
        return last

    def add(self, message: Message) -> None:
        if message.role == "assistant":
            turn = self._assistant()
            if message.content:
                turn.content = f"{turn.content}\n{message.content}" if turn.content else (
                    message.content)
            turn.images.extend(message.images)
            return
        # Reasoning not followed by an assistant item of its turn has nothing to attach to.
        self.pending_reasoning = None
        self.messages.append(message)

    def add_call(self, call: ToolCall) -> None:
        self._assistant().tool_calls.append(call)

    def boundary(self) -> int:
        """The message count when the history is complete here, else `OPEN`.

        Complete: no reasoning waits for its turn and the last message is not an assistant
        turn that a following item could still extend. Earlier messages are never touched
        again from such a point, so a later request may resume parsing there.
        """
        if self.pending_reasoning is not None or (
                self.messages and self.messages[-1].role == "assistant"):
            return OPEN
        return len(self.messages)

    def add_reasoning(self, text: str) -> None:
        if text:
            self.pending_reasoning = (
                f"{self.pending_reasoning}\n{text}" if self.pending_reasoning else text
            )


def _add_item(history: _History, raw: Any, i: int) -> None:
    where = f"input[{i}]"
    item = require_object(raw, where)
    kind = item.get("type")
    if kind is None and "role" in item:
        kind = "message"
    if kind == "message":
        role = opt_str(item, "role", f"{where}.role")
        if role not in _ROLES:
            raise DialectError(
                f"'{where}.role' must be one of system, developer, user, assistant; got "
                f"{role!r}"
            )
        text, images = _read_content(item.get("content"), f"{where}.content")
        history.add(Message(role=_ROLES[role], content=text, images=images))  # type: ignore[arg-type]
    elif kind == "function_call":
        call_id = opt_str(item, "call_id", f"{where}.call_id")
        name = opt_str(item, "name", f"{where}.name")
        if not call_id or not name:
            raise DialectError(f"'{where}' (function_call) needs 'call_id' and 'name'")
        arguments = tool_arguments(item.get("arguments"), f"{where}.arguments")
        namespace = opt_str(item, "namespace", f"{where}.namespace")
        if namespace:
            name = f"{namespace}{NAMESPACE_SEPARATOR}{name}"
        history.add_call(ToolCall(id=call_id, name=name, arguments=arguments))
    elif kind == "function_call_output":
        call_id = opt_str(item, "call_id", f"{where}.call_id")
        if not call_id:
            raise DialectError(f"'{where}.call_id' is required for a function_call_output")
        text, images = _read_content(item.get("output"), f"{where}.output")
        history.add(Message(role="tool", content=text, images=images, tool_call_id=call_id))
    elif kind == "reasoning":
        history.add_reasoning(_reasoning_text(item, where))
    # Hosted-tool calls, custom tools, item references, compaction markers: the policy
    # neither made nor can read them, so they are left out of its conversation.


def _read_tools(value: Any) -> list[Tool]:
    """Function tools, also those inside a `namespace` tool; hosted `web_search`, `custom`
    etc. are ignored (the policy could not call them)."""
    tools: list[Tool] = []
    for i, raw in enumerate(as_list(value, "tools")):
        where = f"tools[{i}]"
        tool = require_object(raw, where)
        if tool.get("type") == "function":
            tools.append(read_tool(tool, where, "parameters"))
        elif tool.get("type") == "namespace":
            namespace = opt_str(tool, "name", f"{where}.name")
            if not namespace:
                raise DialectError(f"'{where}.name' is required for a namespace tool")
            for j, inner in enumerate(as_list(tool.get("tools") or [], f"{where}.tools")):
                inner = require_object(inner, f"{where}.tools[{j}]")
                if inner.get("type") != "function":
                    continue
                function = read_tool(inner, f"{where}.tools[{j}]", "parameters")
                function.name = f"{namespace}{NAMESPACE_SEPARATOR}{function.name}"
                function.namespace = namespace
                tools.append(function)
    return tools


def usage(completion: Completion) -> dict[str, Any]:
    return {
        "input_tokens": completion.prompt_tokens,
        "input_tokens_details": {"cached_tokens": completion.cached_tokens,
                                 "cache_write_tokens": 0},
        "output_tokens": completion.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": completion.reasoning_tokens},
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }


def _output_items(completion: Completion, response_id: str,
                  request: ChatRequest | None = None) -> list[dict[str, Any]]:
    """The finished output items: reasoning?, message?, function calls."""
    namespaces = {t.name: t.namespace for t in request.tools if t.namespace} if request else {}
    msg = completion.message
    suffix = id_suffix(response_id)
    items: list[dict[str, Any]] = []
    if msg.reasoning:
        # The text goes in `summary` (what clients keep and replay) and in `content`.
        items.append({
            "type": "reasoning", "id": f"rs_{suffix}",
            "summary": [{"type": "summary_text", "text": msg.reasoning}],
            "content": [{"type": "reasoning_text", "text": msg.reasoning}],
        })
    if msg.content or not msg.tool_calls:
        items.append({
            "type": "message", "id": f"msg_{suffix}", "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": msg.content, "annotations": [],
                         "logprobs": []}],
        })
    for call in msg.tool_calls:
        item = {"type": "function_call", "id": f"fc_{call.id}", "call_id": call.id,
                "name": call.name, "arguments": call.arguments, "status": "completed"}
        namespace = namespaces.get(call.name)
        if namespace:
            item.update(name=call.name[len(namespace) + len(NAMESPACE_SEPARATOR):],
                        namespace=namespace)
        items.append(item)
    return items


def _stream_item(
    event: Callable[..., bytes], index: int, item: dict[str, Any]
) -> Iterator[bytes]:
    """The frames of one output item, from `output_item.added` to `output_item.done`."""
    item_id = item["id"]
    at = {"item_id": item_id, "output_index": index}
    kind = item["type"]
    if kind == "reasoning":
        text = item["summary"][0]["text"]
        yield event("response.output_item.added", output_index=index,
                    item={**item, "summary": [], "content": []})
        part = {"type": "summary_text", "text": ""}
        yield event("response.reasoning_summary_part.added", **at, summary_index=0, part=part)
        for piece in split_deltas(text):
            yield event("response.reasoning_summary_text.delta", **at, summary_index=0,
                        delta=piece)
        yield event("response.reasoning_summary_text.done", **at, summary_index=0, text=text)
        yield event("response.reasoning_summary_part.done", **at, summary_index=0,
                    part={**part, "text": text})
    elif kind == "message":
        part = item["content"][0]
        text = part["text"]
        yield event("response.output_item.added", output_index=index,
                    item={**item, "status": "in_progress", "content": []})
        at_part = {**at, "content_index": 0}
        yield event("response.content_part.added", **at_part, part={**part, "text": ""})
        for piece in split_deltas(text):
            yield event("response.output_text.delta", **at_part, delta=piece, logprobs=[])
        yield event("response.output_text.done", **at_part, text=text, logprobs=[])
        yield event("response.content_part.done", **at_part, part=part)
    else:
        arguments = item["arguments"]
        yield event("response.output_item.added", output_index=index,
                    item={**item, "status": "in_progress", "arguments": ""})
        for piece in split_deltas(arguments):
            yield event("response.function_call_arguments.delta", **at, delta=piece)
        yield event("response.function_call_arguments.done", **at, name=item["name"],
                    arguments=arguments)
    yield event("response.output_item.done", output_index=index, item=item)


class ResponsesDialect(Dialect):
    """OpenAI Responses."""

    name = "responses"
    paths = ("/responses",)
    id_prefix = "resp_"

    def parse(self, body: Any, *, memo: HistoryMemo | None = None) -> ChatRequest:
        body = require_object(body)
        if body.get("previous_response_id") is not None:
            raise DialectError(
                "'previous_response_id' is not supported: the gateway stores no responses; "
                "send the full history in 'input' (store: false)"
            )
        if body.get("conversation") is not None:
            raise DialectError(
                "'conversation' is not supported: send the full history in 'input'"
            )
        history = _History()
        instructions = body.get("instructions")
        raw_input = body.get("input")
        # Memo items: `instructions`, then each input item (a string input is not a history).
        if isinstance(raw_input, list):
            parsed = resume(memo, self.name, [instructions, *raw_input])
        else:
            memo, parsed = None, Resume()  # a string (or invalid) input is no history
        history.messages = parsed.messages
        if parsed.n == 0:
            if instructions is not None:
                if not isinstance(instructions, str):
                    raise bad_type("instructions", "a string", instructions)
                if instructions:
                    history.add(Message(role="system", content=instructions))
            parsed.ends.append(history.boundary())
        if raw_input is None:
            raise DialectError("'input' is required")
        if isinstance(raw_input, str):
            history.add(Message(role="user", content=raw_input))
        else:
            raw_items = as_list(raw_input, "input")
            for i in range(max(parsed.n - 1, 0), len(raw_items)):
                _add_item(history, raw_items[i], i)
                parsed.ends.append(history.boundary())
        if not any(m.role != "system" for m in history.messages):
            raise DialectError("'input' must contain at least one message")
        check_tool_results(parsed)
        raw_tools = body.get("tools")
        tools = memo.reuse_tools(self.name, raw_tools) if memo else None
        if tools is None:
            tools = _read_tools(raw_tools)
        # model_construct: every field is typed by the parser above; validating a long
        # history again on every request would cost more than parsing its new items.
        request = ChatRequest.model_construct(
            model=opt_str(body, "model") or "",
            messages=history.messages,
            tools=tools,
            sampling=read_sampling(body, max_tokens_keys=("max_output_tokens",), stop_key=None),
            stream=bool(opt_bool(body, "stream")),
        )
        if memo is not None:
            memo.remember(self.name, parsed, raw_tools, tools)
        return request

    def _response_object(
        self,
        *,
        response_id: str,
        model: str,
        created: int,
        request: ChatRequest | None,
        status: str,
        output: list[dict[str, Any]],
        usage_: dict[str, Any] | None,
    ) -> dict[str, Any]:
        sampling = request.sampling if request is not None else None
        return {
            "id": response_id,
            "object": "response",
            "created_at": created,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "metadata": {},
            "model": model,
            "output": output,
            "parallel_tool_calls": True,
            "temperature": sampling.temperature if sampling else None,
            "top_p": sampling.top_p if sampling else None,
            "max_output_tokens": (sampling.max_tokens
                                  if sampling and "max_tokens" in sampling.model_fields_set
                                  else None),
            "tool_choice": "auto",
            "tools": [],
            "store": False,
            "usage": usage_,
        }

    def response(
        self,
        completion: Completion,
        *,
        response_id: str,
        model: str,
        created: int,
        request: ChatRequest | None = None,
    ) -> dict[str, Any]:
        return self._response_object(
            response_id=response_id, model=model, created=created, request=request,
            status="completed", output=_output_items(completion, response_id, request),
            usage_=usage(completion),
        )

    def stream(
        self,
        completion: Completion,
        *,
        response_id: str,
        model: str,
        created: int,
        request: ChatRequest | None = None,
    ) -> Iterator[bytes]:
        seq = 0

        def event(kind: str, **fields: Any) -> bytes:
            nonlocal seq
            frame = sse_event(kind, {"type": kind, "sequence_number": seq, **fields})
            seq += 1
            return frame

        start = self._response_object(
            response_id=response_id, model=model, created=created, request=request,
            status="in_progress", output=[], usage_=None,
        )
        yield event("response.created", response=start)
        yield event("response.in_progress", response=start)
        items = _output_items(completion, response_id, request)
        for index, item in enumerate(items):
            yield from _stream_item(event, index, item)
        yield event("response.completed", response=self.response(
            completion, response_id=response_id, model=model, created=created,
            request=request))

    def error(self, status: int, message: str, error_type: str = "") -> dict[str, Any]:
        return openai_error(status, message, error_type)

    def error_stream_frame(self, status: int, message: str, error_type: str = "") -> bytes:
        body = openai_error(status, message, error_type)["error"]
        return sse_event("error", {"type": "error", "sequence_number": 0, "code": body["type"],
                                   "message": message, "param": None})
