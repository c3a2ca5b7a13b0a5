"""The gateway app over real HTTP: recording, branches, auth, admin API, limits, failures.

A real uvicorn server on a free 127.0.0.1 port, the scripted engine on the tiny Qwen3
tokenizer, a real SQLite store. Clients are the official `openai` SDK where the behaviour
is about a harness's view, and plain httpx where the test needs raw status codes/headers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from fixtures_model import tiny_bundle  # noqa: F401  (pytest fixture)

from openforge import plugins
from openforge.config import EngineConfig, GatewayConfig
from openforge.gateway.conversation import Completion, Message
from openforge.gateway.engines.base import Engine, GenerateRequest, GenerateResult
from openforge.gateway.model import ModelBundle
from openforge.gateway.server import Gateway
from openforge.store import Store
from openforge.types import Call, Session

SHELL = {"type": "function", "function": {
    "name": "shell", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                   "required": ["cmd"]}}}


def tool_replies(n_tools: int, final: str = "All done.") -> list[dict[str, Any]]:
    return ([{"tool_calls": [{"name": "shell", "arguments": {"cmd": f"step {i}"}}]}
             for i in range(n_tools)] + [{"content": final}])


async def start_gateway(store: Store, bundle: ModelBundle, **options: Any) -> Gateway:
    gw_options = {k[3:]: options.pop(k) for k in list(options) if k.startswith("gw_")}
    engine = plugins.create("engine", "scripted", model=bundle, **options)
    gateway = Gateway(GatewayConfig(**gw_options), EngineConfig(name="scripted"), store,
                      engine=engine, bundle=bundle)
    await gateway.start()
    return gateway


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "gw.sqlite")
    yield s
    s.close()


@pytest.fixture
async def gateway(store: Store, tiny_bundle: ModelBundle) -> AsyncIterator[Gateway]:  # noqa: F811
    gw = await start_gateway(store, tiny_bundle, replies=tool_replies(9))
    yield gw
    await gw.stop()


def client(gw: Gateway, session: Session, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.session_url(session), api_key=session.token, **kw)


def anthropic_client(gw: Gateway, session: Session) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=f"{gw.url}/s/{session.token}",
                                    api_key=session.token, max_retries=0)


async def run_tool_conversation(c: openai.AsyncOpenAI, first: str, max_turns: int = 20,
                                system: str = "You are an agent.") -> list[dict[str, Any]]:
    """Drive a harness-like tool loop until the model answers without tool calls."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                      {"role": "user", "content": first}]
    for _ in range(max_turns):
        r = await c.chat.completions.create(model="policy", messages=messages, tools=[SHELL])
        msg = r.choices[0].message
        if not msg.tool_calls:
            messages.append({"role": "assistant", "content": msg.content})
            return messages
        assert r.choices[0].finish_reason == "tool_calls"
        messages.append({"role": "assistant", "content": msg.content or "",
                         "tool_calls": [tc.model_dump() for tc in msg.tool_calls]})
        for tc in msg.tool_calls:
            cmd = json.loads(tc.function.arguments)["cmd"]
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": f"ran {cmd}"})
    raise AssertionError("the conversation did not end")


def stored_prompts(store: Store, session_id: str) -> list[tuple[str | None, int]]:
    """Each call's row as stored, in order: the call its prompt is stored against, and the
    number of ids its prompt_ids blob holds."""
    return [(base, size // 4) for base, size in store._conn().execute(
        "SELECT prompt_base, LENGTH(prompt_ids) FROM calls WHERE session_id = ? ORDER BY idx",
        (session_id,))]


def assert_matches_engine_log(gw: Gateway, calls: list[Call]) -> None:
    """Every recorded call holds exactly what the engine received and produced."""
    by_id = {e.request_id: e for e in gw.engine.log}
    for call in calls:
        if call.status != "ok":
            continue
        entry = by_id[call.id]
        assert call.prompt_ids == entry.prompt_ids
        assert call.completion_ids == entry.completion_ids
        assert call.logprobs == entry.logprobs
        assert len(call.logprobs) == len(call.completion_ids)


# --- recording and branches ---------------------------------------------------------------


