"""Engines: local (tiny model), scripted, vllm (stand-in or a real server), litellm."""

# ruff: noqa: F811  (pytest fixtures imported from fixtures_model are re-bound as arguments)

from __future__ import annotations

import asyncio
import json
import os
import sys
import types

import pytest
from fixtures_model import SHELL_TOOL, chat, tiny_bundle  # noqa: F401
from vllm_standin import VLLMStandIn

from openforge.errors import OpenforgeError
from openforge.gateway.branches import SessionTokens
from openforge.gateway.conversation import Message
from openforge.gateway.engines.base import (
    EngineConfigError,
    EngineError,
    GenerateRequest,
    GenerateResult,
)
from openforge.gateway.engines.local import LocalEngine
from openforge.gateway.engines.scripted import ScriptedEngine
from openforge.gateway.engines.vllm import VLLMEngine
from openforge.types import SamplingParams


@pytest.fixture(scope="module")
def local_engine(tiny_bundle):
    return LocalEngine(tiny_bundle)


def _prompt(bundle, text="Say hi."):
    req = chat([Message(role="user", content=text)], [SHELL_TOOL])
    return req, SessionTokens(bundle).render(req).prompt_ids


# -- local --------------------------------------------------------------------------------


async def test_local_generates_ids_with_their_exact_logprobs(local_engine, tiny_bundle):
    import torch

    _, prompt = _prompt(tiny_bundle)
    sampling = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=12, seed=1)
    result = await local_engine.generate(GenerateRequest(prompt_ids=prompt, sampling=sampling))
    assert len(result.completion_ids) == len(result.logprobs) == 12
    assert result.finish_reason == "length" and result.weight_version == "0"
    # Recompute every logprob with one full forward pass (no KV cache).
    lm = local_engine.torch_model
    with torch.inference_mode():
        logits = lm(torch.tensor([prompt + result.completion_ids])).logits[0].float()
    logp = torch.log_softmax(logits / 0.7, dim=-1)
    for k, (tok, lp) in enumerate(zip(result.completion_ids, result.logprobs, strict=True)):
        assert lp == pytest.approx(float(logp[len(prompt) - 1 + k, tok]), abs=1e-3)
    entry = local_engine.log[-1]
    assert (entry.prompt_ids, entry.completion_ids, entry.logprobs) == (
        prompt, result.completion_ids, result.logprobs)


async def test_local_seed_reproduces_and_stop_tokens_stop(local_engine, tiny_bundle):
    _, prompt = _prompt(tiny_bundle)
    sampling = SamplingParams(temperature=1.0, max_tokens=8, seed=7)
    a = await local_engine.generate(GenerateRequest(prompt_ids=prompt, sampling=sampling))
    b = await local_engine.generate(GenerateRequest(prompt_ids=prompt, sampling=sampling))
    assert a.completion_ids == b.completion_ids
    stop = await local_engine.generate(GenerateRequest(
        prompt_ids=prompt, sampling=sampling, stop_token_ids=[a.completion_ids[2]]))
    assert stop.finish_reason == "stop"
    assert stop.completion_ids == a.completion_ids[:a.completion_ids.index(a.completion_ids[2]) + 1]


async def test_local_greedy_and_weight_version_bump(tiny_bundle):
    engine = LocalEngine(tiny_bundle)
    _, prompt = _prompt(tiny_bundle)
    greedy = SamplingParams(temperature=0.0, max_tokens=5)
    first = await engine.generate(GenerateRequest(prompt_ids=prompt, sampling=greedy))
    state = {k: v.clone() for k, v in engine.torch_model.state_dict().items()}
    state["model.norm.weight"] = state["model.norm.weight"] * -3.0
    assert engine.load_state_dict(state) == "1" and engine.weight_version == "1"
    second = await engine.generate(GenerateRequest(prompt_ids=prompt, sampling=greedy))
    assert second.weight_version == "1"
    assert second.completion_ids != first.completion_ids


async def test_local_rejects_overlong_prompt(local_engine):
    with pytest.raises(EngineError) as info:
        await local_engine.generate(GenerateRequest(prompt_ids=[1] * 40000))
    assert info.value.status_code == 400


# -- scripted -----------------------------------------------------------------------------

SCRIPT = """
- match: "files"
  replies:
    - reasoning: "Look first."
      tool_calls: [{name: shell, arguments: {cmd: "ls"}}]
    - content: "There are 2 files."
- match: "explode"
  replies:
    - {error: "injected engine failure", status: 503}
- replies:
    - content: "I don't know."
"""


@pytest.fixture
def script_file(tmp_path):
    path = tmp_path / "script.yaml"
    path.write_text(SCRIPT)
    return path


