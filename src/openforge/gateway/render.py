"""Conversation -> prompt token ids, completion ids -> assistant message, per session.

Built on the `renderers` library, which owns each model family's chat template in code:
`render_ids` for full renders, `bridge_to_next_turn` to extend the previous prompt and
completion by exactly the tokens a new turn adds, `parse_response` to read content,
reasoning and tool calls back from token ids.

`SessionTokens` keeps, per session, the exact token ids of each *branch*: the prompt and
completion of its last committed call, plus a fingerprint of the canonical messages and
tools they came from. A request whose messages extend a branch reuses those ids verbatim
and tokenizes only the new suffix, so a trainer sees exactly the tokens the policy saw.
A request that does not extend any branch (a retry, a title call, a rewritten history, a
new conversation) opens a new branch with a reason instead of corrupting an old one.
"""

from __future__ import annotations

import functools
import json
import struct
import threading
import uuid
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr

from openforge.errors import OpenforgeError
from openforge.gateway.conversation import (
    ChatRequest,
    FinishReason,
    Message,
    Tool,
    ToolCall,
)

BRANCH_RETRY = "retry"
"""The request repeats the messages of an earlier call's prompt."""
BRANCH_SIDE_CALL = "side_call"
"""No tools while the main branch has tools, or another system prompt: titles, sub-agents."""
BRANCH_HISTORY_REWRITTEN = "history_rewritten"
"""Shares a prefix of messages with a branch, then diverges (edited, compacted, truncated)."""
BRANCH_NEW_CONVERSATION = "new_conversation"
"""Shares nothing with any branch."""
BRANCH_TEMPLATE_REWRITE = "template_rewrite"
"""The messages extend a branch but the chat template re-renders earlier turns differently
(Qwen3 drops past reasoning at a new user query), so the old ids are not a prefix."""
BRANCH_CONCURRENT = "concurrent"
"""Two calls extended the same branch at once; the one committed second forks."""
BRANCH_TRANSIENT_CONTEXT = "transient_context"
"""The branch's last prompt ended in a user message that this request drops from the
history, which it otherwise extends: a harness's per-request context note (OpenClaw
appends an internal-context user message to every request and keeps it out of history).
The model saw that note, so the ids are not a prefix: a new branch, explained."""

BRANCH_REASONS: tuple[str, ...] = (
    BRANCH_RETRY, BRANCH_SIDE_CALL, BRANCH_HISTORY_REWRITTEN, BRANCH_NEW_CONVERSATION,
    BRANCH_TEMPLATE_REWRITE, BRANCH_CONCURRENT, BRANCH_TRANSIENT_CONTEXT,
)

TINY_MODEL = "tiny"
TINY_VL_MODEL = "tiny-vl"


