"""The scoring API (`/scoring/sessions/{id}/...`): what the trusted side that scores a
session may do with it, and nothing more.

Authenticated with the session's scoring credential (`Session.scoring_token`, returned when
the session is opened and held only by the rollout supervisor). The agent's session token is
refused like any wrong key: every rejection is the same 401, whatever was wrong (unknown
session, wrong key, a session token), so nothing leaks about sessions. The store keeps only
the credential's SHA-256, compared in constant time.

Any gateway worker answers these routes: they read the shared store, and sealing tells the
worker that serves the session to drop it.
"""

from __future__ import annotations

import hmac

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from openforge.gateway.http import CredentialError, api_key, json_response, plain_error
from openforge.gateway.state import GatewayState
from openforge.store import secret_hash
from openforge.types import Session

SCORING_ONLY = "scoring routes need 'Authorization: Bearer <the session's scoring credential>'"


def _scored_session(request: Request, state: GatewayState) -> Session | None:
    """The session the request's scoring credential belongs to, or None (any wrong key)."""
    try:
        key = api_key(request) or ""
    except CredentialError:
        return None
    session = state.store.get_session(request.path_params["session_id"])
    if session is None or not session.scoring_hash or not hmac.compare_digest(
            secret_hash(key).encode(), session.scoring_hash.encode()):
        return None
    return session


async def scoring_calls(request: Request) -> Response:
    """`GET /scoring/sessions/{id}/calls`: a session's recorded calls, for the trusted side
    that scores it (rewards that read the trajectory)."""
    state: GatewayState = request.app.state.gateway
    session = _scored_session(request, state)
    if session is None:
        return plain_error(401, SCORING_ONLY, "authentication_error")
    calls = state.store.list_calls(session.id)
    return json_response(200, {"calls": [c.model_dump(mode="json") for c in calls]})


async def scoring_seal(request: Request) -> Response:
    """`POST /scoring/sessions/{id}/seal`: the supervisor closes its session as soon as the
    agent has ended, so nothing that runs while it scores (a checker running the agent's
    code) can add a model call to the trajectory."""
    state: GatewayState = request.app.state.gateway
    session = _scored_session(request, state)
    if session is None:
        return plain_error(401, SCORING_ONLY, "authentication_error")
    await state.close_session(session.id)
    return json_response(200, {"sealed": True})


def scoring_routes() -> list[Route]:
    return [
        Route("/scoring/sessions/{session_id}/calls", scoring_calls, methods=["GET"]),
        Route("/scoring/sessions/{session_id}/seal", scoring_seal, methods=["POST"]),
    ]
