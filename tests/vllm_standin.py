"""A small real HTTP server speaking vLLM's token-in / token-out endpoints.

No vLLM runs on these machines' test budget, so tests of the `vllm` engine talk to this
stand-in: starlette + uvicorn on a free 127.0.0.1 port, in a thread, generating with the
tiny local model. It implements the documented request and response fields only:

- `POST /inference/v1/generate {token_ids, sampling_params{max_tokens, temperature, top_p,
  seed, stop_token_ids, logprobs}}` -> `{choices[0]{token_ids, logprobs.content[i]{token_id,
  logprob}, finish_reason}, weight_versions}`
- `POST /v1/completions {model, prompt: [ids], max_tokens, ..., logprobs, return_token_ids}`
  -> `{choices[0]{text, token_ids, prompt_token_ids, logprobs{tokens, token_logprobs},
  finish_reason}, usage}`
- `GET /v1/models`, `GET /health`

`fail_next` makes the next generate answer 500 (to test the engine's error path).
The same engine tests run against a real vLLM when OPENFORGE_VLLM_URL is set.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from openforge.gateway.engines.base import EngineError, GenerateRequest
from openforge.types import SamplingParams

SERVED_MODEL = "tiny-qwen3"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VLLMStandIn:
    """Serves a LocalEngine (or any Engine) over vLLM's token endpoints."""

    def __init__(self, engine: Any, bundle: Any) -> None:
        self.engine = engine
        self.bundle = bundle
        self.fail_next = 0
        self.requests: list[dict[str, Any]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.app = Starlette(routes=[
            Route("/inference/v1/generate", self.generate, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
        ])

    # -- endpoints -------------------------------------------------------------------------

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({})

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": SERVED_MODEL, "object": "model", "owned_by": "vllm"}]})

    async def _body(self, request: Request) -> dict[str, Any] | JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "invalid JSON")
        if not isinstance(body, dict):
            return _error(400, "body must be an object")
        self.requests.append(body)
        if self.fail_next > 0:
            self.fail_next -= 1
            return _error(500, "injected failure")
        return body

    async def _run(self, ids: Any, params: dict[str, Any]) -> Any:
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            return _error(400, "prompt must be a non-empty list of token ids")
        sampling = SamplingParams(
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            max_tokens=int(params.get("max_tokens") or 16), seed=params.get("seed"),
            stop=list(params.get("stop") or []))
        try:
            return await self.engine.generate(GenerateRequest(
                prompt_ids=ids, sampling=sampling,
                stop_token_ids=list(params.get("stop_token_ids") or [])))
        except EngineError as exc:
            return _error(exc.status_code, str(exc))

    async def generate(self, request: Request) -> JSONResponse:
        body = await self._body(request)
        if isinstance(body, JSONResponse):
            return body
        result = await self._run(body.get("token_ids"), body.get("sampling_params") or {})
        if isinstance(result, JSONResponse):
            return result
        return JSONResponse({
            "request_id": body.get("request_id", ""),
            "choices": [{
                "index": 0, "token_ids": result.completion_ids,
                "logprobs": {"content": [{"token_id": t, "logprob": lp} for t, lp in
                                         zip(result.completion_ids, result.logprobs, strict=True)]},
                "finish_reason": result.finish_reason,
            }],
            "weight_versions": [self.engine.weight_version],
        })

    async def completions(self, request: Request) -> JSONResponse:
        body = await self._body(request)
        if isinstance(body, JSONResponse):
            return body
        result = await self._run(body.get("prompt"), body)
        if isinstance(result, JSONResponse):
            return result
        ids = result.completion_ids
        choice: dict[str, Any] = {
            "index": 0, "text": self.bundle.decode(ids), "finish_reason": result.finish_reason,
        }
        if body.get("logprobs") is not None:
            choice["logprobs"] = {
                "tokens": [f"token_id:{t}" for t in ids], "token_logprobs": result.logprobs,
                "top_logprobs": [None] * len(ids), "text_offset": [0] * len(ids)}
        if body.get("return_token_ids"):
            choice["token_ids"] = ids
            choice["prompt_token_ids"] = body["prompt"]
        return JSONResponse({
            "id": f"cmpl-{len(self.requests)}", "object": "text_completion",
            "created": int(time.time()), "model": body.get("model", SERVED_MODEL),
            "choices": [choice],
            "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids),
                      "total_tokens": len(body["prompt"]) + len(ids)},
        })

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> VLLMStandIn:
        import uvicorn

        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error",
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the vLLM stand-in did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": "BadRequestError",
                         "code": status}, status_code=status)


if __name__ == "__main__":  # serve by hand: python -m tests.vllm_standin
    from openforge.gateway.engines.local import LocalEngine
    from openforge.gateway.model import load_model_bundle

    bundle = load_model_bundle("tiny")
    standin = VLLMStandIn(LocalEngine(bundle), bundle).start()
    print(standin.url, flush=True)
    try:
        asyncio.run(asyncio.Event().wait())
    except KeyboardInterrupt:
        standin.stop()
