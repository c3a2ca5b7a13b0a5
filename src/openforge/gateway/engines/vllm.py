"""The `vllm` engine: token in / token out over HTTP to a vLLM server.

Two of vLLM's endpoints take prompt token ids and return generated ids with logprobs:
`POST /inference/v1/generate` (`api: generate`, reports `weight_versions`) and
`POST /v1/completions` with a token-id prompt and `return_token_ids` (`api: completions`).
The gateway renders the prompt itself; vLLM never applies a chat template here.
aiohttp, not httpx: at gateway loads the client's CPU cost dominates (REFERENCE 2b).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from openforge.gateway import json_process
from openforge.gateway.engines.base import (
    Engine,
    EngineConfigError,
    EngineError,
    GenerateRequest,
    GenerateResult,
)
from openforge.gateway.engines.local import EngineLog, Finish
from openforge.options import PluginOptions

_encode = json.JSONEncoder(separators=(",", ":")).encode


class VLLMOptions(PluginOptions):
    """Options of the `vllm` engine (`engine.options`; `--vllm-url` sets `url`)."""

    url: str | None = None
    """The vLLM server's root, http://HOST:PORT (required)."""
    api: Literal["generate", "completions"] = "generate"
    """Token in / token out through /inference/v1/generate, or /v1/completions with prompt ids."""
    served_model: str | None = None
    """Model name for /v1/completions (default: the server's first model)."""
    api_key: str | None = None
    """Sent as a Bearer token."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Seconds per request."""
    log_size: int = Field(default=0, ge=0)
    """Generations kept in `self.log`, for tests and debugging (0: the store is the record)."""