# ----------------------------------------------------------------------------------------
# Model bundle: tokenizer + renderer
# ----------------------------------------------------------------------------------------


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

    def encode(self, text: str) -> list[int]:
        """Plain text -> ids, without template tokens (special-token text maps to its id)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))


_MEMO_TEXT = 64  # texts up to this many characters have their ids remembered
_MEMO_IDS = 8  # id sequences up to this long have their text remembered
_MEMO_SIZE = 4096  # entries per memo; a full memo starts over
_MISSING = object()


def _remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    if len(memo) >= _MEMO_SIZE:
        memo.clear()
    memo[key] = value


class FastTokenizer:
    """The renderer-facing tokenizer surface straight on the Rust `tokenizers` backend.

    transformers' `encode` costs ~0.2 ms of Python per call and a bridge calls it a dozen
    times; the backend gives the same ids in microseconds. Without `__call__` (offsets),
    `renderers` skips content attribution, which the gateway does not use; token ids are
    unchanged because the joined text is still encoded in one pass. Everything else is
    delegated to the wrapped transformers tokenizer.
    """

    def __init__(self, hf_tokenizer: Any) -> None:
        self._hf = hf_tokenizer
        self._backend = hf_tokenizer.backend_tokenizer
        self._clean_up = bool(getattr(hf_tokenizer, "clean_up_tokenization_spaces", False))
        self.name_or_path = hf_tokenizer.name_or_path
        self.unk_token_id = hf_tokenizer.unk_token_id
        self.eos_token_id = hf_tokenizer.eos_token_id
        self._encoded: dict[tuple[str, bool], tuple[int, ...]] = {}
        self._decoded: dict[tuple[tuple[int, ...], bool], str] = {}
        self._token_ids: dict[str, Any] = {}

    def encode(self, text: str, *args: Any, add_special_tokens: bool = False,
               **kwargs: Any) -> list[int]:
        if args or kwargs:
            return list(self._hf.encode(text, *args, add_special_tokens=add_special_tokens,
                                        **kwargs))
        if len(text) > _MEMO_TEXT:
            return self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        # Renderers encode the same template pieces ("\n", "user", the assistant header)
        # several times per call; tokenization is deterministic, so remember them.
        key = (text, add_special_tokens)
        ids = self._encoded.get(key)
        if ids is None:
            ids = tuple(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)
            _remember(self._encoded, key, ids)
        return list(ids)

    def decode(self, token_ids: Any, *args: Any, skip_special_tokens: bool = False,
               **kwargs: Any) -> str:
        if args or kwargs or self._clean_up:
            return str(self._hf.decode(token_ids, *args,
                                       skip_special_tokens=skip_special_tokens, **kwargs))
        ids = tuple(token_ids)
        if len(ids) > _MEMO_IDS:
            return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        # Short decodes (a marker token, an assistant header) repeat on every call.
        key = (ids, skip_special_tokens)
        text = self._decoded.get(key)
        if text is None:
            text = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
            _remember(self._decoded, key, text)
        return text

    def convert_tokens_to_ids(self, tokens: Any) -> Any:
        if not isinstance(tokens, str):
            return self._hf.convert_tokens_to_ids(tokens)
        # Renderers look up their marker tokens ("<think>", ...) on every call.
        found = self._token_ids.get(tokens, _MISSING)
        if found is _MISSING:
            found = self._hf.convert_tokens_to_ids(tokens)
            _remember(self._token_ids, tokens, found)
        return found

    def __len__(self) -> int:
        return len(self._hf)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # above all not __call__: see the class docstring
            raise AttributeError(name)
        return getattr(self._hf, name)


_bundles: dict[tuple[str, str, str | None], ModelBundle] = {}
_bundles_lock = threading.Lock()


def load_model_bundle(model: str = TINY_MODEL, renderer: str = "auto",
                      thinking_retention: str | None = None) -> ModelBundle:
    """Load (once per process) the tokenizer and renderer for `model`.

    `model` is "tiny" (the built-in untrained Qwen3, built offline on first use), "tiny-vl"
    (its multimodal Qwen3-VL sibling), a local model folder, or a Hugging Face name available offline. `renderer` is "auto", a
    `renderers` config name ("qwen3", "qwen3.5", "llama-3", ...), or
    "default:TOOL_PARSER[:REASONING_PARSER]" (the model's Jinja template with parsers by
    name, e.g. "default:hermes:think"). `thinking_retention`
    ("tool_cycle" / "all") overrides how the renderer bridges across user turns.
    """
    key = (model, renderer, thinking_retention)
    with _bundles_lock:
        bundle = _bundles.get(key)
        if bundle is None:
            bundle = _load(model, renderer, thinking_retention)
            _bundles[key] = bundle
        return bundle


def _load(model: str, renderer: str, thinking_retention: str | None) -> ModelBundle:
    from transformers import AutoTokenizer

    if model in (TINY_MODEL, TINY_VL_MODEL):
        from openforge.tinymodel import ensure_tiny_model, ensure_tiny_vl_model

        path = ensure_tiny_model() if model == TINY_MODEL else ensure_tiny_vl_model()
        source = str(path)
    else:
        path = Path(model).expanduser()
        source = str(path) if path.exists() else model
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # transformers raises OSError / ValueError / HF errors
        raise OpenforgeError(
            f"cannot load the tokenizer of model {model!r} ({type(exc).__name__}); give "
            "'tiny', 'tiny-vl', a local model folder, or a Hugging Face name cached on this "
            "machine"
        ) from None
    config = _renderer_config(model, path, renderer, thinking_retention)
    fast = FastTokenizer(tokenizer) if getattr(tokenizer, "backend_tokenizer", None) else tokenizer
    try:
        from renderers import create_renderer

        rend = create_renderer(fast, config)
    except Exception as exc:
        raise OpenforgeError(
            f"cannot build renderer {renderer!r} for model {model!r}: {exc}".splitlines()[0]
        ) from None
    name = getattr(getattr(rend, "config", None), "name", None) or type(rend).__name__
    from renderers import is_multimodal

    multimodal = is_multimodal(rend)
    if multimodal:
        rend = _with_image_processor(rend, fast, source)
    return ModelBundle(name=model, path=path, tokenizer=fast, renderer=rend,
                       stop_token_ids=list(rend.get_stop_token_ids()), renderer_name=str(name),
                       multimodal=multimodal)


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


# ----------------------------------------------------------------------------------------
# Session token cache
# ----------------------------------------------------------------------------------------


class RenderedPrompt(BaseModel):
    """The prompt ids for one call, and which branch of the session they belong to.

    `bridged` is True when the ids of an earlier call were reused verbatim. `commit` may
    move the call to a new branch (reason "concurrent") when another call extended the same
    branch first: record the call after committing it.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    prompt_ids: list[int]
    branch: int
    branch_reason: str | None = None
    bridged: bool = False

    _parent_version: int = PrivateAttr(default=-1)
    _message_keys: tuple[int, ...] | None = PrivateAttr(default=None)
    _tools_key: int = PrivateAttr(default=0)
    _system_key: int | None = PrivateAttr(default=None)
    # (branch prompt, branch completion, prompt_ids) when prompt_ids was verified to start
    # with that prompt + completion: commit then copies arrays instead of converting ids.
    _extends: tuple[array, array, list[int]] | None = PrivateAttr(default=None)

    @classmethod
    def _of(cls, ids: list[int], branch: int, reason: str | None = None, *,
            bridged: bool = False, parent_version: int = -1) -> RenderedPrompt:
        # Ids come from the tokenizer, already ints: skip validating tens of thousands of
        # them on every call.
        out = cls.model_construct(prompt_ids=ids, branch=branch, branch_reason=reason,
                                  bridged=bridged)
        out._parent_version = parent_version
        return out


