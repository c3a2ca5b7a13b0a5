"""The `local` engine: a transformers causal LM in this process (CPU, or one GPU).

A manual sampling loop with a KV cache, so that every generated id comes with exactly the
logprob it was sampled with (log-softmax of the temperature-scaled logits). Generation runs
in a worker thread behind a lock: one sequence at a time, the event loop stays free.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import threading
import weakref
from array import array
from typing import Any, Literal

from pydantic import Field

from openforge.gateway.engines.base import (
    Engine,
    EngineConfigError,
    EngineError,
    GenerateRequest,
    GenerateResult,
)
from openforge.options import PluginOptions
from openforge.types import SamplingParams

Finish = Literal["stop", "length"]


class EngineLogEntry:
    """What an engine saw and produced for one generate call (kept for tests and debugging).

    Ids are held as int32 arrays and logprobs as float64 arrays (exact values): a log of
    thousands of long prompts must not cost gigabytes of Python ints. The attributes read
    back as plain lists.
    """

    __slots__ = ("request_id", "session_id", "finish_reason", "_prompt", "_completion",
                 "_logprobs")

    def __init__(self, *, prompt_ids: list[int], completion_ids: list[int] | None = None,
                 logprobs: list[float] | None = None, request_id: str = "",
                 session_id: str = "", finish_reason: str = "stop") -> None:
        self.request_id = request_id
        self.session_id = session_id
        self.finish_reason = finish_reason
        self._prompt = array("i", prompt_ids)
        self._completion = array("i", completion_ids or [])
        self._logprobs = array("d", logprobs or [])

    @property
    def prompt_ids(self) -> list[int]:
        return self._prompt.tolist()

    @property
    def completion_ids(self) -> list[int]:
        return self._completion.tolist()

    @property
    def logprobs(self) -> list[float]:
        return self._logprobs.tolist()

    def __repr__(self) -> str:
        return (f"EngineLogEntry(request_id={self.request_id!r}, prompt={len(self._prompt)} ids, "
                f"completion={self.completion_ids!r}, finish={self.finish_reason!r})")


class EngineLog(collections.deque):
    """A bounded, append-only record of recent generations (oldest dropped first)."""

    def __init__(self, maxlen: int = 10_000) -> None:
        super().__init__(maxlen=maxlen)

    def record(self, request: GenerateRequest, completion_ids: list[int],
               logprobs: list[float], finish_reason: str) -> None:
        """Append the entry of one finished generation of `request`."""
        if self.maxlen == 0:
            return
        self.append(EngineLogEntry(
            request_id=request.request_id, session_id=request.session_id,
            prompt_ids=list(request.prompt_ids), completion_ids=completion_ids,
            logprobs=logprobs, finish_reason=finish_reason))


class LocalEngineOptions(PluginOptions):
    """Options of the `local` engine (`engine.options`)."""

    device: str | None = None
    """"cpu", "cuda", "cuda:1"... (default: cuda when available)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The weights' dtype."""
    log_size: int = Field(default=10_000, ge=0)
    """Generations kept in the engine's in-memory log (tests read it)."""