async def _scripted_call(engine, bundle, messages):
    req = chat(messages, [SHELL_TOOL])
    tokens = SessionTokens(bundle)
    rendered = tokens.render(req)
    result = await engine.generate(GenerateRequest(prompt_ids=rendered.prompt_ids, chat=req))
    return result, tokens.parse(req, rendered.prompt_ids, result.completion_ids)


async def test_scripted_replies_by_turn(script_file, tiny_bundle):
    engine = ScriptedEngine(tiny_bundle, script=str(script_file))
    user = Message(role="user", content="How many files are here?")
    result, (message, finish) = await _scripted_call(engine, tiny_bundle, [user])
    assert result.completion_ids[-1] == tiny_bundle.stop_token_ids[0]
    assert result.logprobs == [0.0] * len(result.completion_ids)
    assert finish == "tool_calls" and message.reasoning == "Look first."
    assert [(c.name, c.arguments_dict()) for c in message.tool_calls] == [("shell", {"cmd": "ls"})]
    history = [user, message, Message(role="tool", content="a\nb", tool_call_id=message.tool_calls[0].id)]
    _, (second, finish2) = await _scripted_call(engine, tiny_bundle, history)
    assert (second.content, finish2) == ("There are 2 files.", "stop")
    # The last reply repeats.
    _, (third, _) = await _scripted_call(engine, tiny_bundle, [*history, second,
                                                                Message(role="user", content="more?")])
    assert third.content == "There are 2 files."
    _, (other, _) = await _scripted_call(engine, tiny_bundle, [Message(role="user", content="hi")])
    assert other.content == "I don't know."
    assert engine.log[-1].completion_ids == tiny_bundle.encode_prompt(
        "<think>\n\n</think>\n\nI don't know.<|im_end|>")


async def test_scripted_match_finds_the_task_after_a_harness_preamble(script_file, tiny_bundle):
    # Codex sends its environment context as the first user message, the task after it.
    engine = ScriptedEngine(tiny_bundle, script=str(script_file))
    preamble = Message(role="user", content="<environment_context>cwd</environment_context>")
    task = Message(role="user", content="How many files are here?")
    _, (message, _) = await _scripted_call(engine, tiny_bundle, [preamble, task])
    assert [c.name for c in message.tool_calls] == ["shell"]  # not the catch-all entry
    strict = ScriptedEngine(tiny_bundle, entries=[{"match": "files", "replies": [{"content": "a"}]}])
    with pytest.raises(EngineError, match="no script entry matches the user messages"):
        await _scripted_call(strict, tiny_bundle, [preamble])


async def test_scripted_injected_error_and_inline_replies(script_file, tiny_bundle):
    engine = ScriptedEngine(tiny_bundle, script=str(script_file))
    with pytest.raises(EngineError) as info:
        await _scripted_call(engine, tiny_bundle, [Message(role="user", content="explode now")])
    assert info.value.status_code == 503 and "injected" in str(info.value)
    inline = ScriptedEngine(tiny_bundle, replies=[{"content": "one"}, {"content": "two"}],
                            delay_s=0.01)
    _, (msg, _) = await _scripted_call(inline, tiny_bundle, [Message(role="user", content="x")])
    assert msg.content == "one"


async def test_scripted_truncates_at_max_tokens(tiny_bundle):
    engine = ScriptedEngine(tiny_bundle, replies=[{"content": "a long answer " * 20}])
    req = chat([Message(role="user", content="x")])
    result = await engine.generate(GenerateRequest(prompt_ids=[1], chat=req,
                                                   sampling=SamplingParams(max_tokens=5)))
    assert (len(result.completion_ids), result.finish_reason) == (5, "length")


@pytest.mark.parametrize("content,suffix,needle", [
    (None, ".yaml", "cannot read it"),
    ("- replies: [\n", ".yaml", "not valid yaml"),
    ("{not json", ".json", "not valid json"),
    ("- match: x\n", ".yaml", "replies"),
    ("- match: '('\n  replies: [{content: a}]\n", ".yaml", "match"),
    ("- replies: [{content: 3, tool_calls: [{arguments: {}}]}]\n", ".yaml", "replies.0"),
])
def test_scripted_bad_script_is_one_clear_line(tmp_path, tiny_bundle, content, suffix, needle):
    path = tmp_path / f"s{suffix}"
    if content is not None:
        path.write_text(content)
    with pytest.raises(EngineConfigError) as info:
        ScriptedEngine(tiny_bundle, script=str(path))
    message = str(info.value)
    assert str(path) in message and needle in message and "\n" not in message


def test_scripted_needs_a_script(tiny_bundle):
    with pytest.raises(EngineConfigError, match="script=PATH"):
        ScriptedEngine(tiny_bundle)


