"""OpenAI legacy completions (`POST /v1/completions`): raw text or token-id prompts.

The prompt bypasses the chat template: text goes to `ChatRequest.raw_prompt`, token ids
to `raw_prompt_ids`. Only one prompt per request (the gateway records one call per
request); `echo`, `suffix`, `logprobs` and `best_of` are accepted and ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from openforge.gateway.conversation import ChatRequest, Completion
from openforge.gateway.dialects.base import (
    Dialect,
    DialectError,
    bad_type,
    openai_error,
    openai_stream_end,
    openai_usage,
    opt_bool,
    opt_object,
    opt_str,
    read_sampling,
    require_object,
    split_deltas,
    sse_data,
)
from openforge.gateway.dialects.chat import check_n
from openforge.gateway.dialects.memo import HistoryMemo

# OpenAI's documented default for this endpoint; a harness that omits it gets 16 tokens
# here as it would there.
DEFAULT_MAX_TOKENS = 16


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def _read_prompt(value: Any) -> tuple[str | None, list[int] | None]:
    """(text, ids) of `prompt`: a string, token ids, or a batch of exactly one of either."""
    if isinstance(value, list) and len(value) == 1 and (
        isinstance(value[0], str) or _is_token_list(value[0])
    ):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise DialectError("'prompt' must not be empty")
        return value, None
    if _is_token_list(value):
        if any(t < 0 for t in value):
            raise DialectError("'prompt' token ids must be >= 0")
        return None, list(value)
    if value is None:
        raise DialectError("'prompt' is required")
    if isinstance(value, list) and len(value) > 1 and all(
        isinstance(p, str) or _is_token_list(p) for p in value
    ):
        raise DialectError("'prompt' must be a single prompt: batched prompts are not supported")
    raise bad_type("prompt", "a non-empty string or an array of token ids", value)


def _finish(completion: Completion) -> str:
    return "length" if completion.finish_reason == "length" else "stop"


class CompletionsDialect(Dialect):
    """OpenAI legacy text completions."""

    name = "completions"
    paths = ("/completions",)
    id_prefix = "cmpl-"

    def parse(self, body: Any, *, memo: HistoryMemo | None = None) -> ChatRequest:
        # A prompt is one text (or id list), not a history of items: nothing to reuse.
        body = require_object(body)
        text, ids = _read_prompt(body.get("prompt"))
        check_n(body)
        options = opt_object(body, "stream_options") or {}
        return ChatRequest.model_construct(
            model=opt_str(body, "model") or "",
            raw_prompt=text,
            raw_prompt_ids=ids,
            sampling=read_sampling(
                body, max_tokens_keys=("max_tokens",), default_max_tokens=DEFAULT_MAX_TOKENS
            ),
            stream=bool(opt_bool(body, "stream")),
            include_usage=bool(opt_bool(options, "include_usage", "stream_options.include_usage")),
        )

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
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": completion.message.content, "logprobs": None,
                         "finish_reason": _finish(completion)}],
            "usage": openai_usage(completion),
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
        head = {"id": response_id, "object": "text_completion", "created": created,
                "model": model}

        def chunk(text: str, finish: str | None = None) -> bytes:
            return sse_data({**head, "choices": [
                {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]})

        for piece in split_deltas(completion.message.content):
            yield chunk(piece)
        yield chunk("", _finish(completion))
        yield from openai_stream_end(head, openai_usage(completion), request)

    def error(self, status: int, message: str, error_type: str = "") -> dict[str, Any]:
        return openai_error(status, message, error_type)