@dataclass
class _Branch:
    """One line of token-exact context: the last committed call's prompt + completion."""

    index: int
    reason: str | None
    tools_key: int
    system_key: int | None
    # Fingerprints of the canonical messages behind prompt+completion; None for raw prompts.
    message_keys: array | None = None  # array('q'): 8 bytes per message
    prompt: array = field(default_factory=lambda: array("i"))
    completion: array = field(default_factory=lambda: array("i"))
    has_tools: bool = False
    committed: bool = False
    version: int = 0
    pending_key: int | None = None  # what opened it, while nothing is committed yet
    last_prompt_role: str | None = None  # role of the last prompt message of the last call


def _message_key(m: Message) -> int:
    """Fingerprint of what a message means to the template.

    Ignores reasoning (harnesses drop or rewrite it) and the ids of the assistant's tool
    calls (harnesses may rewrite them); arguments compare as parsed objects, content
    stripped of surrounding whitespace.
    """
    calls = tuple((c.name, _canonical_arguments(c.arguments)) for c in m.tool_calls)
    images = tuple(i.sha256 or i.url for i in m.images)
    return hash((m.role, m.content.strip(), images, calls, m.tool_call_id))


@functools.lru_cache(maxsize=65536)
def _canonical_arguments(text: str) -> str:
    """Tool-call arguments as sorted JSON, so reformatted JSON compares equal.

    Cached: every request of a session replays the same argument strings, and parsing
    them again each turn would dominate the cost of fingerprinting a long history.
    """
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return text
    return json.dumps(value if isinstance(value, dict) else {}, sort_keys=True)


def _tools_key(tools: list[Tool]) -> int:
    return hash(tuple((t.name, t.description, json.dumps(t.parameters, sort_keys=True))
                      for t in tools))


def ids_array(ids: list[int]) -> array:
    """`array("i", ids)` in half the time (struct converts the ints in one C loop)."""
    out = array("i")
    try:
        out.frombytes(struct.pack(f"{len(ids)}i", *ids))
    except struct.error:
        return array("i", ids)  # raises what array raises (e.g. an id beyond int32)
    return out


