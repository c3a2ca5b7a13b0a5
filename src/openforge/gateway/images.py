"""Image content of a request -> exact bytes, content hash and media type, safely.

Every dialect parses an image into an `ImageRef` holding the URL the harness sent: a
`data:` URL (OpenAI chat/Responses, and Anthropic base64 sources turned into one), a
`file://` URL, or an http(s) URL. `resolve_images` turns each into the exact decoded bytes,
their sha256 (the key the store keeps each image under, once) and their media type,
before anything is rendered or recorded, so that the renderer never opens a URL itself.

Policy (`ImagePolicy`), secure by default:

- data URLs must be base64 (as every SDK sends them) and decode to a PNG, JPEG, GIF or
  WebP image; the media type recorded is the one the bytes are, not the one declared.
- `file://` URLs are read only under `file_root` (unset: refused), after resolving
  symlinks and `..`, so a session cannot read arbitrary files on the gateway host.
- http(s) URLs are refused: the gateway does not fetch (it would need the bytes to
  render exact prompt tokens, and fetching from a rollout's request is an SSRF hole).
- each image is at most `max_image_bytes`; a request holds at most `max_images`.

Violations raise `ImageError` with a one-line message and the HTTP status to answer.
"""

from __future__ import annotations

import binascii
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from openforge.gateway.conversation import ChatRequest, ImageRef

if TYPE_CHECKING:
    from openforge.config import GatewayConfig
    from openforge.store import Store

MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_IMAGES = 256
IMAGE_ROOT_ENV = "OPENFORGE_IMAGE_ROOT"
# What a recorded request holds in place of an inline image: the bytes live once, in the
# store's `images` table, under this hash.
IMAGE_REF_PREFIX = "openforge-image:sha256:"
"""When set, the folder under which `file://` image URLs may be read (default: none)."""

# Image roles: the chat templates render images in user turns and tool results only;
# an image elsewhere would be recorded without being in the prompt.
IMAGE_ROLES = frozenset({"user", "tool"})

_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}


class ImageError(ValueError):
    """An image the gateway will not accept; `status` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class ImagePolicy:
    """Where images may come from and how large they may be."""

    file_root: Path | None = None
    max_image_bytes: int = MAX_IMAGE_BYTES
    max_images: int = MAX_IMAGES

    @classmethod
    def from_env(cls) -> ImagePolicy:
        """The default policy, with `file_root` from `$OPENFORGE_IMAGE_ROOT` when set."""
        root = os.environ.get(IMAGE_ROOT_ENV)
        return cls(file_root=Path(root).expanduser().resolve() if root else None)

    @classmethod
    def for_gateway(cls, config: GatewayConfig) -> ImagePolicy:
        """The policy `gateway.image_root` and `gateway.max_image_bytes` set (the root from
        `$OPENFORGE_IMAGE_ROOT` when the config names none)."""
        root = (config.image_root.expanduser().resolve() if config.image_root
                else cls.from_env().file_root)
        return cls(file_root=root, max_image_bytes=config.max_image_bytes)


def sniff_media_type(data: bytes) -> str | None:
    """The media type of image bytes by their signature, or None when not a known image."""
    for magic, media in _SIGNATURES:
        if data.startswith(magic):
            return media
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _short(url: str) -> str:
    return url if len(url) <= 60 else url[:57] + "..."


def _decode_data_url(url: str, policy: ImagePolicy) -> bytes:
    header, comma, payload = url.partition(",")
    if not comma:
        raise ImageError("an image data URL needs a ',' before its data")
    params = header[len("data:"):].split(";")
    if "base64" not in (p.strip().lower() for p in params[1:]):
        raise ImageError("an image data URL must be base64-encoded (data:image/png;base64,...)")
    # Base64 is 4 characters per 3 bytes: refuse an oversized image before decoding it.
    if len(payload) * 3 // 4 > policy.max_image_bytes + 3:
        raise _too_large(policy)
    try:
        return binascii.a2b_base64(payload.strip(), strict_mode=True)
    except (binascii.Error, ValueError):
        raise ImageError("an image data URL's base64 data is malformed") from None


def _read_file_url(url: str, policy: ImagePolicy) -> bytes:
    if policy.file_root is None:
        raise ImageError(f"file image URLs are disabled on this gateway ({_short(url)}); send "
                         f"the image as a data URL, or start the gateway with "
                         f"{IMAGE_ROOT_ENV} set to the folder images may be read from")
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise ImageError(f"file image URL {_short(url)} names a remote host")
    root = policy.file_root.resolve()
    # resolve() follows symlinks and '..': what is checked is the file actually opened.
    path = Path(unquote(parsed.path)).resolve()
    if not path.is_relative_to(root):
        raise ImageError(f"file image URL {_short(url)} is outside the gateway's image root")
    try:
        size = path.stat().st_size
        if size > policy.max_image_bytes:
            raise _too_large(policy)
        with path.open("rb") as handle:
            return handle.read(policy.max_image_bytes + 1)
    except OSError:
        raise ImageError(f"cannot read image file {_short(url)}") from None


def _too_large(policy: ImagePolicy) -> ImageError:
    return ImageError(f"an image exceeds the gateway's limit of {policy.max_image_bytes} bytes",
                      status=413)


def load_image_bytes(url: str, policy: ImagePolicy) -> bytes:
    """The exact bytes behind an image URL, as the policy allows; ImageError otherwise."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        data = _decode_data_url(url, policy)
    elif scheme == "file":
        data = _read_file_url(url, policy)
    elif scheme in ("http", "https"):
        raise ImageError(f"the gateway does not fetch image URLs ({_short(url)}); send the "
                         "image inline as a base64 data URL")
    else:
        raise ImageError(f"unsupported image URL {_short(url)}: use a base64 data URL")
    if len(data) > policy.max_image_bytes:
        raise _too_large(policy)
    return data


