"""What every wire dialect provides, and the small vocabulary they share.

A dialect is stateless: `parse` turns one wire request body (already JSON-decoded) into the
canonical `ChatRequest`, `response` / `stream` turn one canonical `Completion` into the
wire response or its complete list of SSE frames, and `error` builds the dialect's own
error body. The gateway generates the whole completion first and then streams it, so a
stream here is a finite iterator of byte frames in the exact order real providers use.

Parsing follows one rule: reject what is malformed (a 4xx `DialectError` with a one-line
message naming the field), ignore what is merely unknown (extra fields, tool types and
content parts the policy cannot use), so unmodified harnesses keep working.

Everything the gateway knows about a wire API lives in its dialect: the routes it is served
on (`paths`), the shape of its response ids (`id_prefix`), how its errors look (including
the context-overflow error harnesses react to by compacting), and how a response extends
the conversation (`history_message`: the assistant message the client sends back in its
next request). Adding a dialect is one file plus its entry in `DIALECTS`.
"""

from __future__ import annotations

import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, ClassVar, Literal

from openforge.gateway import json_process
from openforge.gateway.conversation import ChatRequest, Completion, ImageRef, Message, Tool
from openforge.gateway.dialects.memo import HistoryMemo, Resume
from openforge.types import SamplingParams

DialectName = Literal["chat", "completions", "responses", "messages"]

KEEPALIVE_FRAME = b": keep-alive\n\n"
"""An SSE comment line; clients ignore it, proxies and idle timers see traffic."""

# Streams split each text into at most this many deltas: enough to exercise a client's
# accumulation logic, few enough to keep the per-call CPU cost of framing small.
MAX_DELTAS = 4


