"""The gateway's ASGI application: model routes, session auth, the admin API.

Model routes exist twice: under `/s/{token}/v1/` (the token in the path; harnesses that
append their own paths, like Claude Code's `/v1/messages` after `ANTHROPIC_BASE_URL=.../s/TOKEN`,
land here too) and under `/v1/` (the token as API key only). The token is also accepted as
API key (`Authorization: Bearer` or `x-api-key`); when both the path and a key carry one,
they must agree. Every rejection of a token is the same 401, whether the token does not
exist, is closed, or belongs to another session: nothing leaks about other sessions.
A session token is good for model calls only: no route takes a result or a reward from it.
The trusted side reads a session's calls at `/scoring/sessions/{id}/calls`, and closes the
session once its agent has ended (`/scoring/sessions/{id}/seal`), with the session's scoring
credential (returned when the session is opened, never given to the agent).

Model names: any name is accepted on generation routes (harnesses hard-code model names;
the gateway serves the one policy whatever they ask for). `GET /v1/models` lists the served
name and `GET /v1/models/{name}` answers 404 for any other name.

One call (`CallResponse`): dialect parse -> `SessionTokens.render` -> `engine.generate`
(cancelled when the client disconnects) -> parse -> JSON or SSE (keep-alive comments while
the engine is busy) -> only after the last byte was handed to the server: `store.add_call`
and `SessionTokens.commit`. Engine failures answer 502/503 in the dialect's error format
and are recorded as failed calls, so a harness's retry is recorded once, as its own call.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import hmac
import json
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from openforge.config import GatewayConfig
from openforge.gateway.conversation import ChatRequest, Completion, ImageRef, Message
from openforge.gateway.dialects import (
    DIALECTS,
    KEEPALIVE_FRAME,
    AnthropicDialect,
    DialectError,
    count_tokens_response,
)
from openforge.gateway.dialects.base import dumps_bytes
from openforge.gateway.engines.base import (
    Engine,
    EngineBusy,
    EngineError,
    GenerateRequest,
    GenerateResult,
)
from openforge.gateway.images import (
    ImageError,
    ImagePolicy,
    image_blobs,
    resolve_images,
    without_inline_images,
)
from openforge.gateway.render import ModelBundle, RenderedPrompt, SessionTokens
from openforge.gateway.sessions import LiveSession, SessionRegistry
from openforge.store import Store, ids_to_blob, secret_hash
from openforge.types import Call, SamplingParams, Session

log = logging.getLogger("openforge.gateway")

_JSON = [(b"content-type", b"application/json")]


def _json_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    # With a length the server sends the body as is, not in chunked framing.
    return [*_JSON, (b"content-length", str(len(body)).encode())]


# The id shapes each provider uses, so clients that inspect them see familiar values.
_ID_PREFIX = {"chat": "chatcmpl-", "completions": "cmpl-", "responses": "resp_", "messages": "msg_"}
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no")]


class GatewayState:
    """Everything the app needs, built once per gateway: config, store, engine, sessions."""

    def __init__(self, config: GatewayConfig, store: Store, engine: Engine, bundle: ModelBundle,
                 *, admin_key: str | None = None, base_url: str = "",
                 image_policy: ImagePolicy | None = None) -> None:
        self.config = config
        # Where image URLs may be read from and how large images may be (see images.py).
        self.image_policy = image_policy or ImagePolicy.from_env()
        self.store = store
        # Each call commits from the event loop: keep WAL checkpoints (file copies and
        # syncs) out of those commits.
        store.checkpoint_in_background()
        self.engine = engine
        self.bundle = bundle
        self.admin_key = admin_key or config.admin_key or secrets.token_urlsafe(32)
        # Set by the server once the port is bound; admin answers build session URLs from it.
        self.base_url = base_url
        self.sessions = SessionRegistry(store, bundle, model_name=config.served_model_name,
                                        weight_version=engine.weight_version)
        self.paused = False
        self.retry_after_s = 5
        self.stop_token_ids = list(getattr(bundle, "stop_token_ids", []) or [])

    def session_url(self, token: str) -> str:
        return f"{self.base_url.rstrip('/')}/s/{token}/v1"


class BodyTooLarge(Exception):
    """The request body exceeds `max_body_bytes`."""


# --- small response helpers ----------------------------------------------------------------


def _json(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps_bytes(payload), status,
                    headers=headers, media_type="application/json")


def _plain_error(status: int, message: str, error_type: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> Response:
    """An OpenAI-shaped error for routes that have no dialect (admin, models, result)."""
    return _json(status, {"error": {"message": message, "type": error_type}}, headers)


def _dialect_error(dialect_name: str, status: int, message: str, error_type: str = "",
                   headers: dict[str, str] | None = None) -> Response:
    return _json(status, DIALECTS[dialect_name].error(status, message, error_type), headers)


async def _read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing (before reading it) anything over `limit` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> str:
    return f"request body exceeds the gateway's limit of {limit} bytes (gateway.max_body_bytes)"


def _decode_json(body: bytes) -> Any:
    """Decoded JSON, or ValueError with a one-line reason."""
    if not body.strip():
        raise ValueError("the request body is empty; send a JSON object")
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise ValueError("the request body is not UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"the request body is not valid JSON ({exc.msg} at line {exc.lineno} "
                         f"column {exc.colno})") from None
    except RecursionError:
        raise ValueError("the request body is nested too deeply") from None


def _api_key(request: Request) -> str | None:
    """The key a client sent as `Authorization: Bearer KEY` or `x-api-key: KEY`."""
    auth = request.headers.get("authorization")
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return auth.strip() or None
    key = request.headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def _session_for(request: Request, state: GatewayState) -> LiveSession | None:
    """The open session the request's token grants, or None (same answer for every failure)."""
    path_token = request.path_params.get("token")
    key = _api_key(request)
    if path_token is not None and key is not None and not hmac.compare_digest(
            path_token.encode(), key.encode()):
        return None
    token = path_token if path_token is not None else key
    if not token:
        return None
    return state.sessions.by_token(token)


