"""The Engine plugin kind: prompt token ids in, completion token ids and logprobs out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from openforge.errors import OpenforgeError
from openforge.gateway.conversation import ChatRequest, Completion
from openforge.options import Plugin
from openforge.types import SamplingParams


class EngineError(Exception):
    """The engine is down or failed; the gateway answers 502/503 and records a failed call."""

    def __init__(self, message: str, status_code: int = 502):
        super().__init__(message)
        self.status_code = status_code


class EngineBusy(EngineError):
    """The engine cannot serve now but will shortly (its weights are being replaced): the
    gateway answers 429 with `Retry-After`, which harnesses' SDKs wait out and retry."""

    def __init__(self, message: str, retry_after_s: int = 2):
        super().__init__(message, 429)
        self.retry_after_s = retry_after_s


class EngineConfigError(OpenforgeError):
    """The engine cannot be built from the given options (missing file, bad URL...)."""


class GenerateRequest(BaseModel):
    """One generation. `chat` is the parsed request, for text-only engines and scripts.

    `prompt_ids` is a sequence of ints: from the gateway, the int32 `array` its session
    keeps (building a list of a long prompt's ids on every call would cost more than
    sending them); `list(request.prompt_ids)` where a list is needed.

    `prompt_json`, when set, is `prompt_ids` as a compact JSON array (`[1,2,3]`): the
    gateway keeps it per branch and extends it by the new ids only, so an engine that sends
    the prompt as JSON need not encode thousands of ids again on every call.
    """

    prompt_ids: Sequence[int]
    prompt_json: str | None = None
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    stop_token_ids: list[int] = Field(default_factory=list)
    session_id: str = ""
    request_id: str = ""
    chat: ChatRequest | None = None


class GenerateResult(BaseModel):
    """What the engine produced: exactly one logprob per completion id.

    Text-only engines (`exact_tokens = False`) also return `completion` (the parsed answer);
    their ids are the gateway's tokenization of that text.
    """

    completion_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    finish_reason: Literal["stop", "length"] = "stop"
    weight_version: str | None = None
    completion: Completion | None = None


class Engine(Plugin, ABC):
    """Base class of engine plugins.

    The factory is called as `factory(model=ModelBundle, **options)`; `model` holds the
    tokenizer and renderer the gateway uses for this policy, so engines that need to
    tokenize (scripted, litellm) tokenize exactly as the gateway does.
    """

    exact_tokens: ClassVar[bool] = True
    kind = "engine"

    def __init__(self, model: Any = None, **options: Any) -> None:
        super().__init__(**options)
        self.model = model

    @abstractmethod
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate a completion. Raise `EngineError` when the engine is down or failed."""

    async def close(self) -> None:
        """Release connections, servers, models."""

    @property
    def weight_version(self) -> str | None:
        return None
