"""The gateway's ASGI entry point: model calls skip Starlette's router, nothing else changes.

`GatewayApp` sends a POST on a dialect's route straight to its endpoint and every other
request through the Starlette app that holds the same routes. Each request here goes to
both (the app, and the Starlette app alone, on one state) and must get the same status and,
for refusals, the same body: the dispatch may only be faster, never answer differently.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures_model import tiny_bundle  # noqa: F401  (pytest fixture)
from starlette.testclient import TestClient

from openforge import plugins
from openforge.config import GatewayConfig
from openforge.gateway.app import GatewayApp, create_app
from openforge.gateway.dialects import DIALECTS
from openforge.gateway.model import ModelBundle
from openforge.gateway.state import GatewayState
from openforge.store import Store

CHAT = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
BODIES: dict[str, dict[str, Any]] = {
    "/chat/completions": CHAT,
    "/completions": {"model": "m", "prompt": "Once", "max_tokens": 8},
    "/responses": {"model": "m", "input": "hi"},
    "/messages": {"model": "m", "max_tokens": 16,
                  "messages": [{"role": "user", "content": "hi"}]},
    "/messages/count_tokens": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
}


@pytest.fixture
def app(tmp_path: Path, tiny_bundle: ModelBundle) -> Iterator[GatewayApp]:  # noqa: F811
    store = Store(tmp_path / "routing.sqlite")
    engine = plugins.create("engine", "scripted", model=tiny_bundle,
                            replies=[{"content": "ok"}] * 200)
    state = GatewayState(GatewayConfig(), store, engine, tiny_bundle,
                         base_url="http://testserver")
    yield create_app(state)
    store.close()


def both(app: GatewayApp, method: str, path: str, **kw: Any) -> tuple[Any, Any]:
    """The answers of the app and of its Starlette app alone to the same request."""
    with TestClient(app, raise_server_exceptions=False) as fast, \
            TestClient(app.starlette, raise_server_exceptions=False) as plain:
        return fast.request(method, path, **kw), plain.request(method, path, **kw)


def test_every_dialect_route_is_dispatched_directly(app: GatewayApp) -> None:
    paths = {p for d in DIALECTS.values() for p in (*d.paths, d.count_tokens_path) if p}
    assert paths == set(BODIES)  # a new dialect route needs a body here
    for suffix in paths:
        assert app._model_call({"type": "http", "method": "POST", "path": "/v1" + suffix}) \
            == (app.endpoints[suffix], None)
        assert app._model_call({"type": "http", "method": "POST",
                                "path": "/s/TOK/v1" + suffix}) == (app.endpoints[suffix], "TOK")
    for scope in ({"type": "http", "method": "GET", "path": "/v1/chat/completions"},
                  {"type": "http", "method": "POST", "path": "/v1/models"},
                  {"type": "http", "method": "POST", "path": "/admin/sessions"},
                  {"type": "http", "method": "POST", "path": "/s//v1/chat/completions"},
                  {"type": "http", "method": "POST", "path": "/s/TOK/v1/chat/completions/"},
                  {"type": "http", "method": "POST", "path": "/s/TOK/x/v1/chat/completions"},
                  {"type": "http", "method": "POST", "path": "/v1/chat/completions",
                   "root_path": "/api"},
                  {"type": "lifespan"}):
        assert app._model_call(scope) is None, scope


def test_model_calls_answer_as_through_starlette(app: GatewayApp) -> None:
    state: GatewayState = app.starlette.state.gateway
    session = state.sessions.open()
    auth = {"Authorization": f"Bearer {session.token}"}
    for suffix, body in BODIES.items():
        for path in (f"/s/{session.token}/v1{suffix}", f"/v1{suffix}"):
            fast, plain = both(app, "POST", path, json=body, headers=auth)
            assert fast.status_code == plain.status_code == 200, (path, fast.text, plain.text)
            assert fast.headers["content-type"] == plain.headers["content-type"]
            assert fast.json().keys() == plain.json().keys()
    # Each call above was recorded once, whichever way it came in (two prefixes, two apps;
    # counting tokens records nothing).
    assert len(state.store.list_calls(session.id)) == 2 * 2 * (len(BODIES) - 1)


@pytest.mark.parametrize(("method", "path", "headers", "content"), [
    ("POST", "/s/nosuch/v1/chat/completions", {}, b"{}"),  # unknown token: 401
    ("POST", "/v1/chat/completions", {}, b"{}"),  # no token at all
    ("POST", "/v1/chat/completions", {"Authorization": "Bearer a", "x-api-key": "b"}, b"{}"),
    ("POST", "/s/{token}/v1/chat/completions", {"Authorization": "Bearer other"}, b"{}"),
    ("POST", "/s/{token}/v1/chat/completions", {}, b"not json"),  # 400
    ("POST", "/s/{token}/v1/messages", {}, b'{"model": "m"}'),  # 400 in Anthropic's shape
    ("POST", "/s/{token}/v1/chat/completions", {"content-length": "999999999"}, b"{}"),
    ("GET", "/s/{token}/v1/chat/completions", {}, None),  # 405 from Starlette
    ("POST", "/s/{token}/v1/chat/completions/", {}, b"{}"),  # Starlette's slash redirect
    ("POST", "/s/{token}/v1/nosuch", {}, b"{}"),  # 404
    ("POST", "/s//v1/chat/completions", {}, b"{}"),
    ("GET", "/s/{token}/v1/models", {}, None),
])
def test_refusals_are_the_same_both_ways(app: GatewayApp, method: str, path: str,
                                         headers: dict[str, str], content: bytes | None) -> None:
    state: GatewayState = app.starlette.state.gateway
    token = state.sessions.open().token
    path = path.replace("{token}", token)
    fast, plain = both(app, method, path, headers=headers, content=content,
                       follow_redirects=False)
    assert fast.status_code == plain.status_code, (fast.text, plain.text)
    assert fast.content == plain.content


def test_a_bug_in_an_endpoint_is_a_500_that_names_it(app: GatewayApp,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    state: GatewayState = app.starlette.state.gateway
    session = state.sessions.open()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a gateway bug")

    monkeypatch.setattr(DIALECTS["chat"], "parse", broken)
    with TestClient(app, raise_server_exceptions=False) as tc:
        r = tc.post(f"/s/{session.token}/v1/chat/completions", json=CHAT)
    assert r.status_code == 500
    assert r.json()["error"]["message"] == (
        "internal gateway error (RuntimeError); see the gateway log")
    # As through Starlette: the exception also reaches the server, which logs it.
    with TestClient(app) as tc, pytest.raises(RuntimeError, match="a gateway bug"):
        tc.post(f"/s/{session.token}/v1/chat/completions", json=CHAT)
    assert state.store.list_calls(session.id) == []  # refused before any generation


async def test_a_stream_ends_in_the_message_that_carries_its_events(app: GatewayApp) -> None:
    """One write for the SSE events and the end of the chunked body, and the call is in
    the store once the app returns (its handler awaits the group commit)."""
    state: GatewayState = app.starlette.state.gateway
    session = state.sessions.open()
    body = json.dumps({**CHAT, "stream": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
             "raw_path": b"/v1/chat/completions", "root_path": "", "query_string": b"",
             "server": ("testserver", 80), "client": ("127.0.0.1", 1),
             "headers": [(b"authorization", f"Bearer {session.token}".encode()),
                         (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    requests = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if requests:
            return requests.pop()
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 200
    assert not sent[1].get("more_body") and sent[1]["body"].endswith(b"data: [DONE]\n\n")
    [call] = state.store.list_calls(session.id)
    assert call.status == "ok"