async def test_ten_turn_tool_conversation_stays_on_one_branch(gateway: Gateway, store: Store) -> None:
    session = gateway.open_session(run_id="run1", task_id="t1")
    # A harness-sized system prompt: its bodies are large enough to be stored compressed.
    system = "You are an agent. " + "Read before you edit; test after. " * 150
    messages = await run_tool_conversation(client(gateway, session), "do ten steps",
                                           system=system)
    assert messages[-1]["content"] == "All done."
    calls = store.list_calls(session.id)
    assert len(calls) == 10
    assert [c.index for c in calls] == list(range(10))
    assert {c.branch for c in calls} == {0} and all(c.branch_reason is None for c in calls)
    for prev, call in zip(calls, calls[1:], strict=False):
        context = prev.prompt_ids + prev.completion_ids
        assert call.prompt_ids[:len(context)] == context  # token-for-token extension
        assert len(call.prompt_ids) > len(context)
    assert_matches_engine_log(gateway, calls)
    # Stored as it grew: each call's row holds only the ids after the call before it.
    stored = stored_prompts(store, session.id)
    assert stored[0] == (None, len(calls[0].prompt_ids))
    for prev, call, (base, n) in zip(calls[:-1], calls[1:], stored[1:], strict=True):
        assert (base, n) == (prev.id, len(call.prompt_ids) - len(prev.prompt_ids)
                             - len(prev.completion_ids))
    # So is each request body after the first, against the body before; every body reads
    # back as sent.
    request_bases = [row[0] for row in store._conn().execute(
        "SELECT request_base FROM calls WHERE session_id = ? ORDER BY idx", (session.id,))]
    assert request_bases == [None, *(c.id for c in calls[:-1])]
    assert calls[-1].request["messages"] == messages[:-1]  # all but the final answer
    assert [len(c.request["messages"]) for c in calls] == list(range(2, 21, 2))
    first = calls[0]
    assert first.dialect == "chat" and first.status == "ok" and first.exact_tokens
    assert first.finish_reason == "tool_calls" and calls[-1].finish_reason == "stop"
    assert first.weight_version == "scripted"
    assert first.request["messages"][1]["content"] == "do ten steps"
    assert first.response is not None and first.response["choices"][0]["message"]["tool_calls"]
    assert len(first.body_digest) == 64 and first.started_at <= first.finished_at


async def test_rewritten_history_opens_exactly_one_branch(gateway: Gateway, store: Store) -> None:
    session = gateway.open_session()
    c = client(gateway, session)
    messages = [{"role": "system", "content": "You are an agent."},
                {"role": "user", "content": "start"}]
    for _ in range(3):
        r = await c.chat.completions.create(model="policy", messages=messages, tools=[SHELL])
        tc = r.choices[0].message.tool_calls[0]
        messages += [{"role": "assistant", "content": "", "tool_calls": [tc.model_dump()]},
                     {"role": "tool", "tool_call_id": tc.id, "content": "ok"}]
    # Compaction: the harness drops the middle of its history and carries on twice.
    rewritten = messages[:2] + [{"role": "user", "content": "summary: three steps ran"}]
    for _ in range(2):
        r = await c.chat.completions.create(model="policy", messages=rewritten, tools=[SHELL])
        tc = r.choices[0].message.tool_calls[0]
        rewritten += [{"role": "assistant", "content": "", "tool_calls": [tc.model_dump()]},
                      {"role": "tool", "tool_call_id": tc.id, "content": "ok"}]
    calls = store.list_calls(session.id)
    assert [c.branch for c in calls] == [0, 0, 0, 1, 1]
    assert calls[3].branch_reason == "history_rewritten"
    assert_matches_engine_log(gateway, calls)