def _retry_count(request: Request) -> int:
    raw = request.headers.get("x-stainless-retry-count", "")
    return int(raw) if raw.isdigit() and len(raw) < 6 else 0


def _merge_sampling(defaults: SamplingParams, requested: SamplingParams) -> SamplingParams:
    """The session's sampling defaults, overridden by what the request set explicitly.

    The session's `max_tokens` is a ceiling, not only a default: harnesses ask for what
    suits a frontier model (Claude Code: 32000 per call), and the run's token budget must
    still hold. A request may ask for fewer.
    """
    explicit = requested.model_fields_set
    if not explicit:
        return defaults
    update = {k: getattr(requested, k) for k in explicit}
    if "max_tokens" in update:
        update["max_tokens"] = min(update["max_tokens"], defaults.max_tokens)
    return defaults.model_copy(update=update)


_UNAUTHORIZED = ("invalid session token: use the token of an open session, in the URL path "
                 "(/s/TOKEN/v1) or as the API key")


# --- model routes --------------------------------------------------------------------------


def _model_route(dialect_name: str) -> Callable[[Request], Awaitable[Response | CallResponse]]:
    async def endpoint(request: Request) -> Response | CallResponse:
        state: GatewayState = request.app.state.gateway
        live = _session_for(request, state)
        if live is None:
            return _dialect_error(dialect_name, 401, _UNAUTHORIZED, "authentication_error")
        if state.paused:
            return _dialect_error(
                dialect_name, 429,
                f"the gateway is paused (weights are being updated); retry in "
                f"{state.retry_after_s} s", "rate_limit_error",
                headers={"retry-after": str(state.retry_after_s)})
        try:
            body = await _read_body(request, state.config.max_body_bytes)
        except BodyTooLarge:
            return _dialect_error(dialect_name, 413, _too_large(state.config.max_body_bytes),
                                  "request_too_large")
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is listening any more
        try:
            payload = _decode_json(body)
        except ValueError as exc:
            return _dialect_error(dialect_name, 400, str(exc), "invalid_request_error")
        dialect = DIALECTS[dialect_name]
        try:
            chat = dialect.parse(payload, memo=live.memo)
        except DialectError as exc:
            return _dialect_error(dialect_name, exc.status, exc.message, exc.error_type)
        return CallResponse(
            state, live, dialect_name, payload, chat,
            body=body, retry_count=_retry_count(request))

    endpoint.__name__ = f"{dialect_name}_endpoint"
    return endpoint