def _prompt_array(rendered: RenderedPrompt) -> array:
    """The prompt ids as an array; a bridged prompt reuses its branch's arrays."""
    extends = rendered._extends
    if extends is None or extends[2] is not rendered.prompt_ids:
        return ids_array(rendered.prompt_ids)
    prompt, completion, ids = extends
    out = prompt + completion
    out.extend(ids_array(ids[len(out):]))
    return out


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class SessionTokens:
    """The per-session token cache: branches of exact ids, extended turn by turn.

    Call `render` before generating, `parse` on the engine's completion ids, and `commit`
    once the response was delivered. Not thread-safe: use it from one event loop.
    """

    def __init__(self, bundle: ModelBundle) -> None:
        self.bundle = bundle
        self.branches: list[_Branch] = []
        # Fingerprint of (tools, prompt messages) of every committed call -> its branch.
        self._prompts_seen: dict[int, int] = {}
        # The last rendered messages and tools with their fingerprints: a request whose
        # history prefix reuses those very objects (the session's HistoryMemo) reuses them.
        self._last_messages: list[Message] = []
        self._last_keys: tuple[int, ...] = ()
        self._last_tools: list[Tool] = []
        self._last_tools_key = _tools_key([])

    def _fingerprints(self, messages: list[Message]) -> tuple[int, ...]:
        """`_message_key` of each message; parsed messages are never mutated, so one that
        is the very object seen in the last render keeps its fingerprint."""
        last = self._last_messages
        n = 0
        for new, old in zip(messages, last, strict=False):
            if new is not old:
                break
            n += 1
        keys = self._last_keys[:n] + tuple(_message_key(m) for m in messages[n:])
        self._last_messages, self._last_keys = list(messages), keys
        return keys

    def _tools_fingerprint(self, tools: list[Tool]) -> int:
        """`_tools_key(tools)`, reused when these are the very Tool objects of the last render."""
        last = self._last_tools
        if len(tools) != len(last) or any(a is not b for a, b in zip(tools, last, strict=True)):
            self._last_tools, self._last_tools_key = list(tools), _tools_key(tools)
        return self._last_tools_key

    # -- render ---------------------------------------------------------------------------

    def render(self, request: ChatRequest) -> RenderedPrompt:
        """The prompt ids for `request`, extending a branch's exact ids when it can."""
        if request.raw_prompt is not None or request.raw_prompt_ids is not None:
            return self._render_raw(request)
        if not request.messages:
            raise ValueError("the request has no messages")
        if any(m.images for m in request.messages):
            if not self.bundle.multimodal:
                raise ValueError(f"model {self.bundle.name!r} ({self.bundle.renderer_name}) "
                                 "takes text only; remove the images from the request")
            # The renderer would open a URL itself (files, the network): only bytes that
            # `images.resolve_images` checked and hashed may reach it.
            if any(i.data is None for m in request.messages for i in m.images):
                raise ValueError("the request's images were not resolved before rendering")
        keys = self._fingerprints(request.messages)
        tools_key = self._tools_fingerprint(request.tools)
        first = request.messages[0]
        system_key = _message_key(first) if first.role == "system" else None

        out = self._try_extend(request, keys, tools_key)
        if out is None:
            out = self._open(request, keys, tools_key, system_key)
        out._message_keys = keys
        out._tools_key = tools_key
        out._system_key = system_key
        return out

    def _try_extend(self, request: ChatRequest, keys: tuple[int, ...],
                    tools_key: int) -> RenderedPrompt | None:
        best: _Branch | None = None
        for b in self.branches:
            bk = b.message_keys
            if (b.committed and bk is not None and b.tools_key == tools_key
                    and len(keys) > len(bk) and array("q", keys[:len(bk)]) == bk
                    and (best is None or len(bk) > len(best.message_keys or ()))):
                best = b
        if best is None:
            return None
        n_old = len(best.message_keys or ())
        suffix = request.messages[n_old:]
        if any(m.role == "assistant" for m in suffix):
            return None
        prev_prompt, prev_completion = best.prompt.tolist(), best.completion.tolist()
        tools = [t.to_renderer() for t in request.tools] or None
        try:
            bridged = self.bundle.renderer.bridge_to_next_turn(
                prev_prompt, prev_completion, [m.to_renderer() for m in suffix], tools=tools)
        except Exception:  # a renderer that cannot bridge this shape: the full render decides
            bridged = None
        previous = prev_prompt + prev_completion
        if bridged is not None:
            ids = list(bridged.token_ids)
        else:
            ids = self._full_render(request)
        # The bridge may synthesise a turn close after a truncated completion; everything
        # the engine saw and produced must still be there, verbatim.
        if ids[:len(previous)] != previous:
            if bridged is not None:
                ids = self._full_render(request)
            if ids[:len(previous)] != previous:
                return self._new_branch(ids, BRANCH_TEMPLATE_REWRITE, request,
                                        keys=keys, tools_key=tools_key)
        out = RenderedPrompt._of(ids, best.index, bridged=True, parent_version=best.version)
        out._extends = (best.prompt, best.completion, ids)
        return out

    def _open(self, request: ChatRequest, keys: tuple[int, ...], tools_key: int,
              system_key: int | None) -> RenderedPrompt:
        if not self.branches:
            return self._new_branch(self._full_render(request), None, request,
                                    keys=keys, tools_key=tools_key)
        prompt_key = hash((tools_key, keys))
        reason = self._classify(request, keys, tools_key, system_key, prompt_key)
        ids: list[int] | None = None
        if reason == BRANCH_RETRY:
            source = self.branches[self._prompts_seen[prompt_key]]
            sk = source.message_keys
            if sk is not None and len(sk) == len(keys) + 1 and sk[:len(keys)] == array("q", keys):
                ids = source.prompt.tolist()  # the very ids the engine saw the first time
        if ids is None:
            ids = self._full_render(request)
        return self._new_branch(ids, reason, request, keys=keys, tools_key=tools_key)

    def _classify(self, request: ChatRequest, keys: tuple[int, ...], tools_key: int,
                  system_key: int | None, prompt_key: int) -> str:
        if prompt_key in self._prompts_seen:
            return BRANCH_RETRY
        main = self._main_branch()
        if main is not None:
            if not request.tools and main.has_tools:
                return BRANCH_SIDE_CALL
            # A first call with tools after tool-less ones (a title call came first) is
            # the main conversation starting, not a side call.
            if system_key != main.system_key and not (request.tools and not main.has_tools):
                return BRANCH_SIDE_CALL
        # Sharing the system prompt alone is not a shared history: require the first
        # non-system message too.
        first_turn = 1 if system_key is not None else 0
        if self._drops_transient_note(keys, first_turn):
            return BRANCH_TRANSIENT_CONTEXT
        for b in self.branches:
            bk = b.message_keys
            if bk is not None and _common_prefix(keys, bk) > first_turn:
                return BRANCH_HISTORY_REWRITTEN
        return BRANCH_NEW_CONVERSATION

    def _drops_transient_note(self, keys: tuple[int, ...], first_turn: int) -> bool:
        """Whether `keys` extend a branch's messages minus the user message that ended
        that branch's last prompt (see BRANCH_TRANSIENT_CONTEXT)."""
        for b in self.branches:
            bk = b.message_keys
            if bk is None or b.last_prompt_role != "user" or len(bk) < first_turn + 3:
                continue
            kept = bk[:-2] + bk[-1:]  # prompt minus its last message, then the reply
            if len(keys) > len(kept) and array("q", keys[:len(kept)]) == kept:
                return True
        return False

    def _main_branch(self) -> _Branch | None:
        """The first branch with tools, else the first branch: the harness's main loop."""
        opened = [b for b in self.branches if b.message_keys is not None]
        for b in opened:
            if b.has_tools:
                return b
        return opened[0] if opened else None

    def _new_branch(self, ids: list[int], reason: str | None, request: ChatRequest, *,
                    keys: tuple[int, ...] | None, tools_key: int) -> RenderedPrompt:
        # A request identical to one that opened a branch but never committed (the
        # engine failed, the client left) reuses that branch instead of opening another.
        pending_key = hash((tools_key, keys, tuple(ids) if keys is None else None))
        for b in self.branches:
            if not b.committed and b.pending_key == pending_key:
                return RenderedPrompt._of(ids, b.index, b.reason)
        first = request.messages[0] if request.messages else None
        b = _Branch(index=len(self.branches), reason=reason, tools_key=tools_key,
                    system_key=_message_key(first) if first and first.role == "system" else None,
                    message_keys=None if keys is None else array("q", keys),
                    has_tools=bool(request.tools), pending_key=pending_key)
        self.branches.append(b)
        return RenderedPrompt._of(ids, b.index, reason, parent_version=b.version)

    def _full_render(self, request: ChatRequest) -> list[int]:
        tools = [t.to_renderer() for t in request.tools] or None
        try:
            return list(self.bundle.renderer.render_ids(
                [m.to_renderer() for m in request.messages], tools=tools,
                add_generation_prompt=True))
        except Exception as exc:
            # Renderers assert on shapes their template cannot express; that is the
            # request's problem (the gateway answers 400), not a server fault.
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ValueError(f"cannot render this conversation with the "
                             f"{self.bundle.renderer_name} template: {detail}") from None

    def _render_raw(self, request: ChatRequest) -> RenderedPrompt:
        """Legacy completions: the prompt is text or ids, no template; branches by ids."""
        if request.raw_prompt_ids is not None:
            ids = list(request.raw_prompt_ids)
        else:
            ids = self.bundle.encode(request.raw_prompt or "")
        best: _Branch | None = None
        shares = False
        for b in self.branches:
            if not b.committed or b.message_keys is not None:
                continue
            n = len(b.prompt) + len(b.completion)
            head = array("i", ids[:n])
            if len(ids) > n and head == b.prompt + b.completion:
                if best is None or n > len(best.prompt) + len(best.completion):
                    best = b
            elif head[:len(b.prompt)] == b.prompt or (ids and b.prompt and ids[0] == b.prompt[0]):
                shares = True
        if best is not None:
            return RenderedPrompt._of(ids, best.index, bridged=True,
                                      parent_version=best.version)
        if not self.branches:
            reason = None
        elif hash((0, None, tuple(ids))) in self._prompts_seen:
            reason = BRANCH_RETRY
        else:
            reason = BRANCH_HISTORY_REWRITTEN if shares else BRANCH_NEW_CONVERSATION
        return self._new_branch(ids, reason, request, keys=None, tools_key=0)

    # -- parse ----------------------------------------------------------------------------

    def parse(self, request: ChatRequest, prompt_ids: list[int],
              completion_ids: list[int]) -> tuple[Message, FinishReason]:
        """The assistant message in `completion_ids` (stop tokens stripped) and why it ended."""
        return parse_completion(self.bundle, request, prompt_ids, completion_ids)

    # -- commit ---------------------------------------------------------------------------

    def commit(self, request: ChatRequest, rendered: RenderedPrompt,
               completion_ids: list[int], assistant: Message) -> array:
        """Record that `rendered` + `completion_ids` was delivered: extend its branch.

        Call only after the response reached the client, so an aborted call leaves the
        session exactly as it was. Returns the prompt ids as kept (an int32 array).
        """
        b = self.branches[rendered.branch]
        if b.committed and b.version != rendered._parent_version:
            # Another call on this branch committed since we rendered: fork, do not clobber.
            b = _Branch(index=len(self.branches), reason=BRANCH_CONCURRENT,
                        tools_key=b.tools_key, system_key=b.system_key, has_tools=b.has_tools)
            self.branches.append(b)
            rendered.branch, rendered.branch_reason = b.index, BRANCH_CONCURRENT
        b.prompt = _prompt_array(rendered)
        b.completion = ids_array(completion_ids)
        keys = rendered._message_keys
        if keys is not None:
            b.message_keys = array("q", keys)
            b.message_keys.append(_message_key(assistant))
            b.last_prompt_role = request.messages[-1].role if request.messages else None
            self._prompts_seen[hash((rendered._tools_key, keys))] = b.index
        else:
            b.message_keys = None
            self._prompts_seen[hash((0, None, tuple(rendered.prompt_ids)))] = b.index
        b.committed = True
        b.pending_key = None
        b.version += 1
        return b.prompt

    # -- accounting -----------------------------------------------------------------------

    def nbytes(self) -> int:
        """Bytes held by cached token ids (4 per id) and message fingerprints (8 each)."""
        total = 0
        for b in self.branches:
            total += b.prompt.itemsize * (len(b.prompt) + len(b.completion))
            if b.message_keys is not None:
                total += b.message_keys.itemsize * len(b.message_keys)
        return total

    def num_tokens(self) -> int:
        return sum(len(b.prompt) + len(b.completion) for b in self.branches)


