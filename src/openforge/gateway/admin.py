"""The admin API (`/admin/...`): sessions, rewards, recorded calls, pause/resume, health.

Every admin route needs `Authorization: Bearer <admin key>`; the key is printed when the
gateway starts and is never given to a sandbox.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from openforge.gateway.http import (
    BodyError,
    CredentialError,
    api_key,
    json_response,
    plain_error,
    read_body,
)
from openforge.gateway.state import GatewayState
from openforge.gateway.workers import FORWARDED
from openforge.types import SamplingParams


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


def first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "body"
    return f"{where}: {err['msg']}"


def _admin(handler: Callable[[Request, GatewayState], Awaitable[Response]]
           ) -> Callable[[Request], Awaitable[Response]]:
    """Guard an admin handler with the admin key."""

    async def endpoint(request: Request) -> Response:
        state: GatewayState = request.app.state.gateway
        try:
            key = api_key(request) or ""
        except CredentialError as exc:
            return plain_error(401, str(exc), "authentication_error")
        if not hmac.compare_digest(key.encode(), state.admin_key.encode()):
            return plain_error(401, "admin routes need 'Authorization: Bearer <admin key>' "
                                    "(printed when the gateway starts)", "authentication_error")
        return await handler(request, state)

    endpoint.__name__ = handler.__name__
    return endpoint


async def _body(request: Request, state: GatewayState, model: type[BaseModel]) -> Any:
    """The validated body, or an error Response to return as is."""
    try:
        body = await read_body(request, state.config.max_body_bytes, state.config.body_timeout_s)
    except BodyError as exc:
        return plain_error(exc.status, exc.message, exc.error_type)
    try:
        return model.model_validate_json(body if body.strip() else b"{}")
    except ValidationError as exc:
        return plain_error(422, f"invalid body: {first_error(exc)}")


async def open_session(request: Request, state: GatewayState) -> Response:
    body = await _body(request, state, OpenSessionBody)
    if isinstance(body, Response):
        return body
    session = state.sessions.open(run_id=body.run_id, rollout_id=body.rollout_id,
                                  task_id=body.task_id, sampling=body.sampling,
                                  metadata=body.metadata, weight_version=body.weight_version)
    return json_response(200, {"id": session.id, "token": session.token,
                               "scoring_token": session.scoring_token,
                               "base_url": state.session_url(session)})


async def list_sessions(request: Request, state: GatewayState) -> Response:
    run_id = request.query_params.get("run_id")
    sessions = state.store.list_sessions(run_id=run_id)
    return json_response(200, {"sessions": [s.model_dump(mode="json") for s in sessions]})


async def close_session(request: Request, state: GatewayState) -> Response:
    session_id = request.path_params["session_id"]
    session = await state.close_session(session_id)
    if session is None:
        return plain_error(404, "no such session", "not_found_error")
    return json_response(200, session.model_dump(mode="json"))


async def set_reward(request: Request, state: GatewayState) -> Response:
    session_id = request.path_params["session_id"]
    if state.store.get_session(session_id) is None:
        return plain_error(404, "no such session", "not_found_error")
    body = await _body(request, state, RewardBody)
    if isinstance(body, Response):
        return body
    state.store.set_reward(session_id, body.reward, body.details)
    return json_response(200, {"ok": True})


async def list_calls(request: Request, state: GatewayState) -> Response:
    session_id = request.path_params["session_id"]
    if state.store.get_session(session_id) is None:
        return plain_error(404, "no such session", "not_found_error")
    calls = state.store.list_calls(session_id)
    return json_response(200, {"calls": [c.model_dump(mode="json") for c in calls]})


async def pause(request: Request, state: GatewayState) -> Response:
    body = await _body(request, state, PauseBody)
    if isinstance(body, Response):
        return body
    state.paused, state.retry_after_s = True, body.retry_after
    if FORWARDED not in request.headers:
        await state.tell_workers("/admin/pause", {"retry_after": body.retry_after})
    return json_response(200, {"paused": True, "retry_after": body.retry_after})


async def resume(request: Request, state: GatewayState) -> Response:
    state.paused = False
    if FORWARDED not in request.headers:
        await state.tell_workers("/admin/resume")
    return json_response(200, {"paused": False})


async def health(request: Request, state: GatewayState) -> Response:
    return json_response(200, {"ok": True, "paused": state.paused,
                               "model": state.config.served_model_name,
                               "weight_version": state.engine.weight_version,
                               "render_policy": state.sessions.policy,
                               "worker": state.sessions.worker,
                               "workers": state.sessions.workers,
                               **state.sessions.cache_stats(),
                               "served": state.stats.snapshot()})


async def forget_session(request: Request, state: GatewayState) -> Response:
    """`POST /admin/sessions/{id}/forget`: a supervisor closed the session in the store;
    drop it from this worker's memory so its token stops working here at once."""
    state.sessions.forget(request.path_params["session_id"])
    return json_response(200, {"ok": True})


def admin_routes() -> list[Route]:
    return [
        Route("/admin/sessions", _admin(open_session), methods=["POST"]),
        Route("/admin/sessions", _admin(list_sessions), methods=["GET"]),
        Route("/admin/sessions/{session_id}/close", _admin(close_session), methods=["POST"]),
        Route("/admin/sessions/{session_id}/forget", _admin(forget_session), methods=["POST"]),
        Route("/admin/sessions/{session_id}/reward", _admin(set_reward), methods=["POST"]),
        Route("/admin/sessions/{session_id}/calls", _admin(list_calls), methods=["GET"]),
        Route("/admin/pause", _admin(pause), methods=["POST"]),
        Route("/admin/resume", _admin(resume), methods=["POST"]),
        Route("/admin/health", _admin(health), methods=["GET"]),
    ]
