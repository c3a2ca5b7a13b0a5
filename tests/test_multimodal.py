"""Screenshots through a real gateway, end to end, with the official SDKs.

A GUI-agent-like loop (a new PNG screenshot every turn) runs against a real gateway on a
free port serving the tiny multimodal model (`tiny-vl`) with the scripted engine, through
OpenAI chat, OpenAI Responses and Anthropic Messages, streamed and not. Each test checks
what the recording promises: the stored image bytes are exactly the bytes sent, each call
references its images in order, the prompt holds `<|vision_start|>` + N x `<|image_pad|>` +
`<|vision_end|>` with N what the model's image processor computes, and `openforge export`
writes the images next to the samples, byte-identical.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pyarrow.parquet as pq
import pytest
from fixtures_model import tiny_bundle  # noqa: F401  (pytest fixture)
from PIL import Image

from openforge import plugins
from openforge.config import EngineConfig, GatewayConfig
from openforge.export import export_run
from openforge.gateway.model import ModelBundle, load_model_bundle
from openforge.gateway.server import Gateway
from openforge.store import Store
from openforge.types import Call, Session

REPLIES = [{"content": "click(40, 30)"}, {"content": "answer(done)"}]


def png(width: int, height: int, color: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, "PNG")
    return buf.getvalue()


SCREEN_1 = png(100, 60, "red")
SCREEN_2 = png(64, 200, "blue")


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def vl_bundle() -> ModelBundle:
    return load_model_bundle("tiny-vl")


def expected_pads(bundle: ModelBundle, data: bytes) -> int:
    """What the model's own image processor says one image expands to."""
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(str(bundle.path))
    image = Image.open(io.BytesIO(data)).convert("RGB")
    grid = processor(images=[image], return_tensors="np")["image_grid_thw"][0]
    return int(grid.prod()) // processor.merge_size ** 2


async def start_gateway(tmp_path: Path, bundle: ModelBundle, **config: Any) -> Gateway:
    engine = plugins.create("engine", "scripted", model=bundle, replies=REPLIES)
    store = Store(tmp_path / "store.sqlite")
    gw = Gateway(GatewayConfig(**config), EngineConfig(name="scripted", model="tiny-vl"), store,
                 engine=engine, bundle=bundle)
    await gw.start()
    return gw


@pytest.fixture
async def gateway(tmp_path: Path, vl_bundle: ModelBundle) -> AsyncIterator[Gateway]:
    gw = await start_gateway(tmp_path, vl_bundle)
    yield gw
    await gw.stop()
    gw.store.close()