async def test_restart_rebuilds_branch_state_from_the_store(
        store: Store, tiny_bundle: ModelBundle) -> None:  # noqa: F811
    gw = await start_gateway(store, tiny_bundle, replies=tool_replies(9))
    session = gw.open_session()
    messages = [{"role": "system", "content": "You are an agent."},
                {"role": "user", "content": "go"}]
    c = client(gw, session)
    for _ in range(2):
        r = await c.chat.completions.create(model="policy", messages=messages, tools=[SHELL])
        tc = r.choices[0].message.tool_calls[0]
        messages += [{"role": "assistant", "content": "", "tool_calls": [tc.model_dump()]},
                     {"role": "tool", "tool_call_id": tc.id, "content": "ok"}]
    await gw.stop()
    # A new gateway process on the same store knows nothing but what the store holds.
    gw2 = await start_gateway(store, tiny_bundle, replies=tool_replies(9))
    try:
        c2 = openai.AsyncOpenAI(base_url=f"{gw2.url}/s/{session.token}/v1", api_key=session.token)
        await c2.chat.completions.create(model="policy", messages=messages, tools=[SHELL])
    finally:
        await gw2.stop()
    calls = store.list_calls(session.id)
    assert [c.index for c in calls] == [0, 1, 2]
    assert [c.branch for c in calls] == [0, 0, 0]
    context = calls[1].prompt_ids + calls[1].completion_ids
    assert calls[2].prompt_ids[:len(context)] == context
    # The rebuilt branch knows which stored call it ends with: the new call is stored
    # against it.
    assert [base for base, _ in stored_prompts(store, session.id)] == [None, calls[0].id,
                                                                        calls[1].id]


# --- auth ---------------------------------------------------------------------------------


async def test_calls_are_read_with_the_scoring_credential_never_a_session_token(
        gateway: Gateway, store: Store) -> None:
    mine, theirs = gateway.open_session(), gateway.open_session()
    for session in (mine, theirs):
        await client(gateway, session).chat.completions.create(
            model="p", messages=[{"role": "user", "content": session.id}])
    route = f"/scoring/sessions/{mine.id}/calls"
    async with httpx.AsyncClient(base_url=gateway.url) as h:
        r = await h.get(route, headers={"authorization": f"Bearer {mine.scoring_token}"})
        assert r.status_code == 200
        assert [c["session_id"] for c in r.json()["calls"]] == [mine.id]
        # The agent's own token, a sibling's scoring credential, the admin key, nothing,
        # an unknown session: the same 401.
        refused = [
            await h.get(route, headers={"authorization": f"Bearer {mine.token}"}),
            await h.get(route, headers={"authorization": f"Bearer {theirs.scoring_token}"}),
            await h.get(route, headers={"authorization": f"Bearer {gateway.admin_key}"}),
            await h.get(route),
            await h.get("/scoring/sessions/nope/calls",
                        headers={"authorization": f"Bearer {mine.scoring_token}"}),
        ]
        assert {x.status_code for x in refused} == {401}
        assert len({x.content for x in refused}) == 1
        # Sealing (the supervisor, once its agent ended) needs the scoring credential too,
        # and then the session takes no more model calls; its calls stay readable.
        seal = f"/scoring/sessions/{mine.id}/seal"
        assert (await h.post(seal, headers={"authorization": f"Bearer {mine.token}"})
                ).status_code == 401
        assert (await h.post(seal, headers={"authorization": f"Bearer {mine.scoring_token}"})
                ).status_code == 200
        late = await h.post(f"/s/{mine.token}/v1/chat/completions",
                            json={"model": "p", "messages": [{"role": "user", "content": "x"}]})
        assert late.status_code == 401
        again = await h.get(route, headers={"authorization": f"Bearer {mine.scoring_token}"})
        assert len(again.json()["calls"]) == 1
        # The routes that once let a token read calls or write a result are gone.
        assert (await h.get(f"/s/{mine.token}/calls")).status_code == 404
        forged = {"rollout_id": "r1", "status": "ok", "reward": {"score": 1.0, "passed": True}}
        assert (await h.post(f"/s/{mine.token}/result", json=forged)).status_code == 404
    assert store.get_result(mine.id) is None


