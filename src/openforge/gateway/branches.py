"""A session's branches of exact token ids, extended call by call (`SessionTokens`).

A *branch* is one line of token-exact context: the prompt and completion of its last
committed call, plus a fingerprint of the canonical messages and tools they came from. A
request whose messages extend a branch reuses those ids verbatim and tokenizes only the
messages it adds, so a trainer sees exactly the tokens the policy saw. A request that does
not extend any branch (a retry, a title call, a rewritten history, a new conversation)
opens a new branch with a reason instead of corrupting an old one.

Render policies, for a request that extends a branch:

- `exact` follows the chat template: the new messages are bridged onto the branch's ids
  where the template allows it; where the template re-renders earlier turns differently
  (Qwen3 drops past reasoning at a new user query), the prompt is the full re-render and,
  as the branch's ids are no longer its prefix, a new branch (`template_rewrite`).
- `append` keeps every sampled id and appends the new messages' template segments, as
  veRL's agent loop does: a rollout stays one sample even where the template would
  re-render earlier turns. The prompt then differs from what a fresh template render of
  the same messages gives (Qwen3: earlier reasoning stays in context).

Either way the per-session `SessionTexts` cache means a full render (first call, a new
branch, a template rewrite) tokenizes only texts this session has not tokenized before.
"""

from __future__ import annotations

import contextlib
import functools
import json
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from openforge.gateway.conversation import ChatRequest, FinishReason, Message, Tool
from openforge.gateway.model import FastTokenizer, ModelBundle, SessionTexts
from openforge.gateway.render import (
    ContextLengthError,
    PromptError,
    bridge,
    check_prompt_size,
    check_special_text,
    check_token_ids,
    parse_completion,
    render_full,
    renderer_tools,
)

RenderPolicy = Literal["exact", "append"]
RENDER_POLICIES: tuple[str, ...] = ("exact", "append")

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


class Extension(NamedTuple):
    """The branch a prompt extends, as it was at render time: the prompt starts with exactly
    `prompt` + `completion`, whose JSON text (without its closing bracket) is `json` ("" if
    unknown), and which the call `call_id` committed (None when no call id was given)."""

    prompt: array
    completion: array
    json: str
    call_id: str | None


