"""The official `openai` and `anthropic` SDKs through every dialect, streaming and not.

Each test drives a multi-turn conversation with tool calls the way a harness does (the
tool results go back in the next request) against a real gateway on a free port, once with
the scripted engine and once with the tiny local model, and then checks every recorded
call against the engine's own log: the exact prompt ids it received, the exact ids and
logprobs it produced.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from fixtures_model import tiny_bundle  # noqa: F401  (pytest fixture)

from openforge import plugins
from openforge.config import EngineConfig, GatewayConfig
from openforge.gateway.engines.base import Engine
from openforge.gateway.model import ModelBundle
from openforge.gateway.server import Gateway
from openforge.store import Store
from openforge.types import Session

PARAMS = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
CHAT_TOOL = {"type": "function", "function": {"name": "shell", "description": "Run a command.",
                                              "parameters": PARAMS}}
RESPONSES_TOOL = {"type": "function", "name": "shell", "description": "Run a command.",
                  "parameters": PARAMS}
ANTHROPIC_TOOL = {"name": "shell", "description": "Run a command.", "input_schema": PARAMS}
REPLIES = [
    {"tool_calls": [{"name": "shell", "arguments": {"cmd": "ls"}}]},
    {"reasoning": "Count them.", "tool_calls": [{"name": "shell", "arguments": {"cmd": "wc -l"}}]},
    {"content": "There are 2 files."},
]

def max_tokens(gw: Gateway) -> int:
    """Room for the scripted replies; short turns for the local model's random tokens."""
    return 256 if scripted(gw) else 6


def turns(gw: Gateway) -> int:
    """Three turns walk the whole tool script; two show the local model's multi-turn path."""
    return 3 if scripted(gw) else 2


@pytest.fixture(scope="module")
def local_engine(tiny_bundle: ModelBundle) -> Iterator[Engine]:  # noqa: F811
    yield plugins.create("engine", "local", model=tiny_bundle, device="cpu")


@pytest.fixture(params=["scripted", "local"])
async def gateway(request: pytest.FixtureRequest, tmp_path: Path,
                  tiny_bundle: ModelBundle) -> AsyncIterator[Gateway]:  # noqa: F811
    if request.param == "scripted":
        engine = plugins.create("engine", "scripted", model=tiny_bundle, replies=REPLIES)
    else:
        engine = request.getfixturevalue("local_engine")
        engine.log.clear()
    store = Store(tmp_path / "sdk.sqlite")
    gw = Gateway(GatewayConfig(), EngineConfig(name=request.param), store, engine=engine,
                 bundle=tiny_bundle)
    await gw.start()
    yield gw
    await gw.stop()
    store.close()


def scripted(gw: Gateway) -> bool:
    return gw.engine_config.name == "scripted"


def check_recording(gw: Gateway, session: Session, dialect: str, n_calls: int) -> None:
    calls = gw.store.list_calls(session.id)
    assert len(calls) == n_calls
    log = {e.request_id: e for e in gw.engine.log}
    for call in calls:
        assert call.status == "ok" and call.dialect == dialect and call.exact_tokens
        entry = log[call.id]
        assert call.prompt_ids == entry.prompt_ids
        assert call.completion_ids == entry.completion_ids
        assert call.logprobs == pytest.approx(entry.logprobs)
        assert len(call.logprobs) == len(call.completion_ids) > 0
    if scripted(gw) and dialect != "completions":
        # A tool loop extends one token-exact context: no branch opened.
        assert [(c.branch, c.branch_reason) for c in calls] == [(0, None)] * len(calls)
        for prev, call in zip(calls, calls[1:], strict=False):
            context = prev.prompt_ids + prev.completion_ids
            assert call.prompt_ids[:len(context)] == context


# --- OpenAI chat -----------------------------------------------------------------------------


async def chat_turn(c: openai.AsyncOpenAI, messages: list[dict[str, Any]], stream: bool,
                    limit: int) -> tuple[str, list[dict[str, Any]]]:
    kw: dict[str, Any] = {"model": "policy", "messages": messages, "tools": [CHAT_TOOL],
                          "max_tokens": limit}
    if not stream:
        r = await c.chat.completions.create(**kw)
        msg = r.choices[0].message
        return msg.content or "", [tc.model_dump() for tc in msg.tool_calls or []]
    content, calls = "", {}
    async for chunk in await c.chat.completions.create(**kw, stream=True,
                                                       stream_options={"include_usage": True}):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": "", "type": "function",
                                               "function": {"name": "", "arguments": ""}})
            slot["id"] = tc.id or slot["id"]
            if tc.function:
                slot["function"]["name"] += tc.function.name or ""
                slot["function"]["arguments"] += tc.function.arguments or ""
    return content, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_chat(gateway: Gateway, stream: bool) -> None:
    session = gateway.open_session()
    c = openai.AsyncOpenAI(base_url=gateway.session_url(session), api_key=session.token)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                                      {"role": "user", "content": "How many files?"}]
    for _ in range(turns(gateway)):
        content, tool_calls = await chat_turn(c, messages, stream, max_tokens(gateway))
        messages.append({"role": "assistant", "content": content, **(
            {"tool_calls": tool_calls} if tool_calls else {})})
        for tc in tool_calls:
            messages.append({"role": "tool", "tool_call_id": tc["id"],
                             "content": f"ran {json.loads(tc['function']['arguments'])['cmd']}"})
        if not tool_calls:
            messages.append({"role": "user", "content": "And now?"})
    if scripted(gateway):
        assert messages[-2]["content"] == "There are 2 files."
    check_recording(gateway, session, "chat", turns(gateway))


