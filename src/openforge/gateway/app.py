"""The gateway's ASGI application: its routes and who may call them.

Model routes exist twice: under `/s/{token}/v1/` (the token in the path; harnesses that
append their own paths, like Claude Code's `/v1/messages` after `ANTHROPIC_BASE_URL=.../s/TOKEN`,
land here too) and under `/v1/` (the token as API key only). Each dialect names its own
routes (`Dialect.paths`, `Dialect.count_tokens_path`). The token is also accepted as API
key (`Authorization: Bearer` or `x-api-key`); credentials that disagree are refused with a
401 that says which. Every rejection of a token itself is the same 401, whether the token
does not exist, is closed, or belongs to another session: nothing leaks about other
sessions. With several gateway workers, a session's token used on another worker's URL
gets 421 (each session is served by one process).

A session token is good for model calls only: no route takes a result or a reward from it.
The trusted side reads a session's calls at `/scoring/sessions/{id}/calls`, and closes the
session once its agent has ended (`/scoring/sessions/{id}/seal`), with the session's scoring
credential (returned when the session is opened, never given to the agent): `scoring.py`.

Model names: any name is accepted on generation routes (harnesses hard-code model names;
the gateway serves the one policy whatever they ask for). `GET /v1/models` lists the served
name and `GET /v1/models/{name}` answers 404 for any other name.

One call is a `pipeline.CallResponse`; the admin API is `admin.py`, the scoring API `scoring.py`.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from openforge.gateway.admin import admin_routes
from openforge.gateway.branches import SessionTokens
from openforge.gateway.dialects import DIALECTS, DialectError
from openforge.gateway.dialects.base import load_json
from openforge.gateway.http import (
    BodyError,
    CredentialError,
    dialect_error,
    header,
    json_response,
    plain_error,
    read_body,
    session_token,
)
from openforge.gateway.images import ImageError, resolve_images
from openforge.gateway.pipeline import CallResponse
from openforge.gateway.render import ContextLengthError, PromptError
from openforge.gateway.scoring import scoring_routes
from openforge.gateway.sessions import LiveSession, MisdirectedSession
from openforge.gateway.state import GatewayState

log = logging.getLogger("openforge.gateway")

Endpoint = Callable[[Request], Awaitable[Any]]
"""A route's handler: the request in, an ASGI response (a Starlette `Response` or a
`CallResponse`) out."""

UNAUTHORIZED = ("invalid session token: use the token of an open session, in the URL path "
                "(/s/TOKEN/v1) or as the API key")
MISDIRECTED = ("this session is served by another gateway worker; use the base URL the "
               "session was opened with")


def _authenticate(request: Request, state: GatewayState) -> LiveSession | tuple[int, str, str]:
    """The open session the request's token grants, or (status, message, error type)."""
    try:
        token = session_token(request)
    except CredentialError as exc:
        return 401, str(exc), "authentication_error"
    if not token:
        return 401, UNAUTHORIZED, "authentication_error"
    try:
        live = state.sessions.by_token(token)
    except MisdirectedSession:
        return 421, MISDIRECTED, "invalid_request_error"
    if live is None:
        return 401, UNAUTHORIZED, "authentication_error"
    return live


def _retry_count(request: Request) -> int:
    raw = header(request, b"x-stainless-retry-count") or ""
    return int(raw) if raw.isdigit() and len(raw) < 6 else 0


# --- model routes --------------------------------------------------------------------------


def _refuse(state: GatewayState, dialect_name: str, status: int, message: str,
            error_type: str, headers: dict[str, str] | None = None) -> Response:
    """A model call refused before its body is parsed, counted in what the gateway served."""
    state.stats.refused[status] += 1
    return dialect_error(dialect_name, status, message, error_type, headers=headers)