async def count_tokens(request: Request) -> Response:
    """Anthropic's `/v1/messages/count_tokens`: the prompt length, nothing generated or recorded."""
    state: GatewayState = request.app.state.gateway
    if _session_for(request, state) is None:
        return _dialect_error("messages", 401, _UNAUTHORIZED, "authentication_error")
    try:
        body = await _read_body(request, state.config.max_body_bytes)
        chat = AnthropicDialect().parse_count_tokens(_decode_json(body))
    except BodyTooLarge:
        return _dialect_error("messages", 413, _too_large(state.config.max_body_bytes),
                              "request_too_large")
    except ClientDisconnect:
        return Response(status_code=400)
    except ValueError as exc:
        return _dialect_error("messages", 400, str(exc), "invalid_request_error")
    except DialectError as exc:
        return _dialect_error("messages", exc.status, exc.message, exc.error_type)
    # A throwaway token cache: counting must not open branches in the session's own.
    try:
        _resolve_images(state, chat)
        rendered = SessionTokens(state.bundle).render(chat)
    except ImageError as exc:
        return _dialect_error("messages", exc.status, exc.message, "invalid_request_error")
    except ValueError as exc:
        return _dialect_error("messages", 400, str(exc), "invalid_request_error")
    return _json(200, count_tokens_response(len(rendered.prompt_ids)))


