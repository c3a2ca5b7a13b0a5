"""Conversation <-> token ids with the model's chat template (the `renderers` library).

`renderers` owns each model family's chat template in code: `render_ids` for full renders,
`bridge_to_next_turn` to extend a previous prompt and completion by exactly the tokens new
messages add, `parse_response` to read content, reasoning and tool calls back from ids.
This module is the gateway's thin layer over it: the limits a prompt must respect
(`check_prompt_size`, `PromptError`), full renders and bridges with the request's tools,
completion parsing, and the ids of one assistant turn.
"""

from __future__ import annotations

import json
import re
import uuid
from array import array
from collections.abc import Sequence
from typing import Any

from openforge.gateway.conversation import ChatRequest, FinishReason, Message, Tool, ToolCall
from openforge.gateway.model import ModelBundle


class PromptError(ValueError):
    """A request whose prompt the gateway cannot send to the model (a 400 for the client)."""


class ContextLengthError(PromptError):
    """The prompt does not fit the model's context window.

    `prompt_tokens` is the prompt's length, or a lower bound of it when `at_least` (the
    gateway refused before tokenizing all of it).
    """

    def __init__(self, prompt_tokens: int, limit: int, *, at_least: bool = False) -> None:
        self.prompt_tokens = prompt_tokens
        self.limit = limit
        self.at_least = at_least
        size = f"at least {prompt_tokens}" if at_least else str(prompt_tokens)
        super().__init__(f"context length exceeded: the prompt is {size} tokens and the "
                         f"model's context window is {limit} tokens; shorten the conversation")


# Texts longer than this are counted in chunks before rendering, so a prompt far beyond the
# context is refused after tokenizing about one context's worth of it, not all of it.
_COUNT_CHUNK = 64 * 1024
# Where a chunk may end without changing the tokens around the cut: between an ASCII
# letter and a space that starts another word (no pre-tokenizer joins those).
_SAFE_CUT = re.compile(r"[A-Za-z](?= [A-Za-z])")
_CUT_SLACK = 4  # tokens a cut that found no safe place may change


def check_prompt_size(bundle: ModelBundle, request: ChatRequest,
                      body_bytes: int | None = None) -> None:
    """Refuse a prompt that cannot fit the context, before rendering it.

    First a bound from lengths alone (no tokenizing); then texts longer than 64 KiB are
    tokenized a chunk at a time, stopping once they alone exceed the context. Each message
    also gets template tokens around it, so the sum of its texts' tokens (less two per
    message, for merges with that scaffolding) is a lower bound of the prompt's length.
    `body_bytes`, the size of the request body, bounds the characters of all its texts:
    a body too small to hold a 64 KiB text or to exceed the bound needs no look at all.
    """
    limit = bundle.context_length
    if not limit:
        return
    if request.raw_prompt_ids is not None:
        if len(request.raw_prompt_ids) >= limit:
            raise ContextLengthError(len(request.raw_prompt_ids), limit)
        return
    if body_bytes is not None and body_bytes <= _COUNT_CHUNK and (
            bundle.min_tokens(body_bytes) < limit):
        return
    texts = ([request.raw_prompt] if request.raw_prompt is not None
             else [t for m in request.messages for t in _texts(m)])
    bound = bundle.min_tokens(sum(len(t) for t in texts))
    if bound >= limit:
        raise ContextLengthError(bound, limit, at_least=True)
    counted = 0
    for text in texts:
        if len(text) > _COUNT_CHUNK:
            counted += _count_until(bundle, text, limit - counted + 2 * len(texts))
            if counted - 2 * len(texts) >= limit:
                raise ContextLengthError(counted - 2 * len(texts), limit, at_least=True)


def _texts(message: Message) -> list[str]:
    out = [message.content]
    if message.reasoning:
        out.append(message.reasoning)
    out.extend(c.arguments for c in message.tool_calls)
    return out


def _count_until(bundle: ModelBundle, text: str, budget: int) -> int:
    """Tokens of `text` (a lower bound), counted chunk by chunk until over `budget`."""
    total = start = 0
    while start < len(text) and total <= budget:
        end = min(len(text), start + _COUNT_CHUNK)
        if end < len(text):
            cut = _SAFE_CUT.search(text, end, min(len(text), end + 4096))
            if cut is not None:
                end = cut.end()
            else:
                total -= _CUT_SLACK
        total += len(bundle.encode(text[start:end]))
        start = end
    return max(total, 0)


def check_token_ids(bundle: ModelBundle, ids: Sequence[int]) -> None:
    """Every id must be one the model has (legacy completions prompts send raw ids)."""
    limit = bundle.vocab_size
    for i, t in enumerate(ids):
        if not 0 <= t < limit:
            raise PromptError(f"'prompt' token {i} is {t}, not a token of this model: ids "
                              f"must be in [0, {limit})")