def _model_route(dialect_name: str) -> Callable[[Request], Awaitable[Response | CallResponse]]:
    async def endpoint(request: Request) -> Response | CallResponse:
        state: GatewayState = request.app.state.gateway
        live = _authenticate(request, state)
        if isinstance(live, tuple):
            return _refuse(state, dialect_name, *live)
        if state.paused:
            return _refuse(state, dialect_name, 429,
                           f"the gateway is paused (weights are being updated); retry in "
                           f"{state.retry_after_s} s", "rate_limit_error",
                           headers={"retry-after": str(state.retry_after_s)})
        try:
            body = await read_body(request, state.config.max_body_bytes,
                                   state.config.body_timeout_s)
        except BodyError as exc:
            return _refuse(state, dialect_name, exc.status, exc.message, exc.error_type)
        return CallResponse(state, live, dialect_name, body, retry_count=_retry_count(request))

    endpoint.__name__ = f"{dialect_name}_endpoint"
    return endpoint


def _count_tokens_route(dialect_name: str) -> Callable[[Request], Awaitable[Response]]:
    """A dialect's token-counting route: the prompt length, nothing generated or recorded."""
    dialect = DIALECTS[dialect_name]

    async def endpoint(request: Request) -> Response:
        state: GatewayState = request.app.state.gateway
        live = _authenticate(request, state)
        if isinstance(live, tuple):
            return dialect_error(dialect_name, *live)
        try:
            body = await read_body(request, state.config.max_body_bytes,
                                   state.config.body_timeout_s)
        except BodyError as exc:
            return dialect_error(dialect_name, exc.status, exc.message, exc.error_type)

        def count() -> int:
            chat = dialect.parse_count_tokens(load_json(body))
            if state.bundle.multimodal:
                resolve_images(chat, state.image_policy)
            # A throwaway token cache: counting must not open branches in the session's own.
            return len(SessionTokens(state.bundle).render(chat).prompt)

        try:
            n = await state.off_loop(count)
        except DialectError as exc:
            return dialect_error(dialect_name, exc.status, exc.message, exc.error_type)
        except ImageError as exc:
            return dialect_error(dialect_name, exc.status, exc.message, "invalid_request_error")
        except ContextLengthError as exc:
            return json_response(400, dialect.context_error(str(exc), exc.prompt_tokens,
                                                            exc.limit))
        except PromptError as exc:
            return dialect_error(dialect_name, 400, str(exc), "invalid_request_error")
        return json_response(200, dialect.count_tokens_response(n))

    endpoint.__name__ = f"{dialect_name}_count_tokens"
    return endpoint


