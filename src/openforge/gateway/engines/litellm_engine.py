"""The `litellm` engine: hosted providers through litellm, text in / text out.

Hosted models return text, not the ids they sampled, so the completion ids here are the
gateway's tokenization of that text and every call is flagged `exact_tokens = False`:
fine for evaluation and SFT data, not for on-policy RL. Logprobs are 0.0.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pydantic import Field

from openforge.gateway.conversation import Completion, FinishReason, Message, ToolCall
from openforge.gateway.engines.base import (
    Engine,
    EngineConfigError,
    EngineError,
    GenerateRequest,
    GenerateResult,
)
from openforge.gateway.engines.local import EngineLog, EngineLogEntry
from openforge.gateway.render import new_tool_call_id
from openforge.options import PluginOptions


class LiteLLMOptions(PluginOptions):
    """Options of the `litellm` engine (`engine.options`)."""

    litellm_model: str
    """A litellm model string, e.g. "openai/gpt-4o-mini" (the option `model` is the policy's
    tokenizer bundle, hence the name)."""
    api_base: str | None = None
    """The provider's base URL, e.g. an OpenAI-compatible server's http://HOST:PORT/v1."""
    api_key: str | None = None
    """The provider's key (default: litellm reads the provider's usual variable)."""
    timeout: float | None = None
    """Seconds per request."""
    num_retries: int | None = None
    """litellm's own retries per request."""
    completion_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Any other litellm.acompletion keyword (extra_headers, mock_response, ...), as is."""
    log_size: int = Field(default=10_000, ge=0)
    """Generations kept in the engine's in-memory log."""


def _import_litellm() -> Any:
    # litellm fetches a model price list from GitHub when imported (retrying for ~10 s
    # where that is unreachable); its bundled copy does: nothing leaves the machine but
    # the model calls themselves.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm
    except ImportError:
        raise EngineConfigError("the litellm engine needs litellm: pip install "
                                "'openforge[litellm]'") from None
    return litellm


class LiteLLMEngine(Engine):
    """Hosted providers through litellm; text only, calls flagged exact_tokens=false."""

    exact_tokens = False
    options_model = LiteLLMOptions
    options: LiteLLMOptions

    def __init__(self, model: Any = None, **options: Any) -> None:
        super().__init__(model, **options)
        self.litellm_model = self.options.litellm_model
        self._litellm = _import_litellm()
        given = self.options.model_dump(include={"api_base", "api_key", "timeout", "num_retries"},
                                        exclude_none=True)
        self._extra = {**given, **self.options.completion_kwargs}
        self.log = EngineLog(self.options.log_size)

    @property
    def weight_version(self) -> str:
        return f"litellm:{self.litellm_model}"

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        chat = request.chat
        if chat is None or chat.raw_prompt is not None or chat.raw_prompt_ids is not None:
            raise EngineError("the litellm engine serves chat requests only", 400)
        s = request.sampling
        kwargs: dict[str, Any] = {
            "model": self.litellm_model,
            "messages": [_wire_message(m) for m in chat.messages],
            "temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_tokens,
            **self._extra,
        }
        if chat.tools:
            kwargs["tools"] = [t.to_renderer() for t in chat.tools]
        if s.stop:
            kwargs["stop"] = list(s.stop)
        if s.seed is not None:
            kwargs["seed"] = s.seed
        try:
            response = await self._litellm.acompletion(**kwargs)
        except Exception as exc:  # litellm maps every provider failure to its own types
            status = getattr(exc, "status_code", None)
            code = 503 if status in (429, 503) else 502
            raise EngineError(f"litellm {self.litellm_model}: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}", code) from None
        message, finish = _read_choice(response)
        ids = self._tokenize(message)
        logprobs = [0.0] * len(ids)
        self.log.append(EngineLogEntry(
            request_id=request.request_id, session_id=request.session_id,
            prompt_ids=list(request.prompt_ids), completion_ids=ids, logprobs=logprobs,
            finish_reason=finish))
        usage = _get(response, "usage")
        completion = Completion(
            message=message, finish_reason=finish,
            prompt_tokens=int(_get(usage, "prompt_tokens") or len(request.prompt_ids)),
            completion_tokens=int(_get(usage, "completion_tokens") or len(ids)))
        return GenerateResult(completion_ids=ids, logprobs=logprobs,
                              finish_reason="length" if finish == "length" else "stop",
                              weight_version=self.weight_version, completion=completion)

    def _tokenize(self, message: Message) -> list[int]:
        """The assistant turn as the policy's template would hold it, best effort."""
        bundle = self.model
        if bundle is None:
            return []
        try:
            from openforge.gateway.render import assistant_turn_ids

            return assistant_turn_ids(bundle, [], message)
        except Exception:
            return bundle.encode(message.content) + bundle.stop_token_ids[:1]


def _get(obj: Any, key: str) -> Any:
    """litellm returns pydantic-ish objects that also act as dicts; accept both."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def _read_choice(response: Any) -> tuple[Message, FinishReason]:
    choices = _get(response, "choices") or []
    if not choices:
        raise EngineError("litellm returned no choices", 502)
    choice = choices[0]
    msg = _get(choice, "message") or {}
    calls = []
    for c in _get(msg, "tool_calls") or []:
        fn = _get(c, "function") or {}
        args = _get(fn, "arguments") or "{}"
        calls.append(ToolCall(id=_get(c, "id") or new_tool_call_id(), name=_get(fn, "name") or "",
                              arguments=args if isinstance(args, str) else json.dumps(args)))
    reasoning = _get(msg, "reasoning_content")
    message = Message(role="assistant", content=_get(msg, "content") or "",
                      reasoning=reasoning or None, tool_calls=calls)
    raw = _get(choice, "finish_reason")
    finish: FinishReason = "tool_calls" if calls else ("length" if raw == "length" else "stop")
    return message, finish


def _wire_message(m: Message) -> dict[str, Any]:
    """OpenAI chat wire shape (arguments as JSON text), which litellm translates per provider."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.images:
        out["content"] = [{"type": "image_url", "image_url": {"url": i.url}} for i in m.images]
        if m.content:
            out["content"].append({"type": "text", "text": m.content})
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}}
                             for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out