def resolve_image(ref: ImageRef, policy: ImagePolicy) -> ImageRef:
    """Fill `ref`'s bytes, sha256 and media type (in place; a resolved ref is kept)."""
    if ref.data is not None:
        return ref
    data = load_image_bytes(ref.url, policy)
    media = sniff_media_type(data)
    if media is None:
        raise ImageError(f"image {_short(ref.url)} is not a PNG, JPEG, GIF or WebP image")
    ref.data, ref.media_type = data, media
    ref.sha256 = hashlib.sha256(data).hexdigest()
    return ref


def resolve_images(request: ChatRequest, policy: ImagePolicy) -> list[ImageRef]:
    """Resolve every image of `request`; returns them in prompt order (duplicates kept).

    Refs shared with earlier requests (the session's parsed-history memo) are resolved
    already and cost nothing.
    """
    refs: list[ImageRef] = []
    for message in request.messages:
        if not message.images:
            continue
        if message.role not in IMAGE_ROLES:
            raise ImageError(f"images are accepted in user and tool messages only, not in "
                             f"{message.role} messages")
        refs.extend(message.images)
    if len(refs) > policy.max_images:
        raise ImageError(f"the request holds {len(refs)} images; the gateway's limit is "
                         f"{policy.max_images}", status=413)
    return [resolve_image(ref, policy) for ref in refs]


def image_blobs(refs: Iterable[ImageRef]) -> dict[str, tuple[str, bytes]]:
    """sha256 -> (media type, bytes) of resolved refs: what the store keeps once each."""
    return {r.sha256: (r.media_type, r.data) for r in refs
            if r.sha256 is not None and r.data is not None and r.media_type is not None}


def attach_stored_images(request: ChatRequest, hashes: list[str], store: Store) -> None:
    """Give a stored request's images the bytes recorded for it (`hashes`: its call's
    `images`, in prompt order), so a restarted gateway re-renders exactly what it saw,
    whatever a file URL holds today. Leaves the refs as they are when the counts differ."""
    refs = [ref for message in request.messages for ref in message.images]
    if len(refs) != len(hashes):
        return
    for ref, sha in zip(refs, hashes, strict=True):
        image = store.get_image(sha) if ref.data is None else None
        if image is not None:
            ref.data, ref.sha256, ref.media_type = image.data, image.sha256, image.media_type


def without_inline_images(payload: Any, refs: Iterable[ImageRef]) -> Any:
    """A copy of a request body with each inline image (a data URL, or an Anthropic base64
    `data` field) replaced by `openforge-image:sha256:<hash>`, so a recorded request does
    not hold a second copy of bytes the store keeps once. Replaying it re-attaches the
    bytes by the call's `images` (see `attach_stored_images`)."""
    inline: dict[str, str] = {}
    for ref in refs:
        if ref.sha256 is not None and ref.url.startswith("data:"):
            inline[ref.url] = inline[ref.url.partition(",")[2]] = IMAGE_REF_PREFIX + ref.sha256
    if not inline:
        return payload

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return inline.get(value, value)
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        return value

    return walk(payload)