def image_runs(bundle: ModelBundle, ids: list[int]) -> list[int]:
    """Lengths of the `<|image_pad|>` runs between vision markers, in order."""
    start, pad, end = (bundle.tokenizer.convert_tokens_to_ids(t) for t in
                       ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"))
    runs: list[int] = []
    i = 0
    while i < len(ids):
        if ids[i] == start:
            j = i + 1
            while ids[j] == pad:
                j += 1
            assert ids[j] == end, "a placeholder run must end in <|vision_end|>"
            runs.append(j - i - 1)
            i = j
        i += 1
    return runs


def check_recording(gw: Gateway, session: Session, dialect: str) -> list[Call]:
    bundle = gw.bundle
    assert bundle is not None
    calls = gw.store.list_calls(session.id)
    assert [c.dialect for c in calls] == [dialect, dialect]
    assert [c.status for c in calls] == ["ok", "ok"]
    first, second = calls
    assert first.images == [sha(SCREEN_1)]
    assert second.images == [sha(SCREEN_1), sha(SCREEN_2)]
    for data in (SCREEN_1, SCREEN_2):
        stored = gw.store.get_image(sha(data))
        assert stored is not None and stored.data == data and stored.media_type == "image/png"
    # Stored once: the recorded request bodies reference the images by hash instead.
    for call in calls:
        body = json.dumps(call.request)
        assert base64.b64encode(SCREEN_1).decode() not in body
        assert f"openforge-image:sha256:{sha(SCREEN_1)}" in body
    n1, n2 = expected_pads(bundle, SCREEN_1), expected_pads(bundle, SCREEN_2)
    assert n1 != n2  # distinct sizes, so a swapped order would show
    assert image_runs(bundle, first.prompt_ids) == [n1]
    assert image_runs(bundle, second.prompt_ids) == [n1, n2]
    # One token-exact context: the second prompt extends the first call's prompt + answer.
    assert second.branch == first.branch == 0
    context = first.prompt_ids + first.completion_ids
    assert second.prompt_ids[:len(context)] == context
    return calls


def check_export(gw: Gateway, session: Session, tmp_path: Path) -> None:
    out = export_run(gw.store.path, "samples", tmp_path / "samples")
    [row] = pq.read_table(out).to_pylist()
    assert row["images"] == [sha(SCREEN_1), sha(SCREEN_2)]
    for data in (SCREEN_1, SCREEN_2):
        assert (out.parent / "images" / f"{sha(data)}.png").read_bytes() == data
    verl = export_run(gw.store.path, "verl", tmp_path / "verl")
    [vrow] = pq.read_table(verl).to_pylist()
    assert [i["bytes"] for i in vrow["images"]] == [SCREEN_1]
    assert vrow["prompt"][0]["content"] == "<image>Open the settings."
    gw.store.set_reward(session.id, 1.0)  # a passing rollout: the SFT export keeps it
    sft = export_run(gw.store.path, "sft", tmp_path / "sft")
    [srow] = pq.read_table(sft).to_pylist()
    assert srow["images"] == [sha(SCREEN_1), sha(SCREEN_2)]
    assert (sft.parent / "images" / f"{sha(SCREEN_2)}.png").read_bytes() == SCREEN_2


# --- OpenAI chat ---------------------------------------------------------------------------


def chat_user(text: str, screen: bytes) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "text", "text": text},
        {"type": "image_url", "image_url": {"url": data_url(screen)}}]}


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_screenshots(gateway: Gateway, stream: bool, tmp_path: Path) -> None:
    session = gateway.open_session()
    c = openai.AsyncOpenAI(base_url=gateway.session_url(session), api_key=session.token)
    messages: list[dict[str, Any]] = [chat_user("Open the settings.", SCREEN_1)]
    for screen in (SCREEN_2, None):
        if stream:
            text = ""
            async for chunk in await c.chat.completions.create(
                    model="policy", messages=messages, max_tokens=64, stream=True):
                text += chunk.choices[0].delta.content or "" if chunk.choices else ""
        else:
            r = await c.chat.completions.create(model="policy", messages=messages, max_tokens=64)
            text = r.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        if screen is not None:
            messages.append(chat_user("Next screen.", screen))
    assert messages[1]["content"] == "click(40, 30)"
    check_recording(gateway, session, "chat")
    check_export(gateway, session, tmp_path)


# --- OpenAI Responses ----------------------------------------------------------------------


def responses_user(text: str, screen: bytes) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "input_text", "text": text},
        {"type": "input_image", "image_url": data_url(screen), "detail": "auto"}]}


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_screenshots(gateway: Gateway, stream: bool, tmp_path: Path) -> None:
    session = gateway.open_session()
    c = openai.AsyncOpenAI(base_url=gateway.session_url(session), api_key=session.token)
    items: list[dict[str, Any]] = [responses_user("Open the settings.", SCREEN_1)]
    for screen in (SCREEN_2, None):
        kw: dict[str, Any] = {"model": "policy", "input": items, "max_output_tokens": 64,
                              "store": False}
        if stream:
            response = None
            async for event in await c.responses.create(**kw, stream=True):
                if event.type == "response.completed":
                    response = event.response
            assert response is not None
        else:
            response = await c.responses.create(**kw)
        items += [o.model_dump(exclude_none=True) for o in response.output]
        if screen is not None:
            items.append(responses_user("Next screen.", screen))
    check_recording(gateway, session, "responses")
    check_export(gateway, session, tmp_path)


