"""The `litellm` engine with the real litellm package against a local OpenAI-compatible
server: openforge's own gateway, serving scripted replies over real HTTP.

Hosted providers are out of reach here; an OpenAI-compatible endpoint is what litellm's
`openai/` provider speaks to, and the gateway is one (its chat dialect is tested against
the official SDKs). Every reply, tool call, usage figure and error below crossed real HTTP
through litellm's own client.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fixtures_model import SHELL_TOOL, chat, tiny_bundle  # noqa: F401  (pytest fixture)

from openforge import plugins
from openforge.config import EngineConfig, GatewayConfig
from openforge.gateway.conversation import Message
from openforge.gateway.engines.base import EngineError, GenerateRequest
from openforge.gateway.render import ModelBundle
from openforge.gateway.server import Gateway
from openforge.store import Store

pytest.importorskip("litellm", reason="litellm is in the test extra: pip install -e '.[test]'")

REPLIES = [{"tool_calls": [{"name": "shell", "arguments": {"cmd": "ls"}}]},
           {"content": "There are 2 files."}]


@pytest.fixture
async def upstream(tmp_path: Path, tiny_bundle: ModelBundle  # noqa: F811
                   ) -> AsyncIterator[Gateway]:
    """An OpenAI-compatible server on 127.0.0.1: a gateway with a scripted engine."""
    engine = plugins.create("engine", "scripted", model=tiny_bundle, entries=[
        {"match": "fail", "replies": [{"error": "upstream overloaded", "status": 503}]},
        {"replies": REPLIES}])
    gateway = Gateway(GatewayConfig(), EngineConfig(name="scripted"),
                      Store(tmp_path / "upstream.sqlite"), engine=engine, bundle=tiny_bundle)
    await gateway.start()
    yield gateway
    await gateway.stop()


def litellm_engine(bundle: ModelBundle, upstream: Gateway, **options: Any) -> Any:
    session = upstream.open_session("upstream")
    return plugins.create("engine", "litellm", model=bundle, litellm_model="openai/policy",
                          api_base=upstream.session_url(session), api_key=session.token,
                          num_retries=0, **options)


async def test_replies_and_tool_calls_come_back_through_litellm(
        tiny_bundle: ModelBundle, upstream: Gateway) -> None:  # noqa: F811
    engine = litellm_engine(tiny_bundle, upstream)
    assert engine.exact_tokens is False
    conversation = [Message(role="user", content="list the files")]
    first = await engine.generate(GenerateRequest(prompt_ids=[1, 2, 3],
                                                  chat=chat(conversation, [SHELL_TOOL])))
    message = first.completion.message
    assert first.completion.finish_reason == "tool_calls"
    assert [c.name for c in message.tool_calls] == ["shell"]
    assert message.tool_calls[0].arguments_dict() == {"cmd": "ls"}
    assert first.completion.prompt_tokens > 0 and first.completion.completion_tokens > 0
    # Ids: a retokenization of the answer (flagged), one 0.0 logprob each.
    assert len(first.completion_ids) == len(first.logprobs) > 0 and set(first.logprobs) == {0.0}
    assert "<tool_call>" in tiny_bundle.decode(first.completion_ids)
    conversation += [message, Message(role="tool", content="a.txt b.txt",
                                      tool_call_id=message.tool_calls[0].id)]
    second = await engine.generate(GenerateRequest(prompt_ids=[1], chat=chat(conversation,
                                                                            [SHELL_TOOL])))
    assert second.completion.message.content == "There are 2 files."
    assert second.completion.finish_reason == "stop"
    # The upstream server recorded both requests as litellm sent them.
    [session] = upstream.store.list_sessions("upstream")
    sent = upstream.store.list_calls(session.id)
    assert len(sent) == 2 and sent[0].request["model"] == "policy"
    assert sent[0].request["tools"][0]["function"]["name"] == "shell"
    assert sent[1].request["messages"][-1] == {"role": "tool", "content": "a.txt b.txt",
                                               "tool_call_id": message.tool_calls[0].id}


async def test_provider_errors_become_engine_errors(
        tiny_bundle: ModelBundle, upstream: Gateway) -> None:  # noqa: F811
    engine = litellm_engine(tiny_bundle, upstream)
    with pytest.raises(EngineError, match="upstream overloaded") as info:
        await engine.generate(GenerateRequest(prompt_ids=[1], chat=chat(
            [Message(role="user", content="please fail")])))
    assert info.value.status_code == 503  # the provider is down: retryable
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens there once the socket is closed
    gone = plugins.create("engine", "litellm", model=tiny_bundle, litellm_model="openai/policy",
                          api_base=f"http://127.0.0.1:{closed}/v1", api_key="k", num_retries=0,
                          timeout=10)
    with pytest.raises(EngineError, match="litellm openai/policy") as info:
        await gone.generate(GenerateRequest(prompt_ids=[1], chat=chat(
            [Message(role="user", content="hi")])))
    assert info.value.status_code in (502, 503)


async def test_openforge_run_on_the_litellm_engine(tmp_path: Path, upstream: Gateway) -> None:
    """`openforge run --engine litellm`: the mini harness solves a task with the upstream's
    answers; the calls are recorded flagged `exact_tokens=false`."""
    session = upstream.open_session("upstream")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t", "prompt": "List the files.",
                                 "check": {"command": "true"}}) + "\n")
    argv = [sys.executable, "-m", "openforge.cli", "run", "--env", "tasks", "--engine", "litellm",
            "--set", f"environment_options.path={tasks}",
            "--set", "engine.options.litellm_model=openai/policy",
            "--set", f"engine.options.api_base={upstream.session_url(session)}",
            "--set", f"engine.options.api_key={session.token}",
            "--runs-dir", str(tmp_path / "runs")]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE,
                                                env={**os.environ})
    out, err = await asyncio.wait_for(proc.communicate(), timeout=600)
    assert proc.returncode == 0, err.decode()[-3000:]
    [run_dir] = list((tmp_path / "runs").iterdir())
    [record] = map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())
    assert record["status"] == "ok" and record["passed"]
    assert record["final_answer"] == "There are 2 files."
    with Store(run_dir / "store.sqlite") as store:
        [outer] = store.list_sessions()
        calls = store.list_calls(outer.id)
    assert len(calls) == 2 and not any(c.exact_tokens for c in calls)
    assert len(upstream.store.list_calls(session.id)) == 2  # each call went upstream once