async def list_models(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    if _session_for(request, state) is None:
        return _plain_error(401, _UNAUTHORIZED, "authentication_error")
    return _json(200, {"object": "list", "data": [_model_card(state)]})


async def get_model(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    if _session_for(request, state) is None:
        return _plain_error(401, _UNAUTHORIZED, "authentication_error")
    name = request.path_params["model"]
    if name != state.config.served_model_name:
        return _plain_error(404, f"model '{name}' is not served here; this gateway serves "
                                 f"'{state.config.served_model_name}'", "not_found_error")
    return _json(200, _model_card(state))


def _model_card(state: GatewayState) -> dict[str, Any]:
    name = state.config.served_model_name
    # Both shapes at once: OpenAI's (id, object, owned_by) and Anthropic's (type, display_name).
    return {"id": name, "object": "model", "created": 0, "owned_by": "openforge",
            "type": "model", "display_name": name}


def _scored_session(request: Request, state: GatewayState) -> Session | None:
    """The session the request's scoring credential belongs to, or None (any wrong key)."""
    session = state.store.get_session(request.path_params["session_id"])
    key = _api_key(request) or ""
    if session is None or not session.scoring_hash or not hmac.compare_digest(
            secret_hash(key).encode(), session.scoring_hash.encode()):
        return None
    return session


_SCORING_ONLY = ("scoring routes need 'Authorization: Bearer <the session's scoring "
                 "credential>'")


async def scoring_calls(request: Request) -> Response:
    """`GET /scoring/sessions/{id}/calls`: a session's recorded calls, for the trusted side that
    scores it (rewards that read the trajectory). Authenticated with the session's scoring
    credential, which only the rollout supervisor holds; a session token, which the agent
    holds, is refused like any wrong key (the same 401 whatever was wrong)."""
    state: GatewayState = request.app.state.gateway
    session = _scored_session(request, state)
    if session is None:
        return _plain_error(401, _SCORING_ONLY, "authentication_error")
    calls = state.store.list_calls(session.id)
    return _json(200, {"calls": [c.model_dump(mode="json") for c in calls]})


async def scoring_seal(request: Request) -> Response:
    """`POST /scoring/sessions/{id}/seal`: the supervisor closes its session as soon as the
    agent has ended, so nothing that runs while it scores (a checker running the agent's
    code) can add a model call to the trajectory. Same authentication as the calls route."""
    state: GatewayState = request.app.state.gateway
    session = _scored_session(request, state)
    if session is None:
        return _plain_error(401, _SCORING_ONLY, "authentication_error")
    state.sessions.close(session.id)
    return _json(200, {"sealed": True})


def _resolve_images(state: GatewayState, chat: ChatRequest) -> list[ImageRef]:
    """The request's images with their bytes and hashes, in prompt order (ImageError).

    Only for a multimodal model: a text-only model refuses images when rendering, and
    that is the clearer answer whatever the images are.
    """
    if not state.bundle.multimodal:
        return []
    return resolve_images(chat, state.image_policy)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "body"
    return f"{where}: {err['msg']}"


# --- one model call ------------------------------------------------------------------------


class _Disconnected(Exception):
    """The client went away before the response was complete."""


class CallResponse:
    """The ASGI response of one model call: generate, deliver, then record.

    For a streamed call the status line is held back until the first keep-alive is due,
    so an engine that fails quickly still gets a proper 502/503; later failures end the
    stream with the dialect's error frame.
    """

    def __init__(self, state: GatewayState, live: LiveSession, dialect_name: str,
                 payload: dict[str, Any], chat: ChatRequest, *, body: bytes,
                 retry_count: int) -> None:
        self.state = state
        self.live = live
        self.dialect_name = dialect_name
        self.dialect = DIALECTS[dialect_name]
        self.payload = payload
        self.chat = chat
        self.body = body  # stored as the call's request: `payload` is its decoded form
        self.body_digest = hashlib.sha256(body).hexdigest()
        self.retry_count = retry_count
        self.call_id = uuid.uuid4().hex
        self.started_at = time.time()
        self.headers_sent = False
        self.images: list[ImageRef] = []  # resolved, in prompt order

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await self._run(send, watcher)
        except (_Disconnected, OSError):
            log.debug("call %s: client disconnected; nothing recorded", self.call_id)
        finally:
            watcher.cancel()

    async def _run(self, send: Send, watcher: asyncio.Future[None]) -> None:
        state, live, chat = self.state, self.live, self.chat
        try:
            self.images = _resolve_images(state, chat)
            rendered = live.tokens.render(chat)
        except ImageError as exc:
            await self._send_json(send, exc.status, self.dialect.error(
                exc.status, exc.message, "invalid_request_error"))
            return
        except DialectError as exc:
            await self._send_json(send, exc.status, self.dialect.error(
                exc.status, exc.message, exc.error_type))
            return
        except ValueError as exc:
            # The conversation cannot be rendered with this model's template (e.g. an image
            # for a text-only model): the client's request, not a gateway fault.
            await self._send_json(send, 400, self.dialect.error(400, str(exc), ""))
            return
        sampling = _merge_sampling(live.session.sampling, chat.sampling)
        # model_construct: every field is set here from typed values; validating the
        # prompt's thousands of ids again would cost more than the rest of the request.
        request = GenerateRequest.model_construct(
            prompt_ids=rendered.prompt_ids, sampling=sampling,
            stop_token_ids=state.stop_token_ids, session_id=live.session.id,
            request_id=self.call_id, chat=chat)
        generation = asyncio.ensure_future(state.engine.generate(request))
        try:
            result = await self._await_generation(send, generation, watcher)
        except EngineBusy as exc:
            await self._fail(send, rendered, sampling, 429, str(exc),
                             retry_after_s=exc.retry_after_s)
            return
        except EngineError as exc:
            status = exc.status_code if exc.status_code in (502, 503, 504) else 502
            await self._fail(send, rendered, sampling, status, f"engine error: {exc}")
            return
        except (_Disconnected, OSError):
            raise
        except Exception as exc:  # an engine plugin's bug is still an upstream failure
            log.exception("call %s: engine raised", self.call_id)
            await self._fail(send, rendered, sampling, 502,
                             f"engine failed: {type(exc).__name__}: {exc}")
            return
        finally:
            if not generation.done():
                generation.cancel()
        await self._deliver(send, watcher, rendered, sampling, result)

    async def _await_generation(self, send: Send, generation: asyncio.Future[GenerateResult],
                                watcher: asyncio.Future[None]) -> GenerateResult:
        keepalive_s = self.state.config.keepalive_s if self.chat.stream else None
        waiters: set[asyncio.Future[Any]] = {generation, watcher}
        while True:
            done, _ = await asyncio.wait(waiters, timeout=keepalive_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if watcher in done:
                raise _Disconnected
            if generation in done:
                return generation.result()
            # Still generating on a stream: show the client (and idle proxies) we are alive.
            await self._start_stream(send)
            await send({"type": "http.response.body", "body": KEEPALIVE_FRAME, "more_body": True})

    async def _start_stream(self, send: Send) -> None:
        if not self.headers_sent:
            self.headers_sent = True
            await send({"type": "http.response.start", "status": 200, "headers": _SSE})

    async def _send_json(self, send: Send, status: int, payload: dict[str, Any],
                         headers: list[tuple[bytes, bytes]] | None = None) -> None:
        body = dumps_bytes(payload)
        await send({"type": "http.response.start", "status": status,
                    "headers": _json_headers(body) + (headers or [])})
        await send({"type": "http.response.body", "body": body})

    async def _deliver(self, send: Send, watcher: asyncio.Future[None], rendered: RenderedPrompt,
                       sampling: SamplingParams, result: GenerateResult) -> None:
        state, live, chat = self.state, self.live, self.chat
        exact = state.engine.exact_tokens and result.completion is None
        if result.completion is not None:
            assistant = result.completion.message
            finish = result.completion.finish_reason
            completion_ids = list(result.completion_ids) or _tokenize_text(state.bundle, assistant)
            logprobs = list(result.logprobs) if result.completion_ids else [0.0] * len(completion_ids)
        else:
            completion_ids, logprobs = result.completion_ids, result.logprobs
            assistant, finish = live.tokens.parse(chat, rendered.prompt_ids, completion_ids)
            if result.finish_reason == "length":
                finish = "length"
        completion = Completion(message=assistant, finish_reason=finish,
                                prompt_tokens=len(rendered.prompt_ids),
                                completion_tokens=len(completion_ids))
        model = chat.model or state.config.served_model_name
        created = int(self.started_at)
        response_id = _ID_PREFIX[self.dialect_name] + self.call_id
        response_body = self.dialect.response(completion, response_id=response_id, model=model,
                                              created=created, request=chat)
        body: bytes | None = None  # the response as sent, when sent as one JSON body
        if chat.stream:
            await self._start_stream(send)
            # The completion is whole already: its frames go out in one write (the same
            # bytes; SSE clients split events on blank lines, not on network reads).
            frames = b"".join(self.dialect.stream(completion, response_id=response_id,
                                                  model=model, created=created, request=chat))
            await send({"type": "http.response.body", "body": frames, "more_body": True})
            self._check_connected(watcher)
            await send({"type": "http.response.body", "body": b""})
        else:
            body = dumps_bytes(response_body)
            self._check_connected(watcher)
            await send({"type": "http.response.start", "status": 200,
                        "headers": _json_headers(body)})
            await send({"type": "http.response.body", "body": body})
        # Delivered: only now does the call become training data. Commit first: it may move
        # the call to a new branch when a concurrent call of the session extended it first.
        prompt = live.tokens.commit(chat, rendered, completion_ids, assistant)
        self._record(rendered, sampling, status="ok", completion_ids=completion_ids,
                     prompt_blob=ids_to_blob(prompt),
                     logprobs=logprobs, finish_reason=completion.finish_reason,
                     response=response_body, response_json=body,
                     weight_version=result.weight_version, exact_tokens=exact)

    async def _fail(self, send: Send, rendered: RenderedPrompt, sampling: SamplingParams,
                    status: int, message: str, retry_after_s: int | None = None) -> None:
        error_type = {503: "overloaded_error", 429: "rate_limit_error"}.get(status, "api_error")
        if self.headers_sent:
            frame = self.dialect.error_stream_frame(status, message, error_type)
            await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            headers = (None if retry_after_s is None
                       else [(b"retry-after", str(retry_after_s).encode())])
            await self._send_json(send, status, self.dialect.error(status, message, error_type),
                                  headers)
        self._record(rendered, sampling, status="failed", error=message)

    @staticmethod
    def _check_connected(watcher: asyncio.Future[None]) -> None:
        if watcher.done():
            raise _Disconnected

    def _record(self, rendered: RenderedPrompt, sampling: SamplingParams, *,
                status: str, completion_ids: list[int] | None = None,
                logprobs: list[float] | None = None, finish_reason: str | None = None,
                response: dict[str, Any] | None = None, response_json: bytes | None = None,
                prompt_blob: bytes | None = None,
                weight_version: str | None = None, exact_tokens: bool = True,
                error: str | None = None) -> None:
        live = self.live
        request: Any = self.payload
        request_json: bytes | None = self.body
        if self.images:  # the image bytes are kept once, in the store's images table
            request, request_json = without_inline_images(self.payload, self.images), None
        # model_construct: every field is built here from typed values; validating
        # thousands of token ids again per call would be the gateway's largest CPU cost.
        call = Call.model_construct(
            id=self.call_id, session_id=live.session.id, branch=rendered.branch,
            branch_reason=rendered.branch_reason, index=live.take_index(),
            dialect=self.dialect_name, request=request, response=response,
            prompt_ids=rendered.prompt_ids, completion_ids=completion_ids or [],
            logprobs=logprobs or [], finish_reason=finish_reason,
            sampling=sampling.model_dump(),
            weight_version=weight_version or self.state.engine.weight_version
            or live.session.weight_version,
            exact_tokens=exact_tokens, status=status, error=error,
            body_digest=self.body_digest, retry_count=self.retry_count,
            images=[image.sha256 for image in self.images],
            started_at=self.started_at, finished_at=time.time())
        self.state.store.add_call(call, request_json=request_json, response_json=response_json,
                                  prompt_blob=prompt_blob, images=image_blobs(self.images))


async def _wait_disconnect(receive: Receive) -> None:
    """Return when the client disconnects (the request body has been read by then)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _tokenize_text(bundle: ModelBundle, message: Message) -> list[int]:
    """Ids for a text-only engine's answer: a retokenization, flagged exact_tokens=False."""
    return bundle.encode(message.content) if message.content else []


# --- admin API -----------------------------------------------------------------------------


class OpenSessionBody(BaseModel):
    """`POST /admin/sessions`."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = ""
    rollout_id: str = ""
    task_id: str = ""
    sampling: SamplingParams | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    weight_version: str | None = None


class RewardBody(BaseModel):
    """`POST /admin/sessions/{id}/reward`."""

    model_config = ConfigDict(extra="forbid")

    reward: float
    details: dict[str, Any] | None = None


class PauseBody(BaseModel):
    """`POST /admin/pause`: `retry_after` is what 429 answers tell clients to wait."""

    model_config = ConfigDict(extra="forbid")

    retry_after: int = Field(default=5, ge=0, le=3600)


def _admin(handler: Callable[[Request, GatewayState], Awaitable[Response]]
           ) -> Callable[[Request], Awaitable[Response]]:
    """Guard an admin handler with the admin key."""

    async def endpoint(request: Request) -> Response:
        state: GatewayState = request.app.state.gateway
        key = _api_key(request) or ""
        if not hmac.compare_digest(key.encode(), state.admin_key.encode()):
            return _plain_error(401, "admin routes need 'Authorization: Bearer <admin key>' "
                                     "(printed when the gateway starts)", "authentication_error")
        return await handler(request, state)

    endpoint.__name__ = handler.__name__
    return endpoint


async def _admin_body(request: Request, state: GatewayState, model: type[BaseModel]) -> Any:
    """The validated body, or an error Response to return as is."""
    try:
        body = await _read_body(request, state.config.max_body_bytes)
    except BodyTooLarge:
        return _plain_error(413, _too_large(state.config.max_body_bytes), "request_too_large")
    except ClientDisconnect:
        return Response(status_code=400)
    try:
        return model.model_validate_json(body if body.strip() else b"{}")
    except ValidationError as exc:
        return _plain_error(422, f"invalid body: {_first_error(exc)}")


async def admin_open_session(request: Request, state: GatewayState) -> Response:
    body = await _admin_body(request, state, OpenSessionBody)
    if isinstance(body, Response):
        return body
    session = state.sessions.open(run_id=body.run_id, rollout_id=body.rollout_id,
                                  task_id=body.task_id, sampling=body.sampling,
                                  metadata=body.metadata, weight_version=body.weight_version)
    return _json(200, {"id": session.id, "token": session.token,
                       "scoring_token": session.scoring_token,
                       "base_url": state.session_url(session.token)})


async def admin_list_sessions(request: Request, state: GatewayState) -> Response:
    run_id = request.query_params.get("run_id")
    sessions = state.store.list_sessions(run_id=run_id)
    return _json(200, {"sessions": [s.model_dump(mode="json") for s in sessions]})


async def admin_close_session(request: Request, state: GatewayState) -> Response:
    session = state.sessions.close(request.path_params["session_id"])
    if session is None:
        return _plain_error(404, "no such session", "not_found_error")
    return _json(200, session.model_dump(mode="json"))


async def admin_set_reward(request: Request, state: GatewayState) -> Response:
    session_id = request.path_params["session_id"]
    if state.store.get_session(session_id) is None:
        return _plain_error(404, "no such session", "not_found_error")
    body = await _admin_body(request, state, RewardBody)
    if isinstance(body, Response):
        return body
    state.store.set_reward(session_id, body.reward, body.details)
    return _json(200, {"ok": True})


async def admin_list_calls(request: Request, state: GatewayState) -> Response:
    session_id = request.path_params["session_id"]
    if state.store.get_session(session_id) is None:
        return _plain_error(404, "no such session", "not_found_error")
    calls = state.store.list_calls(session_id)
    return _json(200, {"calls": [c.model_dump(mode="json") for c in calls]})


async def admin_pause(request: Request, state: GatewayState) -> Response:
    body = await _admin_body(request, state, PauseBody)
    if isinstance(body, Response):
        return body
    state.paused, state.retry_after_s = True, body.retry_after
    return _json(200, {"paused": True, "retry_after": body.retry_after})


async def admin_resume(request: Request, state: GatewayState) -> Response:
    state.paused = False
    return _json(200, {"paused": False})


async def admin_health(request: Request, state: GatewayState) -> Response:
    return _json(200, {"ok": True, "paused": state.paused, "model": state.config.served_model_name,
                       "weight_version": state.engine.weight_version,
                       **state.sessions.cache_stats()})


# --- the app -------------------------------------------------------------------------------


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: f"no route {request.url.path}", 405: f"method {request.method} not allowed "
               f"on {request.url.path}"}.get(exc.status_code, str(exc.detail))
    return _plain_error(exc.status_code, message, "not_found_error" if exc.status_code == 404
                        else "invalid_request_error", headers=getattr(exc, "headers", None))


async def _bug(request: Request, exc: Exception) -> Response:
    log.error("gateway bug on %s %s", request.method, request.url.path, exc_info=exc)
    return _plain_error(500, f"internal gateway error ({type(exc).__name__}); see the gateway log",
                        "api_error")


def _model_routes(prefix: str) -> list[Route]:
    return [
        Route(f"{prefix}/chat/completions", _model_route("chat"), methods=["POST"]),
        Route(f"{prefix}/completions", _model_route("completions"), methods=["POST"]),
        Route(f"{prefix}/responses", _model_route("responses"), methods=["POST"]),
        Route(f"{prefix}/messages", _model_route("messages"), methods=["POST"]),
        Route(f"{prefix}/messages/count_tokens", count_tokens, methods=["POST"]),
        Route(f"{prefix}/models", list_models, methods=["GET"]),
        Route(f"{prefix}/models/{{model:path}}", get_model, methods=["GET"]),
    ]


def create_app(state: GatewayState) -> Starlette:
    """The gateway's Starlette app, serving `state`."""
    routes = [
        *_model_routes("/s/{token}/v1"),
        *_model_routes("/v1"),
        Route("/scoring/sessions/{session_id}/calls", scoring_calls, methods=["GET"]),
        Route("/scoring/sessions/{session_id}/seal", scoring_seal, methods=["POST"]),
        Route("/admin/sessions", _admin(admin_open_session), methods=["POST"]),
        Route("/admin/sessions", _admin(admin_list_sessions), methods=["GET"]),
        Route("/admin/sessions/{session_id}/close", _admin(admin_close_session), methods=["POST"]),
        Route("/admin/sessions/{session_id}/reward", _admin(admin_set_reward), methods=["POST"]),
        Route("/admin/sessions/{session_id}/calls", _admin(admin_list_calls), methods=["GET"]),
        Route("/admin/pause", _admin(admin_pause), methods=["POST"]),
        Route("/admin/resume", _admin(admin_resume), methods=["POST"]),
        Route("/admin/health", _admin(admin_health), methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error, Exception: _bug})
    app.state.gateway = state
    _freeze_startup_objects()
    return app


_frozen = False


def _freeze_startup_objects() -> None:
    """Exempt what is alive now (torch, transformers, the tokenizer: ~300k objects) from
    the cyclic garbage collector, once per process.

    They live as long as the process; without this, every full collection walks them
    all again (~0.15 s each), which at gateway loads was a fifth of the gateway's CPU.
    Garbage is collected first so none is kept for good; objects created later are
    collected as usual.
    """
    global _frozen
    if not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()
