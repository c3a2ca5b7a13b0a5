"""The policy model as the gateway holds it: tokenizer, chat-template renderer, limits.

Loading reads only what rendering needs: `tokenizer.json` through the Rust `tokenizers`
library, `tokenizer_config.json` and `config.json` as JSON. No torch, no transformers and
no weights are imported here, so a gateway in front of a remote engine stays small;
transformers' tokenizer is loaded only when something asks for what only it has (the
`default:` renderer's Jinja template, veRL's padding helpers).

Content is tokenized with special tokens taken as text: a tool result or a user message
that contains `<|im_end|>\\n<|im_start|>assistant` stays those characters, never control
tokens, so a file the agent reads cannot forge turn boundaries in the training data. The
one place special-token text becomes control tokens is a legacy `/v1/completions` text
prompt (`encode_prompt`): that protocol's client renders the chat template itself, as it
would for vLLM or OpenAI. A renderer that puts special tokens into the text it tokenizes
(the `default:` renderer's Jinja template) cannot keep content apart from them; for it
the gateway refuses content that contains special-token text (`protects_content` False).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openforge.errors import OpenforgeError
from openforge.gateway.ascii_path import AsciiPath
from openforge.gateway.first_renders import FirstRenders
from openforge.gateway.memory import release_memory

TINY_MODEL = "tiny"
TINY_VL_MODEL = "tiny-vl"

# Tokenizing in the render threads is parallel already; the backend's own thread pool would
# only add threads (and a warning in every process forked after it ran).
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_MEMO_TEXT = 64  # texts up to this many characters have their ids remembered (all sessions)
_MEMO_IDS = 8  # id sequences up to this long have their text remembered
_MEMO_SIZE = 4096  # entries per memo; a full memo starts over
_MISSING = object()
_SHARED_TEXT = 64 * 1024  # longer texts are not kept across sessions (see SharedTexts)
_SHARED_CHARS = 1 << 20  # characters of text SharedTexts keeps (~250k tokens' ids)
# A normalizer (NFC, ...) can merge characters; a text's length over this factor times the
# longest token is still a lower bound of its token count (see `min_tokens`).
_NORMALIZER_SHRINK = 3


def _remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    if len(memo) >= _MEMO_SIZE:
        memo.clear()
    memo[key] = value


class SessionTexts:
    """Token ids of the long texts one session's renders tokenized: each is tokenized once.

    A chat template tokenizes every message of a conversation on a full render; with this
    cache a full render of a long history costs the template's own loop, not tokenizing it
    all again. Entries not used by the last `keep` renders are dropped, so the cache holds
    about one conversation's worth of ids.
    """

    __slots__ = ("ids", "used", "renders", "keep")

    def __init__(self, keep: int = 32) -> None:
        self.ids: dict[str, tuple[int, ...]] = {}
        self.used: dict[str, int] = {}
        self.renders = 0
        self.keep = keep

    def evict(self) -> None:
        """After a render: drop the texts the last `keep` renders did not use."""
        self.renders += 1
        oldest = self.renders - self.keep
        if oldest > 0 and len(self.ids) > 64:
            stale = [text for text, at in self.used.items() if at < oldest]
            for text in stale:
                del self.ids[text]
                del self.used[text]

    def num_tokens(self) -> int:
        return sum(len(ids) for ids in self.ids.values())


class SharedTexts:
    """Token ids of long texts, shared by every session of this process (least recently
    used out, at most `budget` characters of text kept).

    Rollouts of one harness send the same long texts in their first call: its system
    prompt and tool definitions (tens of thousands of characters for coding agents). A
    session's own `SessionTexts` only helps from its second render on; this tokenizes
    each such text once per process. Render threads share it: a lock guards it.
    """

    def __init__(self, budget: int = _SHARED_CHARS) -> None:
        self.budget = budget
        self.chars = 0
        self._ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> tuple[int, ...] | None:
        with self._lock:
            ids = self._ids.get(text)
            if ids is not None:
                self._ids.move_to_end(text)
            return ids

    def put(self, text: str, ids: tuple[int, ...]) -> None:
        if len(text) > self.budget:
            return
        with self._lock:
            if text in self._ids:
                return
            self._ids[text] = ids
            self.chars += len(text)
            while self.chars > self.budget:
                old, _ = self._ids.popitem(last=False)
                self.chars -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._ids.clear()
            self.chars = 0


class FastTokenizer:
    """The tokenizer surface renderers use, on the Rust `tokenizers` backend.

    `encode`, `decode`, `convert_tokens_to_ids`, `unk_token_id`, `eos_token_id` and
    `name_or_path` are all `renderers` needs; anything else (padding, `apply_chat_template`)
    is delegated to transformers' tokenizer for the same files, loaded on first use.
    """

    def __init__(self, backend: Any, source: str, config: dict[str, Any],
                 *, specials_as_text: bool) -> None:
        self._backend = backend
        self._source = source
        self.name_or_path = source
        self._clean_up = bool(config.get("clean_up_tokenization_spaces", False))
        added = backend.get_added_tokens_decoder()
        self.special_tokens: dict[str, int] = {
            tok.content: tid for tid, tok in added.items() if tok.special}
        self.eos_token = _token_text(config.get("eos_token"))
        self.eos_token_id = self._id_or_none(self.eos_token)
        unk = _token_text(config.get("unk_token")) or getattr(backend.model, "unk_token", None)
        self.unk_token_id = self._id_or_none(unk)
        self._hf: Any = None
        self._hf_lock = threading.Lock()
        self._encoded: dict[str, tuple[int, ...]] = {}
        self._shared = SharedTexts()
        self._decoded: dict[tuple[int, ...], str] = {}
        self._token_ids: dict[str, Any] = {}
        self._local = threading.local()
        # Without character offsets where the backend can (renderers do not use them).
        self._encode_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)
        # Exact ids of ASCII text at a fraction of the backend's cost, where it applies.
        self.ascii_path = AsciiPath.build(backend)
        self.set_specials_as_text(specials_as_text)
        # Special-token text in a raw prompt: split on it, then encode each piece (what the
        # backend itself does for added tokens that strip nothing).
        names = sorted(self.special_tokens, key=len, reverse=True)
        self._special_re = re.compile("|".join(map(re.escape, names))) if names else None

    def _id_or_none(self, token: str | None) -> int | None:
        return None if token is None else self._backend.token_to_id(token)

    def set_specials_as_text(self, on: bool) -> None:
        """Whether `encode` splits special-token text into ordinary tokens."""
        self.specials_as_text = on
        self._backend.encode_special_tokens = on
        self._encoded.clear()
        self._shared.clear()

    # -- the renderer-facing surface --------------------------------------------------------

    def encode(self, text: str, *args: Any, add_special_tokens: bool = False,
               **kwargs: Any) -> list[int]:
        if args or kwargs or add_special_tokens:
            return list(self.hf.encode(text, *args, add_special_tokens=add_special_tokens,
                                       **kwargs))
        if len(text) <= _MEMO_TEXT:
            # Renderers encode the same template pieces ("\n", "user", the assistant header)
            # several times per call; tokenization is deterministic, so remember them.
            ids = self._encoded.get(text)
            if ids is None:
                fast = self._ascii_ids(text)
                ids = tuple(fast if fast is not None
                            else self._backend.encode(text, add_special_tokens=False).ids)
                _remember(self._encoded, text, ids)
            return list(ids)
        texts: SessionTexts | None = getattr(self._local, "texts", None)
        if texts is None:
            return list(self._encode_shared(text))
        ids = texts.ids.get(text)
        if ids is None:
            ids = self._encode_shared(text)
            texts.ids[text] = ids
        texts.used[text] = texts.renders
        return list(ids)

    def _encode_shared(self, text: str) -> tuple[int, ...]:
        """Ids of a long text, from the texts every session shares when it is one of them."""
        if len(text) > _SHARED_TEXT:
            return tuple(self.encode_long(text))
        ids = self._shared.get(text)
        if ids is None:
            ids = tuple(self.encode_long(text))
            self._shared.put(text, ids)
        return ids

    def encode_long(self, text: str) -> list[int]:
        """Ids of a long text; the GIL is released while the backend works, so a render
        thread tokenizing a large message does not stall the event loop (the ASCII path
        holds it, and takes only texts it scans in well under a millisecond)."""
        fast = self._ascii_ids(text)
        if fast is not None:
            return fast
        return self._encode_batch([text], add_special_tokens=False)[0].ids  # type: ignore[no-any-return]

    def _ascii_ids(self, text: str) -> list[int] | None:
        """The ASCII path's ids of `text`; None where there is no path or it does not apply."""
        return None if self.ascii_path is None else self.ascii_path.encode(text)

    def decode(self, token_ids: Any, *args: Any, skip_special_tokens: bool = False,
               **kwargs: Any) -> str:
        if args or kwargs or self._clean_up:
            return str(self.hf.decode(token_ids, *args,
                                      skip_special_tokens=skip_special_tokens, **kwargs))
        ids = tuple(token_ids)
        if len(ids) > _MEMO_IDS or skip_special_tokens:
            return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)  # type: ignore[no-any-return]
        # Short decodes (a marker token, an assistant header) repeat on every call.
        text = self._decoded.get(ids)
        if text is None:
            text = self._backend.decode(list(ids), skip_special_tokens=False)
            _remember(self._decoded, ids, text)
        return text

    def convert_tokens_to_ids(self, tokens: Any) -> Any:
        if not isinstance(tokens, str):
            return [self.convert_tokens_to_ids(t) for t in tokens]
        # Renderers look up their marker tokens ("<think>", ...) on every call.
        found = self._token_ids.get(tokens, _MISSING)
        if found is _MISSING:
            found = self._backend.token_to_id(tokens)
            if found is None:
                found = self.unk_token_id
            _remember(self._token_ids, tokens, found)
        return found

    def __len__(self) -> int:
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    # -- gateway extras ---------------------------------------------------------------------

    @contextlib.contextmanager
    def session_texts(self, texts: SessionTexts) -> Iterator[None]:
        """Long texts encoded in this thread meanwhile go through `texts` (see SessionTexts)."""
        previous = getattr(self._local, "texts", None)
        self._local.texts = texts
        try:
            yield
        finally:
            self._local.texts = previous
            texts.evict()

    def encode_prompt(self, text: str) -> list[int]:
        """A raw prompt's ids, special-token text taken as control tokens."""
        if not self.specials_as_text or self._special_re is None:
            return self.encode_long(text) if len(text) > _MEMO_TEXT else self.encode(text)
        ids: list[int] = []
        start = 0
        for match in self._special_re.finditer(text):
            if match.start() > start:
                ids.extend(self.encode_long(text[start:match.start()]))
            ids.append(self.special_tokens[match.group()])
            start = match.end()
        if start < len(text):
            ids.extend(self.encode_long(text[start:]))
        return ids

    @property
    def hf(self) -> Any:
        """transformers' tokenizer for the same files (imported and loaded on first use)."""
        if self._hf is None:
            with self._hf_lock:
                if self._hf is None:
                    from transformers import AutoTokenizer

                    self._hf = AutoTokenizer.from_pretrained(self._source)
        return self._hf

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # above all not __call__: renderers then skip offsets
            raise AttributeError(name)
        return getattr(self.hf, name)