class LocalEngine(Engine):
    """Generate with a transformers model loaded from the bundle's folder."""

    options_model = LocalEngineOptions
    options: LocalEngineOptions

    def __init__(self, model: Any = None, **options: Any) -> None:
        super().__init__(model, **options)
        if model is None or getattr(model, "path", None) is None:
            raise EngineConfigError("the local engine needs a model bundle (e.g. --model tiny)")
        self.log = EngineLog(self.options.log_size)
        self._version = 0
        self._model_lock = threading.Lock()
        # One asyncio lock per event loop: tests and stand-ins drive one engine from several.
        self._locks: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()
        self._lm, self._device = self._load(self.options)

    def _load(self, options: LocalEngineOptions) -> tuple[Any, Any]:
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        # Progress bars and deprecation notes from transformers would garble the run's
        # progress display; errors still show.
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = getattr(torch, options.dtype)
        try:
            lm: Any = AutoModelForCausalLM.from_pretrained(str(self.model.path), dtype=dtype)
        except Exception as exc:
            raise EngineConfigError(
                f"local engine: cannot load a causal LM from {self.model.path} "
                f"({type(exc).__name__})") from None
        lm = lm.to(device).eval()
        # transformers 5.2x renamed past_key_values to cache; support both spellings.
        params = inspect.signature(lm.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        # Only the last position's logits are needed: a 150k vocabulary times a long
        # prompt would otherwise cost hundreds of MB per prefill.
        self._keep_last = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        return lm, torch.device(device)

    @property
    def weight_version(self) -> str:
        return str(self._version)

    def load_state_dict(self, state_dict: dict[str, Any], version: str | int | None = None) -> str:
        """Swap in new weights (from a trainer) and bump `weight_version`; returns it."""
        with self._model_lock:
            self._lm.load_state_dict(state_dict)
            self._version = int(version) if version is not None else self._version + 1
        return self.weight_version

    set_weights = load_state_dict

    @property
    def torch_model(self) -> Any:
        """The underlying transformers model (the local trainer shares it)."""
        return self._lm

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if not request.prompt_ids:
            raise EngineError("empty prompt", 400)
        if request.chat is not None and any(m.images for m in request.chat.messages):
            # Its decoding loop feeds token ids only; image placeholders without their pixels
            # would be generated from garbage. Say so instead.
            raise EngineError("the local engine runs text-only decoding; serve image requests "
                              "with the vllm engine (or scripted, for tests)", 400)
        stop_ids = request.stop_token_ids or list(getattr(self.model, "stop_token_ids", []))
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        cancelled = threading.Event()
        async with lock:
            try:
                ids, logprobs, finish = await asyncio.to_thread(
                    self._generate_sync, list(request.prompt_ids), request.sampling, stop_ids,
                    cancelled)
            except asyncio.CancelledError:
                # The client went away: stop the worker thread at its next token instead of
                # letting it run to max_tokens while holding the model.
                cancelled.set()
                raise
        self.log.record(request, ids, logprobs, finish)
        return GenerateResult(completion_ids=ids, logprobs=logprobs, finish_reason=finish,
                              weight_version=self.weight_version)

    def _generate_sync(self, prompt_ids: list[int], sampling: SamplingParams,
                       stop_ids: list[int], cancelled: threading.Event | None = None,
                       ) -> tuple[list[int], list[float], Finish]:
        import torch

        limit = getattr(self._lm.config, "max_position_embeddings", None)
        if limit is not None and len(prompt_ids) >= limit:
            raise EngineError(
                f"prompt of {len(prompt_ids)} tokens exceeds the model's context of {limit}", 400)
        max_new = sampling.max_tokens
        if limit is not None:
            max_new = min(max_new, limit - len(prompt_ids))
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator(device=self._device).manual_seed(sampling.seed)
        stops = set(stop_ids)
        out_ids: list[int] = []
        logprobs: list[float] = []
        finish: Finish = "length"
        with self._model_lock, torch.inference_mode():
            step_input = torch.tensor([prompt_ids], device=self._device)
            past = None
            for _ in range(max(0, max_new)):
                if cancelled is not None and cancelled.is_set():
                    break
                out = self._lm(input_ids=step_input, use_cache=True, **self._keep_last,
                               **{self._cache_arg: past})
                past = out.get("cache", out.get("past_key_values"))
                token, logprob = _sample(out.logits[0, -1].float(), sampling, generator)
                out_ids.append(token)
                logprobs.append(logprob)
                if token in stops or _hits_stop_string(self.model, out_ids, sampling.stop):
                    finish = "stop"
                    break
                step_input = torch.tensor([[token]], device=self._device)
        return out_ids, logprobs, finish

    async def close(self) -> None:
        self._lm = None


def _sample(logits: Any, sampling: SamplingParams, generator: Any) -> tuple[int, float]:
    """One token from `logits`, and its log-probability under the temperature-scaled softmax.

    Temperature 0 is greedy (its logprob is that of the unscaled distribution). top_p
    restricts *which* tokens may be drawn; the reported logprob stays that of the
    temperature-scaled distribution, as vLLM's processed logprobs before top-p.
    """
    import torch

    if sampling.temperature <= 0:
        logp = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logits))
        return token, float(logp[token])
    logp = torch.log_softmax(logits / sampling.temperature, dim=-1)
    probs = logp.exp()
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < sampling.top_p
        keep[0] = True  # at least the most likely token survives any top_p
        filtered = torch.zeros_like(probs)
        filtered[order[keep]] = sorted_p[keep]
        probs = filtered
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logp[token])


def _hits_stop_string(bundle: Any, ids: list[int], stops: list[str]) -> bool:
    if not stops:
        return False
    tail = bundle.decode(ids[-16:])
    return any(s and s in tail for s in stops)
