"""Image URLs -> exact bytes under the gateway's policy; images stored once by content hash."""

from __future__ import annotations

import base64
import hashlib
import io
import os
from pathlib import Path

import pytest
from PIL import Image

from openforge.gateway.conversation import ChatRequest, ImageRef, Message
from openforge.gateway.images import (
    ImageError,
    ImagePolicy,
    image_blobs,
    resolve_image,
    resolve_images,
    sniff_media_type,
)
from openforge.store import DuplicateCallError, Store
from openforge.types import Call


def encoded(fmt: str, color: str = "red") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), color).save(buf, fmt)
    return buf.getvalue()


PNG = encoded("PNG")
JPEG = encoded("JPEG")


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def resolve(url: str, policy: ImagePolicy | None = None) -> ImageRef:
    return resolve_image(ImageRef(url=url), policy or ImagePolicy())


# --- data URLs ----------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "media"), [(PNG, "image/png"), (JPEG, "image/jpeg"),
                                             (encoded("GIF"), "image/gif"),
                                             (encoded("WEBP"), "image/webp")])
def test_data_urls_decode_to_the_exact_bytes(data: bytes, media: str) -> None:
    ref = resolve(data_url(data))
    assert ref.data == data
    assert ref.sha256 == hashlib.sha256(data).hexdigest()
    assert ref.media_type == media  # what the bytes are, whatever the URL declared
    assert sniff_media_type(data) == media


@pytest.mark.parametrize(("url", "message"), [
    ("data:image/png,rawtext", "base64-encoded"),
    ("data:image/png;base64", "needs a ','"),
    ("data:image/png;base64,@@@@", "malformed"),
    ("data:image/png;base64," + base64.b64encode(b"%PDF-1.4 hello").decode(), "not a PNG"),
    ("ftp://host/x.png", "unsupported image URL"),
    ("/etc/passwd", "unsupported image URL"),
    ("http://169.254.169.254/latest", "does not fetch"),
])
def test_bad_image_urls_are_400_with_a_reason(url: str, message: str) -> None:
    with pytest.raises(ImageError, match=message) as info:
        resolve(url)
    assert info.value.status == 400


def test_size_limits_are_413() -> None:
    with pytest.raises(ImageError, match="exceeds") as info:
        resolve(data_url(PNG), ImagePolicy(max_image_bytes=len(PNG) - 1))
    assert info.value.status == 413
    assert resolve(data_url(PNG), ImagePolicy(max_image_bytes=len(PNG))).data == PNG
    request = ChatRequest(messages=[Message(role="user", images=[
        ImageRef(url=data_url(PNG)) for _ in range(3)])])
    with pytest.raises(ImageError, match="limit is 2") as info:
        resolve_images(request, ImagePolicy(max_images=2))
    assert info.value.status == 413


# --- files ----------------------------------------------------------------------------------


def test_file_urls_are_refused_unless_a_root_is_configured(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(PNG)
    with pytest.raises(ImageError, match="disabled"):
        resolve((tmp_path / "a.png").as_uri())
    assert resolve((tmp_path / "a.png").as_uri(), ImagePolicy(file_root=tmp_path)).data == PNG


def test_file_urls_cannot_escape_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret.png").write_bytes(PNG)
    os.symlink(tmp_path / "secret.png", root / "link.png")
    policy = ImagePolicy(file_root=root)
    for url in (f"file://{root}/../secret.png", (root / "link.png").as_uri(),
                (tmp_path / "secret.png").as_uri()):
        with pytest.raises(ImageError, match="outside"):
            resolve(url, policy)
    with pytest.raises(ImageError, match="remote host"):
        resolve("file://fileserver/share/a.png", policy)
    with pytest.raises(ImageError, match="cannot read"):
        resolve((root / "missing.png").as_uri(), policy)


def test_policy_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("OPENFORGE_IMAGE_ROOT", raising=False)
    assert ImagePolicy.from_env().file_root is None
    monkeypatch.setenv("OPENFORGE_IMAGE_ROOT", str(tmp_path))
    assert ImagePolicy.from_env().file_root == tmp_path.resolve()


# --- requests ---------------------------------------------------------------------------------


def test_resolve_images_keeps_prompt_order_and_repeats() -> None:
    blue = encoded("PNG", "blue")
    request = ChatRequest(messages=[
        Message(role="user", content="a", images=[ImageRef(url=data_url(PNG))]),
        Message(role="assistant", content="ok"),
        Message(role="tool", content="shot", tool_call_id="c",
                images=[ImageRef(url=data_url(blue)), ImageRef(url=data_url(PNG))]),
    ])
    refs = resolve_images(request, ImagePolicy())
    assert [r.data for r in refs] == [PNG, blue, PNG]
    assert set(image_blobs(refs)) == {hashlib.sha256(PNG).hexdigest(),
                                      hashlib.sha256(blue).hexdigest()}
    # The renderer is handed the bytes, never the URL.
    assert request.messages[0].to_renderer()["content"][0] == {"type": "image", "image": PNG}


def test_images_outside_user_and_tool_messages_are_refused() -> None:
    request = ChatRequest(messages=[Message(role="system", images=[ImageRef(url=data_url(PNG))]),
                                    Message(role="user", content="hi")])
    with pytest.raises(ImageError, match="user and tool messages only"):
        resolve_images(request, ImagePolicy())


# --- the store --------------------------------------------------------------------------------


def recorded(cid: str, images: list[str]) -> Call:
    return Call(id=cid, session_id="s", prompt_ids=[1, 2], completion_ids=[3], logprobs=[0.0],
                images=images)


def test_store_keeps_each_image_once_and_calls_reference_it(tmp_path: Path) -> None:
    refs = [resolve(data_url(PNG)), resolve(data_url(JPEG))]
    blobs = image_blobs(refs)
    hashes = [r.sha256 or "" for r in refs]
    with Store(tmp_path / "s.sqlite") as store:
        store.add_call(recorded("a", hashes[:1]), images={hashes[0]: blobs[hashes[0]]})
        store.add_call(recorded("b", hashes), images=blobs)
        assert store.count_images() == 2
    # A fresh process (a restarted gateway, an export) reads the same bytes back.
    with Store(tmp_path / "s.sqlite") as store:
        assert store.get_call("b").images == hashes  # type: ignore[union-attr]
        png = store.get_image(hashes[0])
        assert png is not None and png.data == PNG and png.media_type == "image/png"
        store.add_call(recorded("c", hashes), images=blobs)  # already stored: kept once
        assert store.count_images() == 2
        assert store.get_image("0" * 64) is None


def test_a_rolled_back_call_leaves_no_image(tmp_path: Path) -> None:
    ref = resolve(data_url(PNG))
    with Store(tmp_path / "s.sqlite") as store:
        store.add_call(recorded("a", []))
        with pytest.raises(DuplicateCallError):
            store.add_call(recorded("a", [ref.sha256 or ""]), images=image_blobs([ref]))
        assert store.count_images() == 0
        # ...and the image is stored with the next call that references it.
        store.add_call(recorded("b", [ref.sha256 or ""]), images=image_blobs([ref]))
        assert store.count_images() == 1