class VLLMEngine(Engine):
    """A vLLM server, token in / token out over HTTP."""

    options_model = VLLMOptions
    options: VLLMOptions

    def __init__(self, model: Any = None, **options: Any) -> None:
        super().__init__(model, **options)
        url = self.options.url
        if not url or not url.startswith(("http://", "https://")):
            raise EngineConfigError(
                f"the vllm engine needs url=http://HOST:PORT (the vLLM server), got {url!r}")
        self.url = url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        self.api = self.options.api
        self.served_model: str | None = self.options.served_model
        self.timeout_s = self.options.timeout_s
        self._headers = {"Content-Type": "application/json"}
        if self.options.api_key:
            self._headers["Authorization"] = f"Bearer {self.options.api_key}"
        self._session: Any = None
        self._urls: dict[str, Any] = {}
        self._version: str | None = None
        self.log = EngineLog(self.options.log_size)

    @property
    def weight_version(self) -> str | None:
        return self._version

    async def _client(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def _post(self, path: str, body: dict[str, Any], prompt_key: str,
                    prompt_json: str, *, echoed: bool = False) -> dict[str, Any]:
        # The prompt's JSON text goes in as given: encoding its ids again would cost more
        # than the rest of the request.
        head = _encode(body)
        data = f'{head[:-1]},"{prompt_key}":{prompt_json}}}'.encode()
        return await self._request("POST", path, data, prompt_json if echoed else None)

    async def _request(self, method: str, path: str, data: bytes | None = None,
                       echo: str | None = None) -> dict[str, Any]:
        import aiohttp
        import yarl

        session = await self._client()
        url = self._urls.get(path)
        if url is None:
            # Parsed once: aiohttp parses (and IDNA-encodes) a string URL on every request.
            url = self._urls[path] = yarl.URL(self.url + path)
        try:
            async with session.request(method, url, data=data) as resp:
                text = await resp.text()
                if resp.status >= 500:
                    raise EngineError(f"vLLM {path} answered {resp.status}: {text[:200]}",
                                      503 if resp.status == 503 else 502)
                if resp.status >= 400:
                    # A request vLLM rejects (prompt too long, bad params): pass the 4xx on.
                    raise EngineError(f"vLLM {path} rejected the request ({resp.status}): "
                                      f"{text[:200]}", resp.status)
                if echo is not None:
                    text = without_prompt_echo(text, echo)
                try:
                    data = json_process.parse(text)
                except ValueError:
                    raise EngineError(f"vLLM {path} answered non-JSON: {text[:100]!r}",
                                      502) from None
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise EngineError(f"vLLM at {self.url} unreachable: {type(exc).__name__}: {exc}",
                              503) from None
        except aiohttp.ClientError as exc:
            raise EngineError(f"vLLM at {self.url} failed: {type(exc).__name__}: {exc}",
                              502) from None
        if not isinstance(data, dict):
            raise EngineError(f"vLLM {path} answered {type(data).__name__}, not an object", 502)
        return data

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        s = request.sampling
        sampling: dict[str, Any] = {
            "max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p,
            "stop_token_ids": list(request.stop_token_ids), "skip_special_tokens": False,
        }
        if s.seed is not None:
            sampling["seed"] = s.seed
        if s.stop:
            sampling["stop"] = list(s.stop)
        prompt_json = request.prompt_json or _encode(list(request.prompt_ids))
        if self.api == "generate":
            body: dict[str, Any] = {"sampling_params": {**sampling, "logprobs": 0}}
            if request.request_id:
                body["request_id"] = request.request_id
            data = await self._post("/inference/v1/generate", body, "token_ids", prompt_json)
            ids, logprobs, finish = _read_generate(data)
            self._version = _version_of(data.get("weight_versions")) or self._version
        else:
            body = {"model": await self._model_name(), **sampling, "logprobs": 1,
                    "return_token_ids": True}
            data = await self._post("/v1/completions", body, "prompt", prompt_json,
                                    echoed=True)  # return_token_ids echoes the prompt
            ids, logprobs, finish = _read_completions(data)
            self._version = _version_of(data.get("weight_versions")) or self._version
        self.log.record(request, ids, logprobs, finish)
        # model_construct: the readers above built typed lists already.
        return GenerateResult.model_construct(completion_ids=ids, logprobs=logprobs,
                                              finish_reason=finish, completion=None,
                                              weight_version=self._version)

    async def _model_name(self) -> str:
        if self.served_model is None:
            data = await self._request("GET", "/v1/models")
            models = data.get("data") or []
            if not models or not isinstance(models[0], dict) or "id" not in models[0]:
                raise EngineError(f"vLLM at {self.url} lists no models", 502)
            self.served_model = str(models[0]["id"])
        return self.served_model

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


_ECHO_KEY = '"prompt_token_ids":'


def without_prompt_echo(text: str, prompt_json: str) -> str:
    """`text`, vLLM's answer, with the prompt's ids it echoes (`return_token_ids` returns
    `prompt_token_ids` with the generated `token_ids`) replaced by `null`, where they are
    exactly `prompt_json`, the compact JSON array sent (vLLM answers compact JSON).

    The gateway has those ids already; decoding them again would cost more than the rest
    of the call as the prompt grows (about 0.3 ms of CPU for 11k ids), for every call.
    The key matches only as a key: inside a JSON string its quotes are escaped. An echo
    that differs from what was sent is left as it is.
    """
    at = text.find(_ECHO_KEY)
    while at >= 0:
        start = at + len(_ECHO_KEY)
        if text.startswith(prompt_json, start):
            return f"{text[:start]}null{text[start + len(prompt_json):]}"
        at = text.find(_ECHO_KEY, start)
    return text


def _finish(value: Any) -> Finish:
    return "length" if value == "length" else "stop"


def _read_generate(data: dict[str, Any]) -> tuple[list[int], list[float], Finish]:
    try:
        choice = data["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        content = (choice.get("logprobs") or {}).get("content") or []
        logprobs = [float(c["logprob"]) for c in content]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise EngineError(f"vLLM generate response is malformed ({type(exc).__name__}: {exc})",
                          502) from None
    _check_aligned(ids, logprobs)
    return ids, logprobs, _finish(choice.get("finish_reason"))


def _read_completions(data: dict[str, Any]) -> tuple[list[int], list[float], Finish]:
    try:
        choice = data["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        lp = choice.get("logprobs") or {}
        logprobs = [float(x if x is not None else 0.0) for x in lp.get("token_logprobs") or []]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise EngineError(f"vLLM completions response is malformed "
                          f"({type(exc).__name__}: {exc}); is return_token_ids supported?",
                          502) from None
    _check_aligned(ids, logprobs)
    return ids, logprobs, _finish(choice.get("finish_reason"))


def _check_aligned(ids: list[int], logprobs: list[float]) -> None:
    if len(ids) != len(logprobs):
        raise EngineError(f"vLLM returned {len(ids)} token ids but {len(logprobs)} logprobs", 502)


def _version_of(value: Any) -> str | None:
    """vLLM reports weight versions as a string, a list (one per worker) or a mapping."""
    if value is None or value == [] or value == {}:
        return None
    if isinstance(value, list):
        distinct = sorted({str(v) for v in value})
        return distinct[0] if len(distinct) == 1 else ",".join(distinct)
    if isinstance(value, dict):
        return _version_of(list(value.values()))
    return str(value)