def _token_text(value: Any) -> str | None:
    """A token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclass
class ModelBundle:
    """Everything the gateway needs to turn conversations into ids for one policy model."""

    name: str
    path: Path
    tokenizer: Any
    renderer: Any
    stop_token_ids: list[int]
    renderer_name: str = ""
    multimodal: bool = False
    # The renderer that bridges across user turns too (thinking_retention "all"): the
    # `append` render policy's; None when the renderer has no such setting.
    append_renderer: Any = None
    context_length: int | None = None  # tokens; None: unknown (no check)
    vocab_size: int = 0  # valid ids are 0 <= id < vocab_size
    max_token_chars: int = 0  # characters the longest token covers (0: unknown)
    # How many characters of input at most become one after the tokenizer's normalizer
    # (1 without one; NFC composes at most 3 into 1, e.g. Hangul jamo into a syllable).
    normalizer_shrink: int = _NORMALIZER_SHRINK
    protects_content: bool = True  # special-token text in content stays text
    special_texts: tuple[str, ...] = field(default_factory=tuple)
    # Sessions' first prompts, shared by the sessions of this model.
    first_renders: FirstRenders = field(default_factory=FirstRenders)

    def encode(self, text: str) -> list[int]:
        """Content text -> ids, without template tokens (special-token text stays text)."""
        if len(text) > _MEMO_TEXT and isinstance(self.tokenizer, FastTokenizer):
            return self.tokenizer.encode_long(text)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_prompt(self, text: str) -> list[int]:
        """A legacy completions text prompt -> ids (special-token text is control tokens)."""
        if isinstance(self.tokenizer, FastTokenizer):
            return self.tokenizer.encode_prompt(text)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def min_tokens(self, chars: int) -> int:
        """A lower bound of the tokens that `chars` characters of text take (0: unknown)."""
        if self.max_token_chars <= 0:
            return 0
        return chars // (self.max_token_chars * self.normalizer_shrink)

    def special_text_in(self, text: str) -> str | None:
        """The first special token's text found in `text`, or None."""
        for special in self.special_texts:
            if special in text:
                return special
        return None