async def test_a_token_reaches_only_its_own_session(gateway: Gateway, store: Store) -> None:
    a, b = gateway.open_session(), gateway.open_session()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=gateway.url) as h:
        ok = await h.post(f"/s/{a.token}/v1/chat/completions", json=body)
        assert ok.status_code == 200
        # An unknown token, no key on /v1, an unknown key: the very same 401.
        answers = [
            await h.post("/s/not-a-token/v1/chat/completions", json=body),
            await h.post("/v1/chat/completions", json=body),
            await h.post("/v1/chat/completions", json=body, headers={"x-api-key": "nope"}),
        ]
        assert {r.status_code for r in answers} == {401}
        assert len({r.content for r in answers}) == 1
        assert answers[0].json()["error"]["type"] == "authentication_error"
        # Credentials that disagree: a 401 that says so, the same whether or not either
        # token is a session's (nothing learnt about sessions).
        mismatches = [
            await h.post(f"/s/{a.token}/v1/chat/completions", json=body,
                         headers={"authorization": f"Bearer {b.token}"}),
            await h.post("/s/not-a-token/v1/chat/completions", json=body,
                         headers={"x-api-key": "nope"}),
            await h.post("/v1/chat/completions", json=body,
                         headers={"authorization": f"Bearer {a.token}", "x-api-key": b.token}),
        ]
        assert {r.status_code for r in mismatches} == {401}
        assert "API key is not the session token of the URL path" in mismatches[0].text
        assert mismatches[0].content == mismatches[1].content
        assert "Authorization and x-api-key headers carry different keys" in mismatches[2].text
        same = await h.post("/v1/chat/completions", json=body,
                            headers={"authorization": f"Bearer {a.token}", "x-api-key": a.token})
        assert same.status_code == 200
        # The key alone works on /v1 (Authorization or x-api-key).
        via_key = await h.post("/v1/chat/completions", json=body,
                               headers={"x-api-key": b.token})
        assert via_key.status_code == 200
        # Closing a session revokes its token at once.
        admin = {"authorization": f"Bearer {gateway.admin_key}"}
        assert (await h.post(f"/admin/sessions/{a.id}/close", headers=admin)).status_code == 200
        closed = await h.post(f"/s/{a.token}/v1/chat/completions", json=body)
        assert closed.status_code == 401 and closed.content == answers[0].content
        # In process, as the runner does it.
        assert gateway.close_session(b.id) is not None
        assert (await h.post("/v1/chat/completions", json=body,
                             headers={"x-api-key": b.token})).status_code == 401
        assert gateway.close_session("no-such-session") is None
    assert len(store.list_calls(a.id)) == 2 and len(store.list_calls(b.id)) == 1


async def test_anthropic_style_base_url_and_errors(gateway: Gateway) -> None:
    session = gateway.open_session()
    body = {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=gateway.url) as h:
        # Claude Code: ANTHROPIC_BASE_URL=.../s/TOKEN, it appends /v1/messages?beta=true.
        r = await h.post(f"/s/{session.token}/v1/messages?beta=true", json=body,
                         headers={"x-api-key": session.token, "anthropic-version": "2023-06-01"})
        assert r.status_code == 200 and r.json()["type"] == "message"
        assert r.json()["model"] == "claude-x"  # any model name is accepted and echoed
        bad = await h.post(f"/s/{session.token}/v1/messages", json=body,
                           headers={"x-api-key": "someone-else"})
        assert bad.status_code == 401 and bad.json()["type"] == "error"
        n = await h.post(f"/s/{session.token}/v1/messages/count_tokens",
                         json={"model": "x", "messages": [{"role": "user", "content": "hi"}]})
        assert n.status_code == 200 and n.json()["input_tokens"] > 0