# ----------------------------------------------------------------------------------------
# Parsing and assistant-turn tokens
# ----------------------------------------------------------------------------------------


# Built once: json.dumps with options builds a new encoder per call. Same output as
# json.dumps(value, ensure_ascii=False).
_encode_arguments = json.JSONEncoder(ensure_ascii=False).encode


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_completion(bundle: ModelBundle, request: ChatRequest, prompt_ids: list[int],
                     completion_ids: list[int]) -> tuple[Message, FinishReason]:
    """Completion ids -> assistant Message (content, reasoning, tool calls) + finish reason.

    Only tool calls that parsed cleanly are returned; malformed attempts stay in the
    content's token record but are not offered to the harness as calls. The finish
    reason is "tool_calls" or "stop": the engine knows when max_tokens cut it short.
    """
    if request.raw_prompt is not None or request.raw_prompt_ids is not None:
        stops = set(bundle.stop_token_ids)
        ids = list(completion_ids)
        while ids and ids[-1] in stops:
            ids.pop()
        return Message(role="assistant", content=bundle.decode(ids)), "stop"
    from renderers import ToolCallParseStatus

    tools = [t.to_renderer() for t in request.tools] or None
    try:
        parsed = bundle.renderer.parse_response(list(completion_ids), tools=tools,
                                                prompt_ids=list(prompt_ids))
    except Exception:
        # Whatever a policy samples must still reach the client: as plain text.
        stops = set(bundle.stop_token_ids)
        ids = [t for t in completion_ids if t not in stops]
        return Message(role="assistant", content=bundle.decode(ids)), "stop"
    calls: list[ToolCall] = []
    for c in parsed.tool_calls:
        if c.status != ToolCallParseStatus.OK or not c.name:
            continue
        args = c.arguments if c.arguments is not None else {}
        text = args if isinstance(args, str) else _encode_arguments(args)
        calls.append(ToolCall(id=new_tool_call_id(), name=c.name, arguments=text))
    message = Message(role="assistant", content=parsed.content or "",
                      reasoning=parsed.reasoning_content or None, tool_calls=calls)
    return message, ("tool_calls" if calls else "stop")