# --- OpenAI legacy completions ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_completions(gateway: Gateway, stream: bool) -> None:
    session = gateway.open_session()
    c = openai.AsyncOpenAI(base_url=gateway.session_url(session), api_key=session.token)
    prompt = "Q: name a prime.\nA:"
    for _ in range(2):
        if stream:
            text = ""
            async for chunk in await c.completions.create(model="p", prompt=prompt,
                                                          max_tokens=max_tokens(gateway), stream=True):
                text += chunk.choices[0].text if chunk.choices else ""
        else:
            text = (await c.completions.create(model="p", prompt=prompt,
                                               max_tokens=max_tokens(gateway))).choices[0].text
        prompt += text + "\nQ: another?\nA:"
    check_recording(gateway, session, "completions", 2)


# --- OpenAI Responses -------------------------------------------------------------------------


async def responses_turn(c: openai.AsyncOpenAI, items: list[dict[str, Any]], stream: bool,
                         limit: int) -> list[dict[str, Any]]:
    kw: dict[str, Any] = {"model": "policy", "input": items, "tools": [RESPONSES_TOOL],
                          "max_output_tokens": limit, "store": False}
    if not stream:
        response = await c.responses.create(**kw)
    else:
        response = None
        kinds = []
        async for event in await c.responses.create(**kw, stream=True):
            kinds.append(event.type)
            if event.type == "response.completed":
                response = event.response
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert response is not None
    return [item.model_dump(exclude_none=True) for item in response.output]


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_responses(gateway: Gateway, stream: bool) -> None:
    session = gateway.open_session()
    c = openai.AsyncOpenAI(base_url=gateway.session_url(session), api_key=session.token)
    items: list[dict[str, Any]] = [{"role": "user", "content": "How many files?"}]
    final = ""
    for _ in range(turns(gateway)):
        output = await responses_turn(c, items, stream, max_tokens(gateway))
        items += output
        calls = [o for o in output if o["type"] == "function_call"]
        for call in calls:
            items.append({"type": "function_call_output", "call_id": call["call_id"],
                          "output": f"ran {json.loads(call['arguments'])['cmd']}"})
        if not calls:
            final = "".join(p.get("text", "") for o in output if o["type"] == "message"
                            for p in o["content"])
            items.append({"role": "user", "content": "And now?"})
    if scripted(gateway):
        assert final == "There are 2 files."
    check_recording(gateway, session, "responses", turns(gateway))


# --- Anthropic Messages --------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_messages(gateway: Gateway, stream: bool) -> None:
    session = gateway.open_session()
    # As Claude Code is configured: the base URL without /v1, the token as API key.
    c = anthropic.AsyncAnthropic(base_url=f"{gateway.url}/s/{session.token}",
                                 api_key=session.token)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "How many files?"}]
    final = ""
    for _ in range(turns(gateway)):
        kw: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": max_tokens(gateway),
                              "system": "You are an agent.", "messages": messages,
                              "tools": [ANTHROPIC_TOOL]}
        if stream:
            async with c.messages.stream(**kw) as s:
                message = await s.get_final_message()
        else:
            message = await c.messages.create(**kw)
        blocks = [b.model_dump(exclude_none=True) for b in message.content]
        messages.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "."}]})
        uses = [b for b in blocks if b["type"] == "tool_use"]
        if uses:
            assert message.stop_reason == "tool_use"
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": u["id"], "content": f"ran {u['input']['cmd']}"}
                for u in uses]})
        else:
            final = "".join(b.get("text", "") for b in blocks if b["type"] == "text")
            messages.append({"role": "user", "content": "And now?"})
    if scripted(gateway):
        assert final == "There are 2 files."
    check_recording(gateway, session, "messages", turns(gateway))
    tokens = await c.messages.count_tokens(model="x", messages=messages[:1])
    assert tokens.input_tokens > 0