class DialectError(Exception):
    """A request the dialect cannot accept; the gateway answers `status` with `error()`."""

    def __init__(
        self, message: str, status: int = 400, error_type: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type


class Dialect(ABC):
    """One wire API: request parsing, response building, SSE framing, error bodies."""

    name: ClassVar[DialectName]
    paths: ClassVar[tuple[str, ...]]
    """The routes this dialect answers, under `/v1` (and `/s/{token}/v1`)."""
    id_prefix: ClassVar[str]
    """The provider's response-id shape (`chatcmpl-`, `msg_`...): clients that inspect ids
    see familiar values."""
    count_tokens_path: ClassVar[str | None] = None
    """A route that counts a request's prompt tokens without generating, if the API has one."""

    @abstractmethod
    def parse(self, body: Any, *, memo: HistoryMemo | None = None) -> ChatRequest:
        """The canonical request for a decoded JSON body; `DialectError` when malformed.

        `memo` is the session's `HistoryMemo`: the leading history items identical to the
        session's last request reuse their parsed messages (same result, less work).
        """

    @abstractmethod
    def response(
        self,
        completion: Completion,
        *,
        response_id: str,
        model: str,
        created: int,
        request: ChatRequest | None = None,
    ) -> dict[str, Any]:
        """The non-streaming wire response body.

        `request` is the `ChatRequest` that `parse` returned; dialects read request options
        from it (chat's `include_usage`, the sampling values a Responses object echoes).
        """

    @abstractmethod
    def stream(
        self,
        completion: Completion,
        *,
        response_id: str,
        model: str,
        created: int,
        request: ChatRequest | None = None,
    ) -> Iterator[bytes]:
        """Every SSE frame of the streamed response, terminator included (see `response`)."""

    @abstractmethod
    def error(self, status: int, message: str, error_type: str = "") -> dict[str, Any]:
        """The dialect's error body. An empty `error_type` is derived from `status`."""

    def error_stream_frame(self, status: int, message: str, error_type: str = "") -> bytes:
        """One SSE frame reporting an error after the stream has started."""
        return sse_data(self.error(status, message, error_type))

    def context_error(self, message: str, prompt_tokens: int, limit: int) -> dict[str, Any]:
        """The 400 body for a prompt beyond the context window, in the form this API's
        clients recognise (OpenAI's `context_length_exceeded` code by default)."""
        body = self.error(400, message, "invalid_request_error")
        if isinstance(body.get("error"), dict):
            body["error"]["code"] = "context_length_exceeded"
        return body

    def history_message(self, completion: Completion) -> Message:
        """The assistant message a client sends back, in its next request's history, for
        `completion` as this dialect answered it: how the response extends the conversation.

        The token cache fingerprints it to recognise the next request as a continuation.
        """
        return completion.message

    def parse_count_tokens(self, body: Any) -> ChatRequest:
        """The request of a `count_tokens_path` body (dialects that have that route)."""
        raise DialectError(f"the {self.name} API has no token-counting route", 404,
                           "not_found_error")

    def count_tokens_response(self, input_tokens: int) -> dict[str, Any]:
        """The body answering a `count_tokens_path` request."""
        return {"input_tokens": input_tokens}


# --- SSE framing -------------------------------------------------------------------------


# Built once: `json.dumps` with options constructs a new encoder on every call, a
# measurable share of the cost of a stream's many small frames.
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_ENCODE_ASCII = json.JSONEncoder(separators=(",", ":")).encode


def dumps(value: Any) -> str:
    """Compact JSON; non-ASCII kept as is (smaller frames, same meaning)."""
    return _ENCODE(value)


def dumps_bytes(value: Any) -> bytes:
    """Compact JSON as UTF-8; falls back to ASCII escapes for unencodable text."""
    try:
        return _ENCODE(value).encode()
    except UnicodeEncodeError:
        return _ENCODE_ASCII(value).encode()


def sse_data(payload: Any) -> bytes:
    """A `data:`-only frame (OpenAI chat / completions)."""
    return b"data: " + dumps_bytes(payload) + b"\n\n"


def sse_event(event: str, payload: Any) -> bytes:
    """A named frame (`event:` + `data:`), as Responses and Anthropic Messages send."""
    return b"event: " + event.encode() + b"\ndata: " + dumps_bytes(payload) + b"\n\n"


def split_deltas(text: str, parts: int = MAX_DELTAS) -> list[str]:
    """`text` cut into at most `parts` non-empty pieces that concatenate back to it."""
    if not text:
        return []
    size = max(1, math.ceil(len(text) / parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


# --- finish reasons and ids ---------------------------------------------------------------


def finish_reason(completion: Completion) -> Literal["stop", "length", "tool_calls"]:
    """The finish reason a client should act on.

    A truncated generation stays `length`; otherwise tool calls in the message win, since
    harnesses only run tools when the finish reason says so.
    """
    if completion.finish_reason == "length":
        return "length"
    if completion.message.tool_calls:
        return "tool_calls"
    return "stop"


def id_suffix(response_id: str) -> str:
    """The random part of `resp_abc` / `chatcmpl-abc`, to derive item ids from."""
    for sep in ("_", "-"):
        if sep in response_id:
            return response_id.split(sep, 1)[1] or response_id
    return response_id


# --- request decoding ----------------------------------------------------------------------

# A JSON `\uD800`-`\uDFFF` escape, or a surrogate encoded as UTF-8 bytes (json.loads
# decodes with "surrogatepass"): only then can json.loads produce a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_SCAN_RAW_BYTES = 64 * 1024
"""Bodies up to this size are scanned for surrogates as bytes; larger ones are checked by
their decoded strings (an ASCII string, the usual bulk of a large body, is one flag to
read): scanning megabytes of bytes would hold the GIL against every other session."""
MAX_NESTING = 64
"""Deepest JSON nesting kept verbatim (tool schemas, tool-call arguments)."""


def load_json(raw: bytes) -> Any:
    """Decode a request body, with a `DialectError` for anything that is not clean JSON.

    Lone UTF-16 surrogates (legal as JSON escapes) are rejected here because no tokenizer
    or UTF-8 encoder downstream can take them.
    """
    if not raw.strip():
        raise DialectError("the request body is empty; send a JSON object")
    try:
        value = json_process.loads(raw)
    except UnicodeDecodeError:
        raise DialectError("the request body is not valid UTF-8") from None
    except json.JSONDecodeError as err:
        raise DialectError(f"the request body is not valid JSON: {err.msg} at position "
                           f"{err.pos}") from None
    except RecursionError:
        raise DialectError("the request body is nested too deeply") from None
    except ValueError as err:  # e.g. an integer literal beyond Python's digit limit
        raise DialectError(f"the request body is not valid JSON: {err}") from None
    if len(raw) > _SCAN_RAW_BYTES:
        lone = _has_surrogate(value)
    else:
        # A fast scan first: the regex only when the body has a \uD... escape at all.
        lone = ((b"\\ud" in raw or b"\\uD" in raw or b"\xed" in raw)
                and _SURROGATE_ESCAPE.search(raw) is not None and _has_surrogate(value))
    if lone:
        raise DialectError("the request body contains an unpaired UTF-16 surrogate escape")
    return value


def _has_surrogate(value: Any) -> bool:
    """Whether a string in the decoded `value` holds a lone surrogate (json.loads pairs
    the others into one character)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def check_depth(value: Any, field: str, limit: int = MAX_NESTING) -> None:
    """Reject nesting deeper than `limit` in a value kept verbatim (serializers have limits)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(
            item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > limit:
                    raise DialectError(f"'{field}' is nested more than {limit} levels deep")
                stack.append((child, depth + 1))


# --- request field readers ----------------------------------------------------------------
#
# Each reader returns the value or raises a DialectError naming the field, so the dialect
# parsers read like the wire schema they implement.


def type_name(value: Any) -> str:
    """The JSON type name of a decoded value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def bad_type(field: str, expected: str, value: Any) -> DialectError:
    return DialectError(f"'{field}' must be {expected}, got {type_name(value)}")


def require_object(body: Any, what: str = "request body") -> dict[str, Any]:
    if not isinstance(body, dict):
        raise DialectError(f"the {what} must be a JSON object, got {type_name(body)}")
    return body


def _typed(value: Any, field: str, kind: type, expected: str) -> Any:
    """`value` unchanged when it is null or of `kind`; else a 400 naming the field."""
    if value is not None and not isinstance(value, kind):
        raise bad_type(field, expected, value)
    return value


def opt_str(obj: Mapping[str, Any], key: str, field: str | None = None) -> str | None:
    return _typed(obj.get(key), field or key, str, "a string")


def req_str(obj: Mapping[str, Any], key: str, field: str | None = None) -> str:
    value = opt_str(obj, key, field)
    if value is None:
        raise DialectError(f"'{field or key}' is required")
    return value


def opt_bool(obj: Mapping[str, Any], key: str, field: str | None = None) -> bool | None:
    return _typed(obj.get(key), field or key, bool, "a boolean")


def opt_int(obj: Mapping[str, Any], key: str, field: str | None = None) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    # JSON has one number type; 16.0 is a fine integer, 16.5 is not.
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_type(field or key, "an integer", value)
    return value


def opt_number(obj: Mapping[str, Any], key: str, field: str | None = None) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_type(field or key, "a number", value)
    number = float(value)
    if not math.isfinite(number):
        raise DialectError(f"'{field or key}' must be a finite number")
    return number


def opt_list(obj: Mapping[str, Any], key: str, field: str | None = None) -> list[Any] | None:
    return _typed(obj.get(key), field or key, list, "an array")


def as_list(value: Any, field: str) -> list[Any]:
    """`value` as an array; null counts as empty."""
    return _typed(value, field, list, "an array") or []


def opt_object(
    obj: Mapping[str, Any], key: str, field: str | None = None
) -> dict[str, Any] | None:
    return _typed(obj.get(key), field or key, dict, "an object")


def read_stop(obj: Mapping[str, Any], key: str) -> list[str] | None:
    """`stop`: one string or a list of strings."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return [s for s in value if s]
    raise bad_type(key, "a string or an array of strings", value)


def read_sampling(
    body: Mapping[str, Any],
    *,
    max_tokens_keys: tuple[str, ...],
    stop_key: str | None = "stop",
    default_max_tokens: int | None = None,
) -> SamplingParams:
    """Sampling parameters from the request.

    Only the fields the request sets are passed to `SamplingParams`, so
    `sampling.model_fields_set` tells the gateway which ones to fill from the session.
    `max_tokens_keys` are tried in order (chat prefers `max_completion_tokens`).
    """
    values: dict[str, Any] = {}
    temperature = opt_number(body, "temperature")
    if temperature is not None:
        if temperature < 0:
            raise DialectError("'temperature' must be >= 0")
        values["temperature"] = temperature
    top_p = opt_number(body, "top_p")
    if top_p is not None:
        if not 0 < top_p <= 1:
            raise DialectError("'top_p' must be in (0, 1]")
        values["top_p"] = top_p
    for key in max_tokens_keys:
        max_tokens = opt_int(body, key)
        if max_tokens is not None:
            if max_tokens < 1:
                raise DialectError(f"'{key}' must be >= 1")
            values["max_tokens"] = max_tokens
            break
    else:
        if default_max_tokens is not None:
            values["max_tokens"] = default_max_tokens
    if stop_key is not None:
        stop = read_stop(body, stop_key)
        if stop is not None:
            values["stop"] = stop
    seed = opt_int(body, "seed")
    if seed is not None:
        if not -2**63 <= seed < 2**64:
            raise DialectError("'seed' must be a 64-bit integer (-2^63 <= seed < 2^64)")
        values["seed"] = seed
    return SamplingParams(**values)


def tool_arguments(value: Any, field: str) -> str:
    """Tool-call arguments as JSON text; an already-decoded object is encoded."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        check_depth(value, field)
        return dumps(value)
    raise bad_type(field, "a JSON string or an object", value)


def read_parts(
    value: Any,
    field: str,
    *,
    text_types: Collection[str],
    image_type: str,
    read_image: Callable[[dict[str, Any], str], ImageRef | None],
) -> tuple[str, list[ImageRef]]:
    """Text and images of a `content` that is a string, null, or a list of typed parts.

    Text parts (`type` in `text_types`, text under `text`) are joined with newlines;
    `read_image(part, where)` reads an `image_type` part (None: an image the gateway cannot
    resolve, skipped); parts of other types are skipped.
    """
    if value is None:
        return "", []
    if isinstance(value, str):
        return value, []
    texts: list[str] = []
    images: list[ImageRef] = []
    for i, raw in enumerate(as_list(value, field)):
        where = f"{field}[{i}]"
        part = require_object(raw, where)
        kind = part.get("type")
        if kind in text_types:
            texts.append(opt_str(part, "text", f"{where}.text") or "")
        elif kind == image_type:
            image = read_image(part, where)
            if image is not None:
                images.append(image)
    return "\n".join(texts), images


def read_tool(obj: dict[str, Any], where: str, schema_key: str) -> Tool:
    """A function tool from the object holding its `name`, `description` and JSON schema
    (under `schema_key`); `where` is that object's path, for error messages."""
    name = opt_str(obj, "name", f"{where}.name")
    if not name:
        raise DialectError(f"'{where}.name' is required")
    tool = Tool(name=name, description=opt_str(obj, "description", f"{where}.description") or "")
    schema = opt_object(obj, schema_key, f"{where}.{schema_key}")
    if schema is not None:
        check_depth(schema, f"{where}.{schema_key}")
        tool.parameters = schema
    return tool


def check_tool_results(parsed: Resume) -> None:
    """Every tool result must answer a tool call made earlier in the conversation.

    Only the messages parsed for this request are looked at: the reused ones passed this
    check when they were parsed, and `parsed.called` holds the calls they made (the check
    adds the new ones), so a request costs what it adds, not its whole history.
    """
    called, messages = parsed.called, parsed.messages
    for i in range(parsed.reused, len(messages)):
        msg = messages[i]
        if msg.role == "assistant":
            for c in msg.tool_calls:
                called.setdefault(c.id, i)
        elif msg.role == "tool" and msg.tool_call_id not in called:
            raise DialectError(
                f"tool result '{msg.tool_call_id}' does not match any earlier tool call"
            )



_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def default_error_type(status: int) -> str:
    """The conventional error `type` for an HTTP status (shared by OpenAI and Anthropic)."""
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def openai_usage(completion: Completion) -> dict[str, Any]:
    """The token counts of an OpenAI chat / completions `usage` object."""
    return {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }


def openai_stream_end(
    head: dict[str, Any], usage: dict[str, Any], request: ChatRequest | None
) -> Iterator[bytes]:
    """The frames after the last choice chunk of a chat / completions stream: the usage
    chunk when the request asked for it (`stream_options.include_usage`), then `[DONE]`."""
    if request is not None and request.include_usage:
        yield sse_data({**head, "choices": [], "usage": usage})
    yield b"data: [DONE]\n\n"


def openai_error(status: int, message: str, error_type: str = "") -> dict[str, Any]:
    """The OpenAI error body shared by chat, completions and Responses."""
    return {
        "error": {
            "message": message,
            "type": error_type or default_error_type(status),
            "param": None,
            "code": None,
        }
    }