def assistant_turn_ids(bundle: ModelBundle, messages: list[Message], assistant: Message,
                       tools: list[Tool] | None = None) -> list[int]:
    """The ids the model would generate for `assistant` after `messages`.

    Exactly the assistant turn as the chat template writes it, after the generation
    prompt, up to and including its stop token (e.g. `<|im_end|>`). Used by the scripted
    engine and the template check.
    """
    rend = bundle.renderer
    tool_specs = [t.to_renderer() for t in tools or []] or None
    stops = set(bundle.stop_token_ids)
    context = [m.to_renderer() for m in messages] or [{"role": "user", "content": "."}]
    for ctx in (context, [{"role": "user", "content": "."}]):
        prompt = rend.render_ids(ctx, tools=tool_specs, add_generation_prompt=True)
        full = rend.render_ids([*ctx, assistant.to_renderer()], tools=tool_specs)
        if full[:len(prompt)] != prompt:
            continue  # this template rewrites the context once an answer follows
        turn = full[len(prompt):]
        for i, t in enumerate(turn):
            if t in stops:
                return list(turn[:i + 1])
        return list(turn) + [bundle.stop_token_ids[0]]
    raise ValueError(f"renderer {bundle.renderer_name} cannot isolate an assistant turn")


# ----------------------------------------------------------------------------------------
# Template check (openforge check-template)
# ----------------------------------------------------------------------------------------