# -- vllm ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_server(tiny_bundle):
    """A real vLLM when OPENFORGE_VLLM_URL is set, else the stand-in on the tiny model."""
    url = os.environ.get("OPENFORGE_VLLM_URL")
    if url:
        yield types.SimpleNamespace(url=url, standin=None)
        return
    standin = VLLMStandIn(LocalEngine(tiny_bundle), tiny_bundle).start()
    yield types.SimpleNamespace(url=standin.url, standin=standin)
    standin.stop()


@pytest.mark.parametrize("api", ["generate", "completions"])
async def test_vllm_token_in_token_out(vllm_server, tiny_bundle, api):
    engine = VLLMEngine(tiny_bundle, url=vllm_server.url, api=api, log_size=8)
    _, prompt = _prompt(tiny_bundle)
    sampling = SamplingParams(temperature=1.0, max_tokens=6, seed=3)
    try:
        result = await engine.generate(GenerateRequest(
            prompt_ids=prompt, sampling=sampling, stop_token_ids=tiny_bundle.stop_token_ids))
        again = await engine.generate(GenerateRequest(
            prompt_ids=prompt, sampling=sampling, stop_token_ids=tiny_bundle.stop_token_ids))
    finally:
        await engine.close()
    assert isinstance(result, GenerateResult)
    assert 0 < len(result.completion_ids) == len(result.logprobs) <= 6
    assert all(lp <= 0.0 for lp in result.logprobs)
    assert result.completion_ids == again.completion_ids  # seeded
    assert engine.log[-1].prompt_ids == prompt
    if vllm_server.standin is not None:
        sent = vllm_server.standin.requests[-1]
        assert (sent.get("token_ids") or sent.get("prompt")) == prompt
        if api == "completions":
            assert sent["return_token_ids"] is True and sent["logprobs"] == 1
        else:
            assert result.weight_version == "0"  # generate reports weight_versions


async def test_vllm_completions_echo_of_the_prompt_is_not_decoded(vllm_server, tiny_bundle,
                                                                    monkeypatch):
    """`return_token_ids` makes vLLM echo the prompt's ids with every answer: the engine
    cuts them out of the text before decoding it (it sent them), and reads the same
    generated ids and logprobs."""
    from openforge.gateway.engines import vllm as vllm_module

    parsed: list[str] = []
    real_parse = vllm_module.json_process.parse

    def spy(text):
        parsed.append(text)
        return real_parse(text)

    monkeypatch.setattr(vllm_module.json_process, "parse", spy)
    _, prompt = _prompt(tiny_bundle)
    sampling = SamplingParams(temperature=1.0, max_tokens=6, seed=3)
    engine = VLLMEngine(tiny_bundle, url=vllm_server.url, api="completions", log_size=2)
    try:
        result = await engine.generate(GenerateRequest(
            prompt_ids=prompt, sampling=sampling, stop_token_ids=tiny_bundle.stop_token_ids))
    finally:
        await engine.close()
    answer = json.loads(parsed[-1])
    choice = answer["choices"][0]
    assert choice.get("prompt_token_ids", answer.get("prompt_token_ids")) is None
    assert '"prompt_token_ids":null' in parsed[-1]
    assert result.completion_ids == choice["token_ids"] and len(result.logprobs) == len(
        result.completion_ids) > 0


async def test_a_gateway_on_vllm_records_each_conversation_as_one_sample(vllm_server, tiny_bundle,
                                                                          tmp_path):
    """The gateway with the `vllm` engine (`api=completions`, the `append` policy), a long
    system prompt and user-message turns: every call is recorded, and each conversation
    extends one branch into one training sample (the bridge from the prompt's last turn,
    the echoed prompt cut out of vLLM's answers)."""
    import httpx

    from openforge.config import EngineConfig, GatewayConfig
    from openforge.gateway.server import Gateway
    from openforge.store import Store
    from openforge.trajectory import run_metrics

    store = Store(tmp_path / "gw.sqlite")
    engine = VLLMEngine(tiny_bundle, url=vllm_server.url, api="completions")
    gateway = Gateway(GatewayConfig(), EngineConfig(name="vllm"), store, engine=engine,
                      bundle=tiny_bundle)
    await gateway.start()
    system = "You are a coding agent. " + " ".join(f"rule {i}: run the tests." for i in range(100))
    try:
        sessions = [gateway.open_session(run_id="r", task_id=f"t{k}") for k in range(2)]

        async def conversation(session):
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": "Refactor the module."}]
            async with httpx.AsyncClient(base_url=gateway.session_url(session),
                                         timeout=120) as h:
                for turn in range(3):
                    r = await h.post("/chat/completions", json={
                        "model": "p", "messages": messages, "max_tokens": 8,
                        "temperature": 1.0, "seed": turn},
                        headers={"authorization": f"Bearer {session.token}"})
                    assert r.status_code == 200, r.text
                    answer = r.json()["choices"][0]["message"]
                    messages += [{"role": "assistant", "content": answer["content"] or ""},
                                 {"role": "user", "content": f"Now step {turn}."}]

        await asyncio.gather(*(conversation(s) for s in sessions))
    finally:
        await gateway.stop()
        await engine.close()
    calls = [c for s in sessions for c in store.list_calls(s.id)]
    assert len(calls) == 6 and {c.status for c in calls} == {"ok"}
    assert {(c.session_id, c.branch) for c in calls} == {(s.id, 0) for s in sessions}
    metrics = run_metrics(store)
    assert (metrics.sessions, metrics.samples, metrics.calls_used) == (2, 2, 6)
    store.close()