# --- Anthropic Messages --------------------------------------------------------------------


def anthropic_user(text: str, screen: bytes) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "text", "text": text},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(screen).decode()}}]}


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_screenshots(gateway: Gateway, stream: bool, tmp_path: Path) -> None:
    session = gateway.open_session()
    c = anthropic.AsyncAnthropic(base_url=f"{gateway.url}/s/{session.token}",
                                 api_key=session.token)
    messages: list[dict[str, Any]] = [anthropic_user("Open the settings.", SCREEN_1)]
    for screen in (SCREEN_2, None):
        kw: dict[str, Any] = {"model": "policy", "messages": messages, "max_tokens": 64}
        if stream:
            async with c.messages.stream(**kw) as events:
                message = await events.get_final_message()
        else:
            message = await c.messages.create(**kw)
        messages.append({"role": "assistant",
                         "content": [b.model_dump(exclude_none=True) for b in message.content]})
        if screen is not None:
            messages.append(anthropic_user("Next screen.", screen))
    check_recording(gateway, session, "messages")
    check_export(gateway, session, tmp_path)


# --- what the gateway refuses, and files -------------------------------------------------


async def test_refusals_are_clear_4xx_and_record_nothing(gateway: Gateway) -> None:
    session = gateway.open_session()
    c = openai.AsyncOpenAI(base_url=gateway.session_url(session), api_key=session.token,
                           max_retries=0)

    async def send(url: str) -> openai.APIStatusError:
        with pytest.raises(openai.APIStatusError) as info:
            await c.chat.completions.create(model="policy", max_tokens=8, messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
        return info.value

    remote = await send("https://example.com/screen.png")
    assert remote.status_code == 400 and "does not fetch" in remote.message
    local = await send("file:///etc/passwd")
    assert local.status_code == 400 and "disabled" in local.message
    garbage = await send("data:image/png;base64," + base64.b64encode(b"not an image").decode())
    assert garbage.status_code == 400 and "not a PNG" in garbage.message
    assert gateway.store.list_calls(session.id) == []


@pytest.mark.parametrize("configured_by", ["env", "config"])
async def test_file_urls_under_the_image_root(tmp_path: Path, vl_bundle: ModelBundle,
                                              monkeypatch: pytest.MonkeyPatch,
                                              configured_by: str) -> None:
    root = tmp_path / "screens"
    root.mkdir()
    (root / "s1.png").write_bytes(SCREEN_1)
    (tmp_path / "secret.png").write_bytes(SCREEN_2)
    if configured_by == "env":
        monkeypatch.setenv("OPENFORGE_IMAGE_ROOT", str(root))
        gw = await start_gateway(tmp_path, vl_bundle)
    else:  # gateway.image_root in the run config
        monkeypatch.delenv("OPENFORGE_IMAGE_ROOT", raising=False)
        gw = await start_gateway(tmp_path, vl_bundle, image_root=root)
    try:
        session = gw.open_session()
        c = openai.AsyncOpenAI(base_url=gw.session_url(session), api_key=session.token,
                               max_retries=0)

        def ask(url: str) -> Any:
            return c.chat.completions.create(model="policy", max_tokens=8, messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])

        await ask((root / "s1.png").as_uri())
        with pytest.raises(openai.BadRequestError, match="outside the gateway's image root"):
            await ask(f"file://{root}/../secret.png")
        [call] = gw.store.list_calls(session.id)
        assert call.images == [sha(SCREEN_1)]
        stored = gw.store.get_image(sha(SCREEN_1))
        assert stored is not None and stored.data == SCREEN_1
    finally:
        await gw.stop()
        gw.store.close()