def check_template(model: str, renderer: str = "auto") -> bool:
    """Print whether `model`'s template is append-only across turns; True when it is.

    For a few built-in conversations (tool calls, reasoning, several user turns), each
    assistant turn is tokenized as the model would generate it; the next prompt is built
    both by bridging (the gateway's way) and by a full re-render, and compared. False
    when some turn could not extend the previous ids (the gateway would open a branch).
    """
    bundle = load_model_bundle(model, renderer)
    rend = bundle.renderer
    print(f"model: {model}  renderer: {type(rend).__name__} ({bundle.renderer_name})")
    print(f"is_prefix_stable: {rend.is_prefix_stable}")
    all_ok = True
    for title, tools, messages in _CHECK_CONVERSATIONS:
        lines, ok = _check_conversation(bundle, tools, messages)
        all_ok &= ok
        print(f"{'ok ' if ok else 'BAD'} {title}")
        for line in lines:
            print(f"      {line}")
    print("append-only: yes" if all_ok else
          "append-only: NO (the gateway opens a new branch where marked BAD)")
    return all_ok


def _check_conversation(bundle: ModelBundle, tools: list[Tool],
                        messages: list[Message]) -> tuple[list[str], bool]:
    rend = bundle.renderer
    specs = [t.to_renderer() for t in tools] or None
    lines: list[str] = []
    ok = True
    prompt: list[int] | None = None
    completion: list[int] = []
    i = 0
    while i < len(messages):
        if messages[i].role != "assistant":
            i += 1
            continue
        # messages[:i] is the context of this assistant turn; the previous turn's ids
        # must extend into this turn's prompt.
        full = list(rend.render_ids([m.to_renderer() for m in messages[:i]], tools=specs,
                                    add_generation_prompt=True))
        if prompt is not None:
            start = _last_assistant(messages[:i]) + 1
            new = [m.to_renderer() for m in messages[start:i]]
            bridged = rend.bridge_to_next_turn(prompt, completion, new, tools=specs)
            previous = prompt + completion
            turn = f"turn {i}"
            if bridged is None:
                if full[:len(previous)] == previous:
                    lines.append(f"{turn}: bridge declined; full re-render extends exactly")
                else:
                    ok = False
                    at = _first_difference(full, previous)
                    lines.append(f"{turn}: bridge declined and the re-render rewrites token "
                                 f"{at}: {_context(bundle, previous, full, at)}")
                prompt = full
            else:
                ids = list(bridged.token_ids)
                if ids == full:
                    lines.append(f"{turn}: bridge == full re-render ({len(ids)} tokens)")
                else:
                    at = _first_difference(ids, full)
                    lines.append(f"{turn}: bridge extends exactly; full re-render differs at "
                                 f"token {at}: {_context(bundle, ids, full, at)}")
                prompt = ids
        else:
            prompt = full
        completion = assistant_turn_ids(bundle, messages[:i], messages[i], tools)
        i += 1
    return lines, ok


