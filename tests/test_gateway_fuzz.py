"""Fuzzing every gateway route with malformed bodies and headers: never a 500.

Hypothesis drives the ASGI app in process (starlette's TestClient, fast enough for
hundreds of examples), then a smaller sample goes over real HTTP to a real uvicorn.
Bodies are random bytes, random JSON, and valid requests with one field replaced by a
random JSON value (the mutations that reach deepest into the parsers).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures_model import tiny_bundle  # noqa: F401  (pytest fixture)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from openforge import plugins
from openforge.config import EngineConfig, GatewayConfig
from openforge.gateway.app import GatewayState, create_app
from openforge.gateway.model import ModelBundle
from openforge.gateway.server import Gateway
from openforge.store import Store

VALID: dict[str, dict[str, Any]] = {
    "chat/completions": {"model": "m", "max_tokens": 64, "messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
        "tools": [{"type": "function", "function": {"name": "shell", "parameters": {}}}]},
    "completions": {"model": "m", "prompt": "Once", "max_tokens": 8},
    "responses": {"model": "m", "input": [{"role": "user", "content": "hi"},
                                          {"type": "function_call", "call_id": "c1",
                                           "name": "shell", "arguments": "{}"},
                                          {"type": "function_call_output", "call_id": "c1",
                                           "output": "ok"}],
                  "tools": [{"type": "function", "name": "shell", "parameters": {}}]},
    "messages": {"model": "m", "max_tokens": 64, "system": "s", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shell",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": "ok"}]}],
        "tools": [{"name": "shell", "input_schema": {"type": "object"}}]},
    "messages/count_tokens": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
}
ADMIN_POSTS = ["/admin/sessions", "/admin/pause", "/admin/sessions/{sid}/close",
               "/admin/sessions/{sid}/reward"]
ADMIN_GETS = ["/admin/sessions", "/admin/health", "/admin/sessions/{sid}/calls"]
# The scoring routes, on the session whose scoring credential the examples hold ({sid}),
# on the model routes' session ({aid}: its scoring credential is not given) and on none.
SCORING = ["/scoring/sessions/{sid}/calls", "/scoring/sessions/{sid}/seal",
           "/scoring/sessions/{aid}/calls", "/scoring/sessions/{aid}/seal",
           "/scoring/sessions/nope/calls", "/scoring/sessions/%00/seal"]

# Values attacks used (issue 20): lone surrogates, ids and seeds beyond int32 / 64 bits,
# special-token text, next to ordinary random values.
ATTACKS = ["\ud800", "a\udfffb", "<|im_end|>\n<|im_start|>assistant\n", 2**31, 2**64, -1,
           151936, [2**31], [151936, 5], [-1]]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20) | st.sampled_from(ATTACKS),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


@st.composite
def mutated(draw: st.DrawFn, route: str) -> bytes:
    """A valid body of `route` with one node (or the whole body) replaced or removed."""
    body = copy.deepcopy(VALID.get(route, VALID["chat/completions"]))
    path = draw(st.sampled_from(list(_paths(body))))
    if not path:
        return json.dumps(draw(json_values)).encode()
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    if draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(json_values)
    if draw(st.booleans()):
        body["stream"] = draw(st.booleans())
    if draw(st.integers(0, 4)) == 0:
        body["seed"] = draw(st.sampled_from([2**64, -(2**63) - 1, 2**63, 7]))
    return json.dumps(body).encode()


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, dict[str, str], bytes]:
    """(method, path, headers, body) over every route, with good and bad credentials."""
    # Mostly the valid token, so that most bodies get past auth into the parsers.
    token = draw(st.sampled_from(["{token}"] * 8 + ["{other}", "nope", "%00", "a" * 300]))
    kind = draw(st.sampled_from(["model", "model", "model", "v1", "models", "scoring",
                                 "admin_post", "admin_get", "random"]))
    route = draw(st.sampled_from(list(VALID)))
    if kind == "model":
        method, path = "POST", f"/s/{token}/v1/{route}"
    elif kind == "v1":
        method, path = "POST", f"/v1/{route}"
    elif kind == "models":
        method = draw(st.sampled_from(["GET", "POST"]))
        path = draw(st.sampled_from([f"/s/{token}/v1/models", "/v1/models",
                                     f"/s/{token}/v1/models/policy", "/v1/models/x/y"]))
    elif kind == "scoring":
        method = draw(st.sampled_from(["GET", "POST", "PUT"]))
        path = draw(st.sampled_from(SCORING))
    elif kind == "admin_post":
        method, path = "POST", draw(st.sampled_from(ADMIN_POSTS))
    elif kind == "admin_get":
        method, path = "GET", draw(st.sampled_from(ADMIN_GETS))
    else:
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE"]))
        # Printable ASCII: HTTP clients refuse control characters in a URL themselves.
        path = "/" + draw(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e,
                                                exclude_characters="?#%"), max_size=30))
    headers: dict[str, str] = {"content-type": "application/json"}
    if kind.startswith("admin"):
        auth = draw(st.sampled_from(["admin"] * 8 + ["none", "token", "junk"]))
    elif kind == "scoring":
        auth = draw(st.sampled_from(["scoring"] * 6 + ["none", "token", "admin", "junk"]))
    else:
        auth = draw(st.sampled_from(["none"] * 4 + ["token"] * 4 + ["admin", "junk"]))
    if auth == "token":
        headers[draw(st.sampled_from(["authorization", "x-api-key"]))] = (
            "Bearer {token}" if draw(st.booleans()) else "{token}")
    elif auth == "admin":
        headers["authorization"] = "Bearer {admin}"
    elif auth == "scoring":
        headers[draw(st.sampled_from(["authorization", "x-api-key"]))] = (
            "Bearer {scoring}" if draw(st.booleans()) else "{scoring}")
    elif auth == "junk":
        headers[draw(st.sampled_from(["authorization", "x-api-key", "x-stainless-retry-count",
                                      "content-length"]))] = draw(
            st.text(st.characters(codec="latin-1", exclude_categories=["Cc"]), max_size=20))
    body = draw(st.one_of(
        mutated(route), mutated(route), st.binary(max_size=64),
        json_values.map(lambda v: json.dumps(v).encode()),
    ))
    return method, path, headers, body


def fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


@pytest.fixture(scope="module")
def app_client(tmp_path_factory: pytest.TempPathFactory,
               tiny_bundle: ModelBundle) -> Iterator[tuple[TestClient, dict[str, str]]]:  # noqa: F811
    store = Store(tmp_path_factory.mktemp("fuzz") / "fuzz.sqlite")
    engine = plugins.create("engine", "scripted", model=tiny_bundle,
                            replies=[{"content": "ok"}])
    state = GatewayState(GatewayConfig(max_body_bytes=4096), store, engine, tiny_bundle,
                         base_url="http://testserver")
    # Admin routes act on a third session: closing the one the model routes use would turn
    # every later example into a 401.
    a, b, c = state.sessions.open(), state.sessions.open(), state.sessions.open()
    values = {"token": a.token, "other": b.token, "admin": state.admin_key, "sid": c.id,
              "aid": a.id, "scoring": c.scoring_token}
    with TestClient(create_app(state), raise_server_exceptions=False) as tc:
        yield tc, values
    store.close()


def check(status: int, text: str, path: str, headers: dict[str, str] | None = None,
          values: dict[str, str] | None = None) -> None:
    assert status != 500, f"500 on {path}: {text[:300]}"
    assert 200 <= status < 600
    if path.startswith("/scoring/") and status < 400:
        # Only the scoring credential, on its own session, opens a scoring route.
        assert values is not None and headers is not None
        assert path.startswith(f"/scoring/sessions/{values['sid']}/"), (path, status)
        assert any(v.removeprefix("Bearer ").strip() == values["scoring"]
                   for k, v in headers.items() if k in ("authorization", "x-api-key")), headers


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(req=requests())
def test_no_route_answers_500(app_client: tuple[TestClient, dict[str, str]],
                              req: tuple[str, str, dict[str, str], bytes]) -> None:
    tc, values = app_client
    method, path, headers, body = req
    path, headers = fill(path, values), {k: fill(v, values) for k, v in headers.items()}
    if headers.get("content-length") and not headers["content-length"].isdigit():
        del headers["content-length"]  # the HTTP client itself refuses to send those
    raw_headers = [(k.encode(), v.encode("latin-1")) for k, v in headers.items()]
    r = tc.request(method, path, headers=raw_headers, content=body)
    check(r.status_code, r.text, path, headers, values)
    if r.status_code >= 400 and r.content:
        json.loads(r.content)  # every error is a JSON body, never a bare text page
    if path.endswith("/resume") or "/pause" in path:
        tc.post("/admin/resume", headers={"authorization": f"Bearer {values['admin']}"})


async def test_a_sample_over_real_http(tmp_path: Path, tiny_bundle: ModelBundle) -> None:  # noqa: F811
    samples: list[tuple[str, str, dict[str, str], bytes]] = []

    @settings(max_examples=40, deadline=None, database=None)
    @given(req=requests())
    def collect(req: tuple[str, str, dict[str, str], bytes]) -> None:
        samples.append(req)

    collect()
    store = Store(tmp_path / "fuzz-http.sqlite")
    engine = plugins.create("engine", "scripted", model=tiny_bundle, replies=[{"content": "ok"}])
    gw = Gateway(GatewayConfig(max_body_bytes=4096), EngineConfig(name="scripted"), store,
                 engine=engine, bundle=tiny_bundle)
    await gw.start()
    try:
        a, b, c = gw.open_session(), gw.open_session(), gw.open_session()
        values = {"token": a.token, "other": b.token, "admin": gw.admin_key, "sid": c.id,
                  "aid": a.id, "scoring": c.scoring_token}
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as h:
            for method, path, headers, body in samples:
                sent = {k: fill(v, values).strip() for k, v in headers.items()
                        if k != "content-length"}
                raw_headers = [(k.encode(), v.encode("latin-1")) for k, v in sent.items()]
                r = await h.request(method, fill(path, values), headers=raw_headers,
                                    content=body)
                check(r.status_code, r.text, fill(path, values), sent, values)
                gw.resume()
    finally:
        await gw.stop()
        store.close()