async def test_admin_api_needs_the_key_and_manages_sessions(gateway: Gateway, store: Store) -> None:
    admin = {"authorization": f"Bearer {gateway.admin_key}"}
    async with httpx.AsyncClient(base_url=gateway.url) as h:
        for method, path in [("POST", "/admin/sessions"), ("GET", "/admin/sessions"),
                             ("GET", "/admin/health"), ("POST", "/admin/pause"),
                             ("POST", "/admin/resume"), ("POST", "/admin/sessions/x/close"),
                             ("GET", "/admin/sessions/x/calls")]:
            for headers in ({}, {"authorization": "Bearer wrong"}):
                r = await h.request(method, path, headers=headers)
                assert r.status_code == 401, (method, path)
        opened = await h.post("/admin/sessions", headers=admin,
                              json={"run_id": "r9", "task_id": "t", "sampling": {"temperature": 0.5},
                                    "metadata": {"k": 1}})
        assert opened.status_code == 200
        info = opened.json()
        assert info["base_url"] == f"{gateway.url}/s/{info['token']}/v1"
        assert (await h.post("/admin/sessions", headers=admin, json={"nope": 1})).status_code == 422
        c = openai.AsyncOpenAI(base_url=info["base_url"], api_key=info["token"])
        await c.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
        listed = (await h.get("/admin/sessions", params={"run_id": "r9"}, headers=admin)).json()
        assert [s["id"] for s in listed["sessions"]] == [info["id"]]
        calls = (await h.get(f"/admin/sessions/{info['id']}/calls", headers=admin)).json()["calls"]
        assert len(calls) == 1 and calls[0]["sampling"]["temperature"] == 0.5
        r = await h.post(f"/admin/sessions/{info['id']}/reward", headers=admin,
                         json={"reward": 0.75, "details": {"checks": 2}})
        assert r.status_code == 200
        assert (await h.post("/admin/sessions/none/reward", headers=admin,
                             json={"reward": 1})).status_code == 404
        health = (await h.get("/admin/health", headers=admin)).json()
        assert health["ok"] and health["cached_token_bytes"] > 0
        closed = await h.post(f"/admin/sessions/{info['id']}/close", headers=admin)
        assert closed.json()["status"] == "closed"
    stored = store.get_session(info["id"])
    assert stored is not None and stored.reward == 0.75 and stored.metadata == {"k": 1}


async def test_models_routes(gateway: Gateway) -> None:
    session = gateway.open_session()
    c = client(gateway, session)
    models = await c.models.list()
    assert [m.id for m in models.data] == ["policy"]
    assert (await c.models.retrieve("policy")).id == "policy"
    with pytest.raises(openai.NotFoundError):
        await c.models.retrieve("gpt-9")


# --- pause, limits, bad input ---------------------------------------------------------------


async def test_pause_answers_429_with_retry_after_until_resume(gateway: Gateway) -> None:
    session = gateway.open_session()
    admin = {"authorization": f"Bearer {gateway.admin_key}"}
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    msgs = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=f"{gateway.url}/s/{session.token}/v1") as h:
        r = await h.post(f"{gateway.url}/admin/pause", json={"retry_after": 7}, headers=admin)
        assert r.json() == {"paused": True, "retry_after": 7}
        r = await h.post("/chat/completions", json=chat)
        assert r.status_code == 429 and r.headers["retry-after"] == "7"
        assert r.json()["error"]["type"] == "rate_limit_error"
        r = await h.post("/messages", json=msgs)
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        assert (await h.post(f"{gateway.url}/admin/resume", headers=admin)).status_code == 200
        assert (await h.post("/chat/completions", json=chat)).status_code == 200


async def test_sdk_waits_out_a_pause(gateway: Gateway) -> None:
    session = gateway.open_session()
    gateway.pause(retry_after_s=1)
    c = client(gateway, session, max_retries=3)
    asyncio.get_running_loop().call_later(0.3, gateway.resume)
    r = await c.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message is not None


async def test_oversized_body_is_413(store: Store, tiny_bundle: ModelBundle) -> None:  # noqa: F811
    gw = await start_gateway(store, tiny_bundle, replies=[{"content": "ok"}], gw_max_body_bytes=2000)
    try:
        session = gw.open_session()
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
        async with httpx.AsyncClient(base_url=gw.url) as h:
            r = await h.post(f"/s/{session.token}/v1/chat/completions", json=big)
            assert r.status_code == 413 and "2000 bytes" in r.json()["error"]["message"]

            async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it streams
                for _ in range(10):
                    yield b" " * 500

            r = await h.post(f"/s/{session.token}/v1/messages", content=chunks())
            assert r.status_code == 413 and r.json()["type"] == "error"
            r = await h.post("/admin/sessions", content=b"{" + b" " * 3000 + b"}",
                             headers={"authorization": f"Bearer {gw.admin_key}"})
            assert r.status_code == 413
        assert store.list_calls(session.id) == []
    finally:
        await gw.stop()