def _last_assistant(messages: list[Message]) -> int:
    for j in range(len(messages) - 1, -1, -1):
        if messages[j].role == "assistant":
            return j
    return -1


def _first_difference(a: list[int], b: list[int]) -> int:
    for j, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return j
    return min(len(a), len(b))


def _context(bundle: ModelBundle, a: list[int], b: list[int], at: int) -> str:
    lo = max(0, at - 8)
    return (f"kept {bundle.decode(a[lo:at + 8])!r} vs re-rendered "
            f"{bundle.decode(b[lo:at + 8])!r}")


def _check_set() -> list[tuple[str, list[Tool], list[Message]]]:
    shell = Tool(name="shell", description="Run a shell command.",
                 parameters={"type": "object", "properties": {"cmd": {"type": "string"}},
                             "required": ["cmd"]})

    def call(cid: str, cmd: str) -> ToolCall:
        return ToolCall(id=cid, name="shell", arguments=json.dumps({"cmd": cmd}))

    sys_msg = Message(role="system", content="You are a careful coding agent.")
    tool_loop = [
        sys_msg, Message(role="user", content="How many files are here?"),
        Message(role="assistant", content="", tool_calls=[call("c1", "ls")]),
        Message(role="tool", content="a.txt\nb.txt", tool_call_id="c1"),
        Message(role="assistant", content="", tool_calls=[call("c2", "wc -l a.txt")]),
        Message(role="tool", content="3 a.txt", tool_call_id="c2"),
        Message(role="assistant", content="There are 2 files."),
    ]
    reasoning_tools = [
        sys_msg, Message(role="user", content="Fix the failing test."),
        Message(role="assistant", reasoning="Run the tests first.", content="",
                tool_calls=[call("c1", "pytest -q")]),
        Message(role="tool", content="1 failed", tool_call_id="c1"),
        Message(role="assistant", reasoning="Look at the test.", content="Looking.",
                tool_calls=[call("c2", "cat test_x.py")]),
        Message(role="tool", content="assert add(1, 2) == 3", tool_call_id="c2"),
        Message(role="assistant", reasoning="Done.", content="Fixed."),
    ]
    chat = [
        Message(role="user", content="Hi!"),
        Message(role="assistant", content="Hello! How can I help?"),
        Message(role="user", content="Name a prime."),
        Message(role="assistant", content="7"),
        Message(role="user", content="Another?"),
        Message(role="assistant", content="11"),
    ]
    reasoning_chat = [
        sys_msg, Message(role="user", content="2+2?"),
        Message(role="assistant", reasoning="Simple sum.", content="4"),
        Message(role="user", content="And 3+3?"),
        Message(role="assistant", reasoning="Again simple.", content="6"),
    ]
    return [
        ("tool loop (3 assistant turns, tool results between)", [shell], tool_loop),
        ("tool loop with reasoning", [shell], reasoning_tools),
        ("plain chat, 3 user turns", [], chat),
        ("chat with reasoning, 2 user turns", [], reasoning_chat),
    ]


_CHECK_CONVERSATIONS = _check_set()