class RenderedPrompt:
    """The prompt ids for one call, and which branch of the session they belong to.

    `prompt` is the ids as an int32 array that this prompt owns: a commit keeps it as its
    branch's prompt, and a bridged prompt is its branch's ids with the new ones appended
    (a copy of 4 bytes per id, not a list of Python ints per call). `bridged` is True when
    the ids of an earlier call were reused verbatim. The branch a call is recorded on is
    the one `SessionTokens.commit` returns: it differs from `branch` when another call
    extended the same branch first.
    """

    __slots__ = ("prompt", "branch", "branch_reason", "bridged", "parent_version",
                 "message_keys", "tools_key", "extends", "_json")

    def __init__(self, prompt: Sequence[int], branch: int, branch_reason: str | None = None,
                 *, bridged: bool = False, parent_version: int = -1) -> None:
        self.prompt = prompt if isinstance(prompt, array) else ids_array(prompt)
        self.branch = branch
        self.branch_reason = branch_reason
        self.bridged = bridged
        self.parent_version = parent_version
        self.message_keys: tuple[int, ...] | None = None
        self.tools_key = 0
        # Set when the prompt extends a branch: the JSON text of the ids is extended, not
        # rebuilt, and the store keeps only the new ids.
        self.extends: Extension | None = None
        self._json: str | None = None

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt ids as a list (a copy: the gateway's own path reads `prompt`)."""
        return self.prompt.tolist()

    def stored_as(self, prompt: array) -> tuple[str | None, array]:
        """How the store keeps `prompt` (this call's ids as committed): the call it extends
        and the ids after that call's prompt + completion, or (None, all of them)."""
        extends = self.extends
        if extends is None or extends.call_id is None:
            return None, prompt
        return extends.call_id, prompt[len(extends.prompt) + len(extends.completion):]

    def prompt_json(self) -> str:
        """The prompt ids as a compact JSON array, built from the branch's text when it
        extends one (the new ids only are converted)."""
        if self._json is None:
            if self.extends is not None and self.extends.json:
                prompt, completion, text, _ = self.extends
                new = self.prompt[len(prompt) + len(completion):]
                self._json = f"{text},{','.join(map(str, new))}]" if new else text + "]"
            else:
                self._json = _encode_ids(self.prompt.tolist())
        return self._json


@dataclass
class Branch:
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
    # prompt + completion as JSON text without the closing bracket ("[1,2,3"); "" if unknown.
    json: str = ""
    call_id: str | None = None  # the call that committed prompt + completion, if named

    def extension(self) -> Extension:
        return Extension(self.prompt, self.completion, self.json, self.call_id)


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


_encode_ids = json.JSONEncoder(separators=(",", ":")).encode


def ids_array(ids: Sequence[int]) -> array:
    """`array("i", ids)` in half the time (struct converts the ints in one C loop)."""
    out = array("i")
    try:
        out.frombytes(struct.pack(f"{len(ids)}i", *ids))
    except struct.error:
        return array("i", ids)  # raises what array raises (e.g. an id beyond int32)
    return out


def _same_objects(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading items of `a` are the very objects of `b`."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x is not y:
            break
        n += 1
    return n


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
    once the response was delivered. Not thread-safe: one call of a session at a time
    (the gateway holds the session's lock around `render` and `commit`).
    """

    def __init__(self, bundle: ModelBundle, policy: RenderPolicy = "append") -> None:
        if policy not in RENDER_POLICIES:
            raise ValueError(f"render policy must be one of {', '.join(RENDER_POLICIES)}, "
                             f"not {policy!r}")
        self.bundle = bundle
        self.policy = policy
        self.branches: list[Branch] = []
        # Fingerprint of (tools, prompt messages) of every committed call -> its branch.
        self._prompts_seen: dict[int, int] = {}
        self._texts = SessionTexts()
        # The last rendered messages, their fingerprints and renderer dicts: a request
        # whose history prefix reuses those very objects (the session's HistoryMemo)
        # reuses them too.
        self._last_messages: list[Message] = []
        self._last_keys: tuple[int, ...] = ()
        self._dict_messages: list[Message] = []
        self._last_dicts: list[dict[str, Any]] = []
        self._last_tools: list[Tool] = []
        self._last_tools_key = _tools_key([])

    def _fingerprints(self, messages: list[Message]) -> tuple[int, ...]:
        """`_message_key` of each message; parsed messages are never mutated, so one that
        is the very object seen in the last render keeps its fingerprint."""
        n = _same_objects(messages, self._last_messages)
        keys = self._last_keys[:n] + tuple(_message_key(m) for m in messages[n:])
        self._last_messages, self._last_keys = list(messages), keys
        return keys

    def _renderer_dicts(self, messages: list[Message]) -> list[dict[str, Any]]:
        """`m.to_renderer()` of each message, reused for the very objects of the last call."""
        n = _same_objects(messages, self._dict_messages)
        dicts = self._last_dicts[:n] + [m.to_renderer() for m in messages[n:]]
        self._dict_messages, self._last_dicts = list(messages), dicts
        return dicts

    def _tools_fingerprint(self, tools: list[Tool]) -> int:
        """`_tools_key(tools)`, reused when these are the very Tool objects of the last render."""
        last = self._last_tools
        if len(tools) != len(last) or any(a is not b for a, b in zip(tools, last, strict=True)):
            self._last_tools, self._last_tools_key = list(tools), _tools_key(tools)
        return self._last_tools_key

    # -- render ---------------------------------------------------------------------------

    def render(self, request: ChatRequest, body_bytes: int | None = None) -> RenderedPrompt:
        """The prompt ids for `request`, extending a branch's exact ids when it can.

        Raises `PromptError` (a 400 for the client) for a prompt the model cannot take:
        beyond its context window, ids outside its vocabulary, unrenderable shapes.
        `body_bytes` (the request body's size, when known) spares the size check a look at
        every message of a small request.
        """
        bundle = self.bundle
        check_prompt_size(bundle, request, body_bytes)
        if request.raw_prompt is not None or request.raw_prompt_ids is not None:
            return self._render_raw(request)
        if not request.messages:
            raise PromptError("the request has no messages")
        check_special_text(bundle, request)
        if any(m.images for m in request.messages):
            if not bundle.multimodal:
                raise PromptError(f"model {bundle.name!r} ({bundle.renderer_name}) takes "
                                  "text only; remove the images from the request")
            # The renderer would open a URL itself (files, the network): only bytes that
            # `images.resolve_images` checked and hashed may reach it.
            if any(i.data is None for m in request.messages for i in m.images):
                raise PromptError("the request's images were not resolved before rendering")
        keys = self._fingerprints(request.messages)
        tools_key = self._tools_fingerprint(request.tools)
        first = request.messages[0]
        system_key = _message_key(first) if first.role == "system" else None

        texts = (bundle.tokenizer.session_texts(self._texts)
                 if isinstance(bundle.tokenizer, FastTokenizer) else contextlib.nullcontext())
        with texts:
            out = self._try_extend(request, keys, tools_key)
            if out is None:
                out = self._open(request, keys, tools_key, system_key)
        out.message_keys = keys
        out.tools_key = tools_key
        self._check_length(out.prompt)
        return out

    def _check_length(self, ids: Sequence[int]) -> None:
        limit = self.bundle.context_length
        if limit and len(ids) >= limit:
            raise ContextLengthError(len(ids), limit)

    def _full_render(self, request: ChatRequest) -> list[int]:
        return render_full(self.bundle.renderer, self._renderer_dicts(request.messages),
                           request.tools, self.bundle.renderer_name)

    def _first_render(self, request: ChatRequest) -> list[int]:
        """The session's first prompt: the model's sessions share first renders, as the
        rollouts of one task open alike (`first_renders`)."""
        dicts = self._renderer_dicts(request.messages)
        return self.bundle.first_renders.render(
            dicts, renderer_tools(request.tools),
            lambda: render_full(self.bundle.renderer, dicts, request.tools,
                                self.bundle.renderer_name))

    def _try_extend(self, request: ChatRequest, keys: tuple[int, ...],
                    tools_key: int) -> RenderedPrompt | None:
        best: Branch | None = None
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
        renderer = self.bundle.renderer
        if self.policy == "append" and self.bundle.append_renderer is not None:
            renderer = self.bundle.append_renderer
        dicts = self._renderer_dicts(request.messages)
        added = bridge(renderer, best.prompt, best.completion, dicts[n_old:], request.tools)
        if added is None:
            previous = best.prompt.tolist() + best.completion.tolist()
            ids = self._full_render(request)
            if ids[:len(previous)] != previous:
                return self._new_branch(ids, BRANCH_TEMPLATE_REWRITE, request,
                                        keys=keys, tools_key=tools_key)
            prompt = ids_array(ids)
        else:
            prompt = best.prompt + best.completion
            prompt.fromlist(added)
        out = RenderedPrompt(prompt, best.index, bridged=True, parent_version=best.version)
        out.extends = best.extension()
        return out

    def _open(self, request: ChatRequest, keys: tuple[int, ...], tools_key: int,
              system_key: int | None) -> RenderedPrompt:
        if not self.branches:
            return self._new_branch(self._first_render(request), None, request,
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

    def _main_branch(self) -> Branch | None:
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
                return RenderedPrompt(ids, b.index, b.reason)
        first = request.messages[0] if request.messages else None
        b = Branch(index=len(self.branches), reason=reason, tools_key=tools_key,
                   system_key=_message_key(first) if first and first.role == "system" else None,
                   message_keys=None if keys is None else array("q", keys),
                   has_tools=bool(request.tools), pending_key=pending_key)
        self.branches.append(b)
        return RenderedPrompt(ids, b.index, reason, parent_version=b.version)

    def _render_raw(self, request: ChatRequest) -> RenderedPrompt:
        """Legacy completions: the prompt is text or ids, no template; branches by ids."""
        if request.raw_prompt_ids is not None:
            check_token_ids(self.bundle, request.raw_prompt_ids)
            ids = list(request.raw_prompt_ids)
        else:
            ids = self.bundle.encode_prompt(request.raw_prompt or "")
        self._check_length(ids)
        best: Branch | None = None
        shares = False
        for b in self.branches:
            if not b.committed or b.message_keys is not None:
                continue
            n = len(b.prompt) + len(b.completion)
            head = ids_array(ids[:n])
            if len(ids) > n and head == b.prompt + b.completion:
                if best is None or n > len(best.prompt) + len(best.completion):
                    best = b
            elif head[:len(b.prompt)] == b.prompt or (ids and b.prompt and ids[0] == b.prompt[0]):
                shares = True
        if best is not None:
            out = RenderedPrompt(ids, best.index, bridged=True, parent_version=best.version)
            out.extends = best.extension()
            return out
        if not self.branches:
            reason = None
        elif hash((0, None, tuple(ids))) in self._prompts_seen:
            reason = BRANCH_RETRY
        else:
            reason = BRANCH_HISTORY_REWRITTEN if shares else BRANCH_NEW_CONVERSATION
        return self._new_branch(ids, reason, request, keys=None, tools_key=0)

    # -- parse ----------------------------------------------------------------------------

    def parse(self, request: ChatRequest, prompt_ids: Sequence[int],
              completion_ids: list[int]) -> tuple[Message, FinishReason]:
        """The assistant message in `completion_ids` (stop tokens stripped) and why it ended."""
        return parse_completion(self.bundle, request, prompt_ids, completion_ids)

    # -- commit ---------------------------------------------------------------------------

    def commit(self, request: ChatRequest, rendered: RenderedPrompt,
               completion_ids: Sequence[int], assistant: Message,
               call_id: str | None = None) -> Branch:
        """Record that `rendered` + `completion_ids` was delivered (by the call `call_id`,
        which later prompts of the branch are then stored against): extend its branch.

        Call only after the response reached the client, so an aborted call leaves the
        session exactly as it was. Returns the branch the call belongs to: a new one
        (reason "concurrent") when another call of this branch committed since `rendered`
        was rendered. Its `prompt` holds the call's prompt ids as kept (an int32 array).
        """
        b = self.branches[rendered.branch]
        if b.committed and b.version != rendered.parent_version:
            # Another call on this branch committed since we rendered: fork, do not clobber.
            b = Branch(index=len(self.branches), reason=BRANCH_CONCURRENT,
                       tools_key=b.tools_key, system_key=b.system_key, has_tools=b.has_tools)
            self.branches.append(b)
        prompt_json = rendered.prompt_json()
        b.prompt = rendered.prompt
        b.completion = ids_array(completion_ids)
        b.json = (f"{prompt_json[:-1]},{','.join(map(str, completion_ids))}" if completion_ids
                  else prompt_json[:-1])
        keys = rendered.message_keys
        if keys is not None:
            b.message_keys = array("q", keys)
            b.message_keys.append(_message_key(assistant))
            b.last_prompt_role = request.messages[-1].role if request.messages else None
            self._prompts_seen[hash((rendered.tools_key, keys))] = b.index
        else:
            b.message_keys = None
            self._prompts_seen[hash((0, None, tuple(rendered.prompt)))] = b.index
        b.call_id = call_id
        b.committed = True
        b.pending_key = None
        b.version += 1
        return b

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