_bundles: dict[tuple[str, str, str | None], ModelBundle] = {}
_bundles_lock = threading.Lock()


def load_model_bundle(model: str = TINY_MODEL, renderer: str = "auto",
                      thinking_retention: str | None = None) -> ModelBundle:
    """Load (once per process) the tokenizer and renderer for `model`.

    `model` is "tiny" (the built-in untrained Qwen3, built offline on first use), "tiny-vl"
    (its multimodal Qwen3-VL sibling), a local model folder, or a Hugging Face name
    available offline. `renderer` is "auto", a `renderers` config name ("qwen3", "qwen3.5",
    "llama-3", ...), or "default:TOOL_PARSER[:REASONING_PARSER]" (the model's Jinja template
    with parsers by name, e.g. "default:hermes:think"). `thinking_retention`
    ("tool_cycle" / "all") overrides how the renderer bridges across user turns.
    """
    key = (model, renderer, thinking_retention)
    with _bundles_lock:
        bundle = _bundles.get(key)
        if bundle is None:
            bundle = _load(model, renderer, thinking_retention)
            _bundles[key] = bundle
        return bundle


def _model_folder(model: str) -> tuple[Path, str]:
    """The model's local folder (None-like Path when it is a hub name) and the source to
    load from."""
    if model in (TINY_MODEL, TINY_VL_MODEL):
        from openforge.tinymodel import ensure_tiny_model, ensure_tiny_vl_model

        path = ensure_tiny_model() if model == TINY_MODEL else ensure_tiny_vl_model()
        return path, str(path)
    path = Path(model).expanduser()
    if path.exists():
        return path, str(path)
    try:
        from huggingface_hub import snapshot_download

        local = Path(snapshot_download(model, local_files_only=True))
        return local, str(local)
    except Exception:
        return path, model