@pytest.mark.parametrize("route,body", [
    ("chat/completions", b"{not json"),
    ("chat/completions", b""),
    ("chat/completions", b"[1, 2]"),
    ("chat/completions", b'{"messages": "hi"}'),
    ("chat/completions", b'{"messages": []}'),
    ("completions", b'{"prompt": 5}'),
    ("responses", b'{"input": 5}'),
    ("messages", b'{"messages": [{"role": "user", "content": "x"}]}'),  # no max_tokens
    ("messages", b"\xff\xfe"),
    ("chat/completions", b'{"messages": [{"role": "tool", "tool_call_id": "x", "content": "r"}]}'),
])
async def test_malformed_bodies_are_4xx_in_the_dialects_format(
        gateway: Gateway, store: Store, route: str, body: bytes) -> None:
    session = gateway.open_session()
    async with httpx.AsyncClient(base_url=f"{gateway.url}/s/{session.token}/v1") as h:
        r = await h.post(f"/{route}", content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    payload = r.json()
    if route == "messages":
        assert payload["type"] == "error" and payload["error"]["message"]
    else:
        assert payload["error"]["message"]
    assert store.list_calls(session.id) == []


# --- engine failures, keep-alive, disconnects -------------------------------------------------


async def test_engine_errors_are_503_and_each_retry_is_recorded_once(
        store: Store, tiny_bundle: ModelBundle) -> None:  # noqa: F811
    gw = await start_gateway(store, tiny_bundle, entries=[
        {"match": "explode", "replies": [{"error": "GPU on fire", "status": 503}]},
        {"match": "too long", "replies": [{"error": "maximum context length", "status": 400}]},
        {"replies": [{"content": "fine"}]}])
    try:
        session = gw.open_session()
        c = client(gw, session, max_retries=2)
        with pytest.raises(openai.InternalServerError) as info:
            await c.chat.completions.create(model="p", messages=[{"role": "user", "content": "explode"}])
        assert info.value.status_code == 503 and "GPU on fire" in str(info.value)
        r = await c.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])
        assert r.choices[0].message.content == "fine"
        # Streaming: a failure before the first keep-alive is still a proper status.
        async with httpx.AsyncClient(base_url=gw.url) as h:
            s = await h.post(f"/s/{session.token}/v1/messages", json={
                "model": "m", "max_tokens": 9, "stream": True,
                "messages": [{"role": "user", "content": "explode"}]})
            assert s.status_code == 503 and s.json()["error"]["type"] == "overloaded_error"
        # The engine's refusal of the request itself is the client's 4xx, not retried.
        with pytest.raises(openai.BadRequestError):
            await c.chat.completions.create(model="p", messages=[
                {"role": "user", "content": "too long"}])
    finally:
        await gw.stop()
    calls = store.list_calls(session.id)
    # Each with the status the client got (whose fault a failure was: openforge.attribution).
    assert [(c.status, c.retry_count, c.http_status) for c in calls] == [
        ("failed", 0, 503), ("failed", 1, 503), ("failed", 2, 503), ("ok", 0, 200),
        ("failed", 0, 503), ("failed", 0, 400)]
    assert all("GPU on fire" in (c.error or "") for c in calls if c.http_status == 503)
    assert "maximum context length" in (calls[-1].error or "")
    assert calls[0].completion_ids == [] and calls[0].prompt_ids
    assert len({c.id for c in calls}) == 6