async def test_text_only_model_refuses_images(tmp_path: Path,
                                              tiny_bundle: ModelBundle) -> None:  # noqa: F811
    engine = plugins.create("engine", "scripted", model=tiny_bundle, replies=REPLIES)
    store = Store(tmp_path / "store.sqlite")
    gw = Gateway(GatewayConfig(), EngineConfig(name="scripted"), store, engine=engine,
                 bundle=tiny_bundle)
    await gw.start()
    try:
        session = gw.open_session()
        c = anthropic.AsyncAnthropic(base_url=f"{gw.url}/s/{session.token}",
                                     api_key=session.token, max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match="takes text only"):
            await c.messages.create(model="policy", max_tokens=8,
                                    messages=[anthropic_user("Look.", SCREEN_1)])
        assert store.list_calls(session.id) == [] and store.count_images() == 0
    finally:
        await gw.stop()
        store.close()


async def test_a_restarted_gateway_continues_the_same_context(
        tmp_path: Path, vl_bundle: ModelBundle, caplog: pytest.LogCaptureFixture) -> None:
    # The first gateway records one turn and goes away; the second rebuilds the session
    # from the store (re-rendering the stored request with the stored image bytes) and
    # the next turn still extends the exact ids of the first.
    gw = await start_gateway(tmp_path, vl_bundle)
    session = gw.open_session()
    messages: list[dict[str, Any]] = [chat_user("Open the settings.", SCREEN_1)]
    c = openai.AsyncOpenAI(base_url=gw.session_url(session), api_key=session.token)
    r = await c.chat.completions.create(model="policy", messages=messages, max_tokens=64)
    await gw.stop()
    gw.store.close()

    gw = await start_gateway(tmp_path, vl_bundle)
    try:
        messages += [{"role": "assistant", "content": r.choices[0].message.content},
                     chat_user("Next screen.", SCREEN_2)]
        c = openai.AsyncOpenAI(base_url=gw.session_url(session), api_key=session.token)
        with caplog.at_level(logging.INFO, logger="openforge.gateway"):
            await c.chat.completions.create(model="policy", messages=messages, max_tokens=64)
        assert "rebuilt branch state from 1 stored calls" in caplog.text
        assert "not replayed" not in caplog.text
        first, second = gw.store.list_calls(session.id)
        assert second.branch == 0 and second.branch_reason is None
        assert second.prompt_ids[:len(first.prompt_ids)] == first.prompt_ids
        assert second.images == [sha(SCREEN_1), sha(SCREEN_2)]
        assert gw.store.count_images() == 2
    finally:
        await gw.stop()
        gw.store.close()


async def test_verl_engine_passes_the_images_with_the_expanded_prompt(
        tmp_path: Path, vl_bundle: ModelBundle) -> None:
    """Inside veRL, the rollout server gets the prompt ids (placeholders expanded by the
    model's processor) and the decoded images, as `LLMServerClient.generate(image_data=...)`."""
    from types import SimpleNamespace

    from openforge.training.verl_engine import VerlEngine

    seen: list[dict[str, Any]] = []
    reply = vl_bundle.encode("ok") + vl_bundle.stop_token_ids[:1]

    class Client:
        async def generate(self, request_id: str, *, prompt_ids: list[int],
                           sampling_params: dict[str, Any], **kw: Any) -> Any:
            seen.append({"prompt_ids": prompt_ids, **kw})
            return SimpleNamespace(token_ids=reply, log_probs=[0.0] * len(reply),
                                   stop_reason="completed", extra_fields={"global_steps": 1})

    store = Store(tmp_path / "store.sqlite")
    gw = Gateway(GatewayConfig(), EngineConfig(name="verl", model="tiny-vl"), store,
                 engine=VerlEngine(model=vl_bundle, client=Client()), bundle=vl_bundle)
    await gw.start()
    try:
        session = gw.open_session()
        c = openai.AsyncOpenAI(base_url=gw.session_url(session), api_key=session.token)
        await c.chat.completions.create(model="policy", max_tokens=8, messages=[
            chat_user("Open the settings.", SCREEN_1)])
    finally:
        await gw.stop()
        store.close()
    [call] = seen
    [image] = call["image_data"]
    assert image.size == (100, 60) and image.getpixel((0, 0)) == (255, 0, 0)
    assert image_runs(vl_bundle, call["prompt_ids"]) == [expected_pads(vl_bundle, SCREEN_1)]