async def list_models(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    live = _authenticate(request, state)
    if isinstance(live, tuple):
        return plain_error(*live)
    return json_response(200, {"object": "list", "data": [_model_card(state)]})


async def get_model(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    live = _authenticate(request, state)
    if isinstance(live, tuple):
        return plain_error(*live)
    name = request.path_params["model"]
    if name != state.config.served_model_name:
        return plain_error(404, f"model '{name}' is not served here; this gateway serves "
                                f"'{state.config.served_model_name}'", "not_found_error")
    return json_response(200, _model_card(state))


def _model_card(state: GatewayState) -> dict[str, Any]:
    name = state.config.served_model_name
    # Both shapes at once: OpenAI's (id, object, owned_by) and Anthropic's (type, display_name).
    return {"id": name, "object": "model", "created": 0, "owned_by": "openforge",
            "type": "model", "display_name": name}


# --- the app -------------------------------------------------------------------------------


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: f"no route {request.url.path}", 405: f"method {request.method} not allowed "
               f"on {request.url.path}"}.get(exc.status_code, str(exc.detail))
    return plain_error(exc.status_code, message, "not_found_error" if exc.status_code == 404
                       else "invalid_request_error", headers=getattr(exc, "headers", None))


async def _bug(request: Request, exc: Exception) -> Response:
    log.error("gateway bug on %s %s", request.method, request.url.path, exc_info=exc)
    return plain_error(500, f"internal gateway error ({type(exc).__name__}); see the gateway log",
                       "api_error")


def _model_endpoints() -> dict[str, Endpoint]:
    """Each dialect's POST routes, by their path after `/v1`."""
    endpoints: dict[str, Endpoint] = {}
    for name, dialect in DIALECTS.items():
        endpoints.update({path: _model_route(name) for path in dialect.paths})
        if dialect.count_tokens_path is not None:
            endpoints[dialect.count_tokens_path] = _count_tokens_route(name)
    return endpoints


def _model_routes(prefix: str, endpoints: dict[str, Endpoint]) -> list[Route]:
    return [*(Route(prefix + path, endpoint, methods=["POST"])
              for path, endpoint in endpoints.items()),
            Route(f"{prefix}/models", list_models, methods=["GET"]),
            Route(f"{prefix}/models/{{model:path}}", get_model, methods=["GET"])]


class GatewayApp:
    """The gateway's ASGI application: model calls go straight to their endpoint, every
    other request (admin, scoring, model listing, unknown paths, other methods) through
    the Starlette app.

    A model call is what the gateway serves hundreds of per second, and Starlette's two
    exception middlewares, its router (a regular expression per route until one matches)
    and its per-request wrappers doubled what a call costs beyond the pipeline itself, for
    nothing those calls need (`benchmarks/bench_gateway_phases.py` prints both ways). The
    same endpoints serve both ways: the Starlette routes exist too, and a request this
    dispatch does not recognise gets exactly what it got before.
    """

    def __init__(self, state: GatewayState) -> None:
        self.endpoints = _model_endpoints()
        routes = [
            *_model_routes("/s/{token}/v1", self.endpoints),
            *_model_routes("/v1", self.endpoints),
            *scoring_routes(),
            *admin_routes(),
        ]
        self.starlette = Starlette(routes=routes, exception_handlers={
            HTTPException: _http_error, Exception: _bug})
        self.starlette.state.gateway = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._model_call(scope)
        if found is None:
            await self.starlette(scope, receive, send)
            return
        endpoint, token = found
        scope["app"] = self.starlette  # what `request.app` is in Starlette's own routes
        scope["path_params"] = {} if token is None else {"token": token}
        request = Request(scope, receive)
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            response = await endpoint(request)
            await response(scope, receive, tracked)
        except Exception as exc:
            # As Starlette's ServerErrorMiddleware: a 500 if nothing was sent yet, and the
            # exception goes on to the server, which logs it.
            if not started:
                await (await _bug(request, exc))(scope, receive, send)
            raise

    def _model_call(self, scope: Scope) -> tuple[Endpoint, str | None] | None:
        """The endpoint and path token of a model call, None for any other request."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        path: str = scope["path"]
        token = None
        if path.startswith("/s/"):
            token, slash, rest = path[3:].partition("/")
            if not token or not slash:
                return None
            path = "/" + rest
        if not path.startswith("/v1/"):
            return None
        endpoint = self.endpoints.get(path[3:])
        return None if endpoint is None else (endpoint, token)


def create_app(state: GatewayState) -> GatewayApp:
    """The gateway's ASGI app, serving `state`."""
    app = GatewayApp(state)
    _freeze_startup_objects()
    return app


_frozen = False

#: Allocations (net of frees) between young-generation collections (CPython's default:
#: 700). 64 calls in flight each hold a parsed request, rendered messages and token lists: at
#: the default, a young collection runs several times per call, finds nearly everything
#: still referenced, and promotes it, so the same payloads are traversed again in the
#: older generations. At this threshold they are usually freed by reference counting
#: before any collection looks at them. Measured with `benchmarks/bench_gateway_ab.py`
#: (docs/internals.md, "Gateway cost").
GC_YOUNG_THRESHOLD = 100_000


def _freeze_startup_objects() -> None:
    """Exempt what is alive now (the tokenizer, renderers, pydantic's schemas: hundreds of
    thousands of objects) from the cyclic garbage collector, and collect the young
    generation less often, once per process.

    They live as long as the process; without this, every full collection walks them
    all again, which at gateway loads was a fifth of the gateway's CPU. Garbage is
    collected first so none is kept for good; objects created later are collected as usual
    (cycles still are: the collector stays on, it only runs less often).
    """
    global _frozen
    if not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()
        young, older, oldest = gc.get_threshold()
        gc.set_threshold(max(GC_YOUNG_THRESHOLD, young), older, oldest)