async def test_keepalive_comments_while_the_engine_is_slow(
        store: Store, tiny_bundle: ModelBundle) -> None:  # noqa: F811
    gw = await start_gateway(store, tiny_bundle, replies=[{"content": "slow answer"}],
                             delay_s=0.5, gw_keepalive_s=0.1)
    try:
        session = gw.open_session()
        async with httpx.AsyncClient(base_url=gw.url) as h:
            r = await h.post(f"/s/{session.token}/v1/chat/completions", json={
                "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
        text = r.text
        assert text.startswith(": keep-alive\n\n") and text.count(": keep-alive") >= 2
        assert "slow answer" in "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            for line in text.splitlines()
            if line.startswith("data: {") and json.loads(line[6:])["choices"])
        assert text.rstrip().endswith("data: [DONE]")
        assert len(store.list_calls(session.id)) == 1
    finally:
        await gw.stop()


async def test_a_client_that_disconnects_cancels_and_leaves_no_record(
        store: Store, tiny_bundle: ModelBundle) -> None:  # noqa: F811
    gw = await start_gateway(store, tiny_bundle, replies=[{"content": "never seen"}],
                             delay_s=1.0, gw_keepalive_s=0.1)
    try:
        session = gw.open_session()
        base = f"/s/{session.token}/v1"
        async with httpx.AsyncClient(base_url=gw.url) as h:
            # Streaming: read the first keep-alive, then hang up.
            async with h.stream("POST", f"{base}/chat/completions", json={
                    "model": "m", "stream": True,
                    "messages": [{"role": "user", "content": "a"}]}) as r:
                async for chunk in r.aiter_bytes():
                    assert chunk.startswith(b": keep-alive")
                    break
            # Not streaming: give up before the engine answers.
            with pytest.raises(httpx.ReadTimeout):
                await h.post(f"{base}/chat/completions", timeout=0.3, json={
                    "model": "m", "messages": [{"role": "user", "content": "b"}]})
        await asyncio.sleep(1.2)  # long enough for an uncancelled generation to finish
        assert store.list_calls(session.id) == []
        assert len(gw.engine.log) == 0  # both generations were cancelled mid-way
        served = await gw.served()
        assert (served["disconnected"], served["ok"], served["failed"]) == (2, 0, 0)
    finally:
        await gw.stop()


async def test_health_counts_what_was_served_by_outcome(
        store: Store, tiny_bundle: ModelBundle) -> None:  # noqa: F811
    gw = await start_gateway(store, tiny_bundle, entries=[
        {"match": "break", "replies": [{"error": "engine lost", "status": 502}]},
        {"replies": [{"content": "fine"}]}])
    admin = {"authorization": f"Bearer {gw.admin_key}"}
    try:
        session = gw.open_session()
        base = f"/s/{session.token}/v1/chat/completions"
        async with httpx.AsyncClient(base_url=gw.url) as h:
            before = (await h.get("/admin/health", headers=admin)).json()["served"]
            for text, status in [("hi", 200), ("hi again", 200), ("please break", 502)]:
                r = await h.post(base, json={"model": "m", "messages": [
                    {"role": "user", "content": text}]})
                assert r.status_code == status, r.text
            assert (await h.post(base, content=b"{not json")).status_code == 400
            assert (await h.post("/s/nope/v1/chat/completions", json={})).status_code == 401
            gw.pause()
            assert (await h.post(base, json={"model": "m", "messages": []})).status_code == 429
            gw.resume()
            served = (await h.get("/admin/health", headers=admin)).json()["served"]
    finally:
        await gw.stop()
    after = await gw.served()  # what `openforge serve` prints when it stops
    assert {k: after[k] for k in ("ok", "failed", "refused_by_status")} == {
        k: served[k] for k in ("ok", "failed", "refused_by_status")}
    calls = store.list_calls(session.id)
    assert sorted(c.status for c in calls) == ["failed", "ok", "ok"]
    assert before["ok"] == before["failed"] == before["refused"] == 0
    assert (served["ok"], served["failed"], served["disconnected"]) == (2, 1, 0)
    assert served["refused"] == 3
    assert served["refused_by_status"] == {"400": 1, "401": 1, "429": 1}
    assert served["prompt_tokens"] == sum(len(c.prompt_ids) for c in calls) > 0
    assert served["completion_tokens"] == sum(len(c.completion_ids) for c in calls) > 0
    # The process's CPU since it began serving, and that per recorded call (ok or failed).
    assert served["cpu_s"] > 0 and served["uptime_s"] > 0
    assert served["cpu_ms_per_call"] == pytest.approx(1000 * served["cpu_s"] / 3, abs=1e-3)


async def test_a_failure_after_the_stream_started_ends_it_with_an_error_event(
        store: Store, tiny_bundle: ModelBundle) -> None:  # noqa: F811
    gw = await start_gateway(store, tiny_bundle, replies=[{"error": "engine lost", "status": 502}],
                             delay_s=0.3, gw_keepalive_s=0.05)
    try:
        session = gw.open_session()
        c = anthropic_client(gw, session)
        with pytest.raises(anthropic.APIStatusError, match="engine lost"):
            async with c.messages.stream(model="m", max_tokens=9,
                                         messages=[{"role": "user", "content": "hi"}]) as s:
                await s.get_final_message()
    finally:
        await gw.stop()
    calls = store.list_calls(session.id)
    assert [(c.status, c.dialect) for c in calls] == [("failed", "messages")]


class TextOnlyEngine(Engine):
    """A hosted-provider-like engine: it answers text, no token ids (like litellm)."""

    exact_tokens = False

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return GenerateResult(completion=Completion(
            message=Message(role="assistant", content="hosted answer")))


async def test_text_only_engines_are_recorded_as_inexact(
        store: Store, tiny_bundle: ModelBundle) -> None:  # noqa: F811
    gw = Gateway(GatewayConfig(), EngineConfig(name="text"), store,
                 engine=TextOnlyEngine(model=tiny_bundle), bundle=tiny_bundle)
    await gw.start()
    try:
        session = gw.open_session()
        r = await client(gw, session).chat.completions.create(
            model="p", messages=[{"role": "user", "content": "hi"}])
        assert r.choices[0].message.content == "hosted answer"
    finally:
        await gw.stop()
    (call,) = store.list_calls(session.id)
    assert call.status == "ok" and not call.exact_tokens
    assert call.completion_ids == tiny_bundle.encode("hosted answer")
    assert call.logprobs == [0.0] * len(call.completion_ids)


async def test_session_max_tokens_is_a_ceiling_for_requests(gateway: Gateway, store: Store) -> None:
    from openforge.types import SamplingParams

    session = gateway.open_session(sampling=SamplingParams(max_tokens=7, temperature=0.5))
    async with httpx.AsyncClient(base_url=f"{gateway.url}/s/{session.token}/v1") as h:
        for asked in (32000, 3):
            r = await h.post("/messages", json={
                "model": "m", "max_tokens": asked, "temperature": 0.9,
                "messages": [{"role": "user", "content": f"asked {asked}"}]})
            assert r.status_code == 200
    calls = store.list_calls(session.id)
    assert [c.sampling["max_tokens"] for c in calls] == [7, 3]
    assert [c.sampling["temperature"] for c in calls] == [0.9, 0.9]  # not a ceiling


async def test_verl_weight_sync_abort_is_a_429_the_sdk_waits_out(
        store: Store, tiny_bundle: ModelBundle) -> None:  # noqa: F811
    """veRL aborts in-flight generations to sync weights: the gateway answers 429 +
    Retry-After (not a 5xx, not a half-old-policy turn); the harness's SDK retries and the
    retry is served by the new weights, recorded with their version."""
    from types import SimpleNamespace

    from openforge.training.verl_engine import VerlEngine

    reply = tiny_bundle.encode("synced") + tiny_bundle.stop_token_ids[:1]

    class SyncingClient:  # veRL's LLMServerClient.generate signature and TokenOutput fields
        def __init__(self) -> None:
            self.calls = 0

        async def generate(self, request_id: str, *, prompt_ids: list[int],
                           sampling_params: dict[str, Any], **kw: Any) -> Any:
            self.calls += 1
            if self.calls == 1:
                return SimpleNamespace(token_ids=reply[:2], log_probs=[-0.1, -0.2],
                                       stop_reason="aborted", extra_fields={"global_steps": 3})
            return SimpleNamespace(token_ids=reply, log_probs=[-0.5] * len(reply),
                                   stop_reason="completed", extra_fields={"global_steps": 4})

    engine = VerlEngine(model=tiny_bundle, client=SyncingClient(), retry_after_s=0)
    gw = Gateway(GatewayConfig(), EngineConfig(name="verl"), store, engine=engine,
                 bundle=tiny_bundle)
    await gw.start()
    try:
        session = gw.open_session()
        async with httpx.AsyncClient(base_url=gw.session_url(session)) as h:
            r = await h.post("/chat/completions", json={
                "model": "p", "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": f"Bearer {session.token}"})
            assert r.status_code == 429 and r.headers["retry-after"] == "0"
            assert "updating the rollout weights" in r.json()["error"]["message"]
        r2 = await client(gw, session, max_retries=2).chat.completions.create(
            model="p", messages=[{"role": "user", "content": "hi"}])
        assert r2.choices[0].message.content == "synced"
    finally:
        await gw.stop()
    calls = store.list_calls(session.id)
    assert [(c.status, c.weight_version) for c in calls] == [("failed", None), ("ok", "4")]
    assert calls[1].completion_ids == reply and calls[1].logprobs == [-0.5] * len(reply)