def check_special_text(bundle: ModelBundle, request: ChatRequest) -> None:
    """For a renderer that cannot keep special-token text apart from its control tokens,
    refuse content that holds such text rather than record forged control tokens."""
    if bundle.protects_content:
        return
    for message in request.messages:
        for text in _texts(message):
            special = bundle.special_text_in(text)
            if special is not None:
                raise PromptError(
                    f"a {message.role} message contains the text of the control token "
                    f"{special!r}; the {bundle.renderer_name} template would turn it into "
                    "that token. Remove it, or serve the model with a named renderer")


def renderer_tools(tools: list[Tool]) -> list[dict[str, Any]] | None:
    return [t.to_renderer() for t in tools] or None


def render_full(renderer: Any, messages: list[dict[str, Any]], tools: list[Tool],
                renderer_name: str) -> list[int]:
    """The prompt ids of a whole conversation, generation prompt included (PromptError)."""
    try:
        return list(renderer.render_ids(messages, tools=renderer_tools(tools),
                                        add_generation_prompt=True))
    except Exception as exc:
        # Renderers assert on shapes their template cannot express; that is the
        # request's problem (the gateway answers 400), not a server fault.
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PromptError(f"cannot render this conversation with the {renderer_name} "
                          f"template: {detail}") from None


# Renderers whose `bridge_to_next_turn` reads the previous prompt only from its last
# turn-closing token on (to see whether the generation prompt opened a reasoning block):
# they are handed that tail, so a bridge costs what the call adds, not the conversation's
# length. Exact classes, by module and name: a subclass or another family may read more
# (Qwen3-VL counts the images of the whole prompt). `tests/test_render.py` checks each
# against bridging the whole prompt.
_BRIDGES_FROM_LAST_TURN = frozenset({("renderers.qwen3", "Qwen3Renderer")})


def bridge(renderer: Any, prompt: Sequence[int], completion: Sequence[int],
           messages: list[dict[str, Any]], tools: list[Tool]) -> list[int] | None:
    """The ids that extend `prompt + completion` by `messages` and a generation prompt, or
    None when the renderer declines (or cannot) bridge this shape, or its result does not
    start with `prompt + completion` verbatim (everything the engine saw and produced must
    be there; a bridge may add a turn close after a truncated completion).

    Only the added ids are returned: the caller appends them to the ids it holds, so a
    long conversation is never copied into a list of Python ints per call."""
    cut = 0
    kind = type(renderer)
    if (kind.__module__, kind.__qualname__) in _BRIDGES_FROM_LAST_TURN:
        cut = last_turn_start(prompt, renderer.get_stop_token_ids())
    tail, done = _ids_list(prompt[cut:]), _ids_list(completion)
    try:
        bridged = renderer.bridge_to_next_turn(tail, done, messages,
                                               tools=renderer_tools(tools))
    except Exception:  # a renderer that cannot bridge this shape: the caller re-renders
        return None
    if bridged is None:
        return None
    ids = list(bridged.token_ids)
    start = len(tail) + len(done)
    if ids[:len(tail)] != tail or ids[len(tail):start] != done:
        return None
    return ids[start:]


def _ids_list(ids: Sequence[int]) -> list[int]:
    return ids.tolist() if isinstance(ids, array) else list(ids)


def last_turn_start(ids: Sequence[int], stops: Sequence[int]) -> int:
    """The position of the last turn-ending token in `ids` (0 if there is none): where the
    part a renderer reads to bridge or parse after it begins."""
    stop = set(stops)
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] in stop:
            return i
    return 0


# Built once: json.dumps with options builds a new encoder per call. Same output as
# json.dumps(value, ensure_ascii=False).
_encode_arguments = json.JSONEncoder(ensure_ascii=False).encode


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_completion(bundle: ModelBundle, request: ChatRequest, prompt_ids: Sequence[int],
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

    try:
        parsed = bundle.renderer.parse_response(list(completion_ids),
                                                tools=renderer_tools(request.tools),
                                                prompt_ids=_last_turn(bundle, prompt_ids))
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


def _last_turn(bundle: ModelBundle, prompt_ids: Sequence[int]) -> list[int]:
    """The prompt from its last turn-ending token on: all a renderer reads of the prompt to
    parse a completion (whether the generation prompt opened a reasoning block), without
    copying a long prompt on every call."""
    return list(prompt_ids[last_turn_start(prompt_ids, bundle.stop_token_ids):])


def assistant_turn_ids(bundle: ModelBundle, messages: list[Message], assistant: Message,
                       tools: list[Tool] | None = None) -> list[int]:
    """The ids the model would generate for `assistant` after `messages`.

    Exactly the assistant turn as the chat template writes it, after the generation
    prompt, up to and including its stop token (e.g. `<|im_end|>`). Used by the scripted
    engine and the template check.
    """
    rend = bundle.renderer
    tool_specs = renderer_tools(tools or [])
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