def test_only_the_echo_of_the_prompt_sent_is_cut():
    from openforge.gateway.engines.vllm import without_prompt_echo

    sent = json.dumps([151644, 872, 198, 9707], separators=(",", ":"))
    forged = '"prompt_token_ids":' + sent  # generated text: its quotes arrive escaped
    answer = {"choices": [{"index": 0, "text": forged, "token_ids": [1, 2],
                           "logprobs": {"top_logprobs": [{'"prompt_token_ids":': -0.1}]},
                           "prompt_token_ids": json.loads(sent)}]}
    text = json.dumps(answer, separators=(",", ":"))
    cut = json.loads(without_prompt_echo(text, sent))
    assert cut["choices"][0]["prompt_token_ids"] is None
    assert cut["choices"][0]["text"] == forged and cut["choices"][0]["token_ids"] == [1, 2]
    assert cut["choices"][0]["logprobs"] == answer["choices"][0]["logprobs"]
    other = json.dumps([151644, 872], separators=(",", ":"))
    assert without_prompt_echo(text, other) == text  # not what was sent: decoded as it is
    spaced = json.dumps(answer)  # not compact: left to the decoder
    assert without_prompt_echo(spaced, sent) == spaced


async def test_vllm_server_error_is_engine_error(vllm_server, tiny_bundle):
    if vllm_server.standin is None:
        pytest.skip("failure injection needs the stand-in")
    engine = VLLMEngine(tiny_bundle, url=vllm_server.url)
    vllm_server.standin.fail_next = 1
    try:
        with pytest.raises(EngineError) as info:
            await engine.generate(GenerateRequest(prompt_ids=[1, 2, 3]))
        assert info.value.status_code == 502
    finally:
        await engine.close()


async def test_vllm_unreachable_is_503(tiny_bundle):
    from vllm_standin import free_port

    engine = VLLMEngine(tiny_bundle, url=f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(EngineError) as info:
            await engine.generate(GenerateRequest(prompt_ids=[1, 2, 3]))
        assert info.value.status_code == 503
    finally:
        await engine.close()


def test_vllm_config_errors(tiny_bundle):
    with pytest.raises(EngineConfigError, match="url="):
        VLLMEngine(tiny_bundle)
    with pytest.raises(OpenforgeError, match="option api: Input should be 'generate' or 'completions'"):
        VLLMEngine(tiny_bundle, url="http://127.0.0.1:1", api="chat")


# -- litellm ------------------------------------------------------------------------------


def test_litellm_missing_is_a_clear_error(tiny_bundle, monkeypatch):
    from openforge.gateway.engines.litellm_engine import LiteLLMEngine

    monkeypatch.setitem(sys.modules, "litellm", None)  # import fails as if not installed
    with pytest.raises(EngineConfigError, match=r"pip install 'openforge\[litellm\]'"):
        LiteLLMEngine(tiny_bundle, litellm_model="openai/gpt-4o-mini")


def test_engines_are_registered_plugins(tiny_bundle):
    from openforge import plugins

    engine = plugins.create("engine", "scripted", model=tiny_bundle, replies=[{"content": "x"}])
    assert isinstance(engine, ScriptedEngine)
    assert isinstance(plugins.create("engine", "vllm", model=tiny_bundle,
                                     url="http://127.0.0.1:1"), VLLMEngine)


async def test_local_cancel_stops_the_worker(tiny_bundle):
    import asyncio

    engine = LocalEngine(tiny_bundle)
    _, prompt = _prompt(tiny_bundle)
    long = GenerateRequest(prompt_ids=prompt, sampling=SamplingParams(max_tokens=100000, seed=1))
    task = asyncio.ensure_future(engine.generate(long))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The model is free again at once (the worker stopped), and nothing was logged.
    short = await asyncio.wait_for(engine.generate(GenerateRequest(
        prompt_ids=prompt, sampling=SamplingParams(max_tokens=2))), timeout=30)
    assert len(short.completion_ids) == 2
    assert [len(e.completion_ids) for e in engine.log] == [2]