def _cannot_load(model: str, what: str) -> OpenforgeError:
    return OpenforgeError(
        f"cannot load the tokenizer of model {model!r} ({what}); give 'tiny', 'tiny-vl', a "
        "local model folder, or a Hugging Face name cached on this machine")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _load(model: str, renderer: str, thinking_retention: str | None) -> ModelBundle:
    import tokenizers

    path, source = _model_folder(model)
    tokenizer_file = path / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise _cannot_load(model, "no tokenizer.json found")
    try:
        backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:
        raise _cannot_load(model, type(exc).__name__) from None
    model_config = _read_json(path / "config.json")
    tokenizer = FastTokenizer(backend, source, _read_json(path / "tokenizer_config.json"),
                              specials_as_text=True)
    config = _renderer_config(model, path, renderer, thinking_retention)
    rend = _make_renderer(tokenizer, config, model, renderer)
    name = getattr(getattr(rend, "config", None), "name", None) or type(rend).__name__
    from renderers import is_multimodal

    multimodal = is_multimodal(rend)
    append = _append_renderer(tokenizer, rend, model, renderer)
    if multimodal:
        rend = _with_image_processor(rend, tokenizer, source)
        if append is not None:
            append = _with_image_processor(append, tokenizer, source)
    protects = _keeps_content_specials_as_text(tokenizer, rend)
    if not protects:
        tokenizer.set_specials_as_text(False)
    vocab = model_config.get("vocab_size") or _text_config(model_config).get("vocab_size")
    max_token_chars = _max_token_chars(backend)
    release_memory()  # the JSON and vocabulary tables of loading are garbage now
    return ModelBundle(
        name=model, path=path, tokenizer=tokenizer, renderer=rend,
        stop_token_ids=list(rend.get_stop_token_ids()), renderer_name=str(name),
        multimodal=multimodal, append_renderer=append,
        context_length=_context_length(model_config),
        vocab_size=int(vocab) if isinstance(vocab, int) and vocab > 0 else len(tokenizer),
        max_token_chars=max_token_chars,
        normalizer_shrink=1 if backend.normalizer is None else _NORMALIZER_SHRINK,
        protects_content=protects,
        special_texts=tuple(sorted(tokenizer.special_tokens, key=len, reverse=True)))


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else {}


