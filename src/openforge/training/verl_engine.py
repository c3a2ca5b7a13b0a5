"""The gateway engine that generates through veRL's `LLMServerClient` (inside veRL training).

veRL hands every agent loop a `server_manager` with
`await generate(request_id, *, prompt_ids, sampling_params) -> TokenOutput` (token ids in,
token ids + logprobs out, sticky per `request_id`). `VerlEngine` puts that behind openforge's
`Engine` protocol, so an unmodified harness talks to the recording gateway and the gateway's
tokens come from veRL's rollout replicas (vLLM / SGLang) with the current weights.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from openforge.gateway.engines.base import (
    Engine,
    EngineBusy,
    EngineError,
    GenerateRequest,
    GenerateResult,
)
from openforge.options import PluginOptions


class VerlEngineOptions(PluginOptions):
    """Options of the `verl` engine (built by the veRL agent loop)."""

    retry_after_s: int = Field(default=2, ge=0)
    """Retry-After of the 429 answered while veRL replaces the rollout weights."""


class VerlEngine(Engine):
    """An engine over an `LLMServerClient`-compatible object (veRL's, or a stand-in in tests).

    The gateway session id is the sticky request id: every call of one rollout goes to the
    same replica, whose prefix cache then holds the conversation. The policy version of each
    call is veRL's `global_steps` (from `TokenOutput.extra_fields`); the smallest and largest
    seen are kept per session for the agent loop's `min_global_steps` / `max_global_steps`.
    """

    options_model = VerlEngineOptions
    options: VerlEngineOptions

    def __init__(self, model: Any = None, client: Any = None, **options: Any) -> None:
        super().__init__(model, **options)
        if client is None:
            raise EngineError("the verl engine needs veRL's LLMServerClient (it runs inside "
                              "veRL's agent loop, not from `openforge run`)", 500)
        self.client = client
        self.retry_after_s = self.options.retry_after_s
        self.steps_seen: dict[str, list[int]] = {}

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        sampling = request.sampling
        params: dict[str, Any] = {"temperature": sampling.temperature, "top_p": sampling.top_p,
                                  "max_tokens": sampling.max_tokens, "logprobs": True}
        stops = request.stop_token_ids or list(getattr(self.model, "stop_token_ids", []) or [])
        if stops:
            params["stop_token_ids"] = stops
        if sampling.seed is not None:
            params["seed"] = sampling.seed
        extra: dict[str, Any] = {}
        images = [ref.data for m in (request.chat.messages if request.chat else [])
                  for ref in m.images if ref.data is not None]
        if images:
            # The prompt ids already hold each image's expanded placeholders (rendered with
            # the model's processor); veRL's server passes the pixels to vLLM with them.
            extra["image_data"] = [_pil_image(data) for data in images]
        try:
            out = await self.client.generate(request_id=request.session_id or request.request_id,
                                             prompt_ids=list(request.prompt_ids),
                                             sampling_params=params, **extra)
        except Exception as exc:  # a replica that died or was aborted: a failed call, not a crash
            raise EngineError(f"veRL rollout server failed: {type(exc).__name__}: {exc}") from None
        if getattr(out, "stop_reason", None) == "aborted":
            # veRL's async trainers abort in-flight generations to sync weights; the partial
            # turn came from two policies, so it is not kept: the harness waits and retries.
            raise EngineBusy("veRL is updating the rollout weights", self.retry_after_s)
        ids = list(out.token_ids)
        logprobs = list(out.log_probs or [])
        if len(logprobs) != len(ids):
            raise EngineError(f"veRL returned {len(logprobs)} logprobs for {len(ids)} tokens; "
                              "enable rollout logprobs (calculate_log_probs=true)")
        extra = dict(getattr(out, "extra_fields", None) or {})
        version = extra.get("global_steps", extra.get("max_global_steps"))
        if version is not None and request.session_id:
            self.steps_seen.setdefault(request.session_id, []).append(int(version))
        stopped = bool(ids) and ids[-1] in stops
        completed = getattr(out, "stop_reason", None) == "completed" and len(ids) < sampling.max_tokens
        finish: Literal["stop", "length"] = "stop" if stopped or completed else "length"
        return GenerateResult(completion_ids=ids, logprobs=logprobs, finish_reason=finish,
                              weight_version=None if version is None else str(version))

    def global_steps(self, session_id: str, default: int = 0) -> tuple[int, int]:
        """(min, max) policy version that served `session_id`'s calls."""
        seen = self.steps_seen.pop(session_id, None)
        return (min(seen), max(seen)) if seen else (default, default)


def _pil_image(data: bytes) -> Any:
    from io import BytesIO

    from PIL import Image

    return Image.open(BytesIO(data)).convert("RGB")