def _context_length(config: dict[str, Any]) -> int | None:
    """The model's context window from its config.json, when it states one."""
    for source in (config, _text_config(config)):
        for key in ("max_position_embeddings", "max_sequence_length", "seq_length",
                    "n_positions"):
            value = source.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def _max_token_chars(backend: Any) -> int:
    """Characters of text the longest token covers; 0 when the vocabulary does not say.

    Only for BPE vocabularies in which every character has a token (byte-level, or byte
    fallback, or no unknown token): an unknown-token model can cover a run of unknown
    characters with one token. Byte-level vocabularies write each byte as one character,
    so a token's length is the bytes it covers, at least the characters it covers.
    """
    model = backend.model
    if type(model).__name__ != "BPE" or not (
            getattr(model, "unk_token", None) is None or getattr(model, "byte_fallback", False)):
        return 0
    try:
        vocab = backend.get_vocab(with_added_tokens=True)
    except Exception:
        return 0
    return max((len(token) for token in vocab), default=0)


def _make_renderer(tokenizer: Any, config: Any, model: str, renderer: str) -> Any:
    try:
        from renderers import create_renderer

        return create_renderer(tokenizer, config)
    except Exception as exc:
        raise OpenforgeError(
            f"cannot build renderer {renderer!r} for model {model!r}: {exc}".splitlines()[0]
        ) from None


def _append_renderer(tokenizer: Any, rend: Any, model: str, renderer: str) -> Any:
    """`rend` with thinking_retention "all", or None when its config has no such field."""
    config = getattr(rend, "config", None)
    fields = getattr(type(config), "model_fields", {})
    if config is None or "thinking_retention" not in fields:
        return None
    if getattr(config, "thinking_retention", None) == "all":
        return rend
    try:
        return _make_renderer(tokenizer, config.model_copy(update={"thinking_retention": "all"}),
                              model, renderer)
    except OpenforgeError:
        return None


def _keeps_content_specials_as_text(tokenizer: FastTokenizer, rend: Any) -> bool:
    """Whether `rend` renders special-token text in content as text, scaffolding unchanged.

    Two probes: the same conversation rendered with special-token text split and not split
    must give the same ids (the renderer emits its control tokens by id, not as text), and
    a user message holding a special token's text must not add that token's id.
    """
    if not tokenizer.special_tokens:
        return True
    special, special_id = next(iter(tokenizer.special_tokens.items()))
    plain = [{"role": "system", "content": "s"}, {"role": "user", "content": "x"},
             {"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}]
    try:
        split = rend.render_ids(plain, add_generation_prompt=True)
        tokenizer.set_specials_as_text(False)
        unsplit = rend.render_ids(plain, add_generation_prompt=True)
        tokenizer.set_specials_as_text(True)
        injected = [*plain[:-1], {"role": "user", "content": f"z{special}z"}]
        leaked = rend.render_ids(injected, add_generation_prompt=True).count(special_id)
    except Exception:
        tokenizer.set_specials_as_text(True)
        return False
    return split == unsplit and leaked == split.count(special_id)


@dataclass
class ImageProcessorOnly:
    """The part of a multimodal HF processor a renderer uses for images.

    `renderers` would lazy-load the model's full `AutoProcessor`, which for Qwen-VL also
    builds a video processor that needs torchvision; images need only the image processor,
    the very class (and settings) the inference engine expands placeholders with.
    """

    image_processor: Any


def _with_image_processor(rend: Any, tokenizer: Any, source: str) -> Any:
    """The renderer rebuilt with the model's own image processor, when one loads offline."""
    from transformers import AutoImageProcessor

    try:
        image_processor = AutoImageProcessor.from_pretrained(source)
    except Exception:  # none cached: the renderer loads the full processor when it needs one
        return rend
    try:
        return type(rend)(tokenizer, rend.config, processor=ImageProcessorOnly(image_processor))
    except TypeError:  # a renderer that takes no processor argument
        return rend


def _renderer_config(model: str, path: Path, renderer: str,
                     thinking_retention: str | None) -> Any:
    """A typed `renderers` config, or None to let `renderers` auto-detect by model name."""
    from renderers import config_from_name
    from renderers.base import MODEL_RENDERER_MAP

    name = renderer
    if renderer == "auto":
        name = _detect_renderer(model, path, MODEL_RENDERER_MAP) or "auto"
    if name.startswith("default:"):
        return _default_config(name)
    try:
        config = config_from_name(name)
    except Exception:
        known = ", ".join(sorted(set(MODEL_RENDERER_MAP.values())))
        raise OpenforgeError(f"unknown renderer {renderer!r}; known: auto, {known}") from None
    if thinking_retention is not None:
        if config is None:
            raise OpenforgeError(
                f"thinking_retention needs a named renderer for model {model!r} (--renderer)")
        config = config.model_copy(update={"thinking_retention": thinking_retention})
    return config


TOOL_PARSER_ALIASES = {"hermes": "qwen3"}
"""Hermes-style `<tool_call>{json}</tool_call>` is what `renderers` calls the qwen3 parser."""


def _default_config(spec: str) -> Any:
    """`default:TOOL_PARSER[:REASONING_PARSER]`: the model's own Jinja template
    (apply_chat_template) with parsers from `renderers`' registry, e.g. `default:hermes:think`.
    """
    from renderers import DefaultRendererConfig
    from renderers.parsers import REASONING_PARSERS, TOOL_PARSERS

    parts = spec.split(":")[1:]
    tool = TOOL_PARSER_ALIASES.get(parts[0], parts[0]) if parts and parts[0] else None
    reasoning = parts[1] if len(parts) > 1 and parts[1] else None
    if tool is not None and tool not in TOOL_PARSERS:
        raise OpenforgeError(f"unknown tool parser {parts[0]!r} in renderer {spec!r}; known: "
                             f"{', '.join(sorted([*TOOL_PARSERS, *TOOL_PARSER_ALIASES]))}")
    if reasoning is not None and reasoning not in REASONING_PARSERS:
        raise OpenforgeError(f"unknown reasoning parser {reasoning!r} in renderer {spec!r}; "
                             f"known: {', '.join(sorted(REASONING_PARSERS))}")
    return DefaultRendererConfig(tool_parser=tool, reasoning_parser=reasoning)


def _detect_renderer(model: str, path: Path, known: dict[str, str]) -> str | None:
    """Renderer name from a marker file, the exact model name, or the folder's base name."""
    from openforge.tinymodel import RENDERER_MARKER

    marker = path / RENDERER_MARKER
    if marker.is_file():
        try:
            value = json.loads(marker.read_text()).get("renderer")
        except (OSError, ValueError, AttributeError):
            value = None
        if isinstance(value, str):
            return value
    if model in known:
        return known[model]
    # A local copy of a known model, e.g. ~/models/Qwen3-0.6B for "Qwen/Qwen3-0.6B".
    by_base = {k.rsplit("/", 1)[-1].lower(): v for k, v in known.items()}
    return by_base.get(path.name.lower())
