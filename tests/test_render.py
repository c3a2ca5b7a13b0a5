"""Rendering and the per-session token cache, on the real Qwen3 tokenizer of the tiny model."""

# ruff: noqa: F811  (pytest fixtures imported from fixtures_model are re-bound as arguments)

from __future__ import annotations

import json
import subprocess
import sys

from fixtures_model import SHELL_TOOL, chat, shell_call, tiny_bundle  # noqa: F401

from openforge.gateway.branches import (
    BRANCH_CONCURRENT,
    BRANCH_HISTORY_REWRITTEN,
    BRANCH_NEW_CONVERSATION,
    BRANCH_RETRY,
    BRANCH_SIDE_CALL,
    BRANCH_TEMPLATE_REWRITE,
    SessionTokens,
)
from openforge.gateway.conversation import Message, ToolCall
from openforge.gateway.model import ModelBundle, SharedTexts, load_model_bundle
from openforge.gateway.render import assistant_turn_ids

SYSTEM = Message(role="system", content="You are a coding agent.")
USER = Message(role="user", content="Count the lines of every file.")


def _turn(tokens: SessionTokens, bundle: ModelBundle, messages: list[Message],
          reply: Message, tools=(SHELL_TOOL,)):
    """One call: render, 'generate' the reply's exact template tokens, parse, commit."""
    request = chat(messages, list(tools))
    rendered = tokens.render(request)
    completion = assistant_turn_ids(bundle, messages, reply, list(tools))
    assistant, finish = tokens.parse(request, rendered.prompt_ids, completion)
    tokens.commit(request, rendered, completion, assistant)
    return rendered, completion, assistant, finish


def _tool_conversation(tokens, bundle, turns):
    messages = [SYSTEM, USER]
    calls = []
    for i in range(turns):
        reply = Message(role="assistant", reasoning=f"step {i}", content="",
                        tool_calls=[shell_call(f"x{i}", f"wc -l file{i}.txt")])
        rendered, completion, assistant, finish = _turn(tokens, bundle, messages, reply)
        calls.append((rendered, completion))
        assert finish == "tool_calls"
        # The harness echoes the assistant turn (ids of its own choosing, reasoning dropped).
        echoed = assistant.model_copy(update={"reasoning": None, "tool_calls": [
            c.model_copy(update={"id": f"harness_{i}"}) for c in assistant.tool_calls]})
        messages = [*messages, echoed,
                    Message(role="tool", content=f"{i + 3} file{i}.txt", tool_call_id=f"harness_{i}")]
    return messages, calls


def test_hello_world_ids(tiny_bundle):
    assert tiny_bundle.encode("hello world") == [14990, 1879]
    assert tiny_bundle.stop_token_ids[0] == tiny_bundle.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tiny_bundle.renderer_name == "qwen3"
    assert load_model_bundle("tiny") is tiny_bundle  # cached in process


def test_ten_turn_tool_conversation_extends_token_for_token(tiny_bundle):
    tokens = SessionTokens(tiny_bundle)
    _, calls = _tool_conversation(tokens, tiny_bundle, 10)
    assert len(tokens.branches) == 1
    assert all(r.branch == 0 for r, _ in calls)
    assert calls[0][0].branch_reason is None and not calls[0][0].bridged
    for (prev, prev_completion), (cur, _) in zip(calls, calls[1:], strict=False):
        previous = prev.prompt_ids + prev_completion
        assert cur.bridged
        assert cur.prompt_ids[:len(previous)] == previous
        assert len(cur.prompt_ids) > len(previous)


def test_bridge_equals_full_render_when_the_harness_echoes_verbatim(tiny_bundle):
    tokens = SessionTokens(tiny_bundle)
    messages = [SYSTEM, USER]
    for i in range(4):
        reply = Message(role="assistant", reasoning=f"step {i}", content=f"Running {i}.",
                        tool_calls=[shell_call(f"x{i}", f"cat f{i}")])
        rendered, _, assistant, _ = _turn(tokens, tiny_bundle, messages, reply)
        if i:
            # Within one tool cycle Qwen3 keeps reasoning: the gateway's reused ids are
            # exactly what a fresh render of the echoed history gives.
            assert rendered.bridged
            assert rendered.prompt_ids == tokens._full_render(chat(messages, [SHELL_TOOL]))
        messages = [*messages, assistant,
                    Message(role="tool", content="ok", tool_call_id=assistant.tool_calls[0].id)]


def test_fast_tokenizer_renders_the_same_ids_as_transformers(tiny_bundle):
    from renderers import Qwen3RendererConfig, create_renderer

    from openforge.gateway.template_check import _CHECK_CONVERSATIONS

    hf = tiny_bundle.tokenizer.hf
    reference = create_renderer(hf, Qwen3RendererConfig())
    for _, tools, messages in _CHECK_CONVERSATIONS:
        specs = [t.to_renderer() for t in tools] or None
        dicts = [m.to_renderer() for m in messages]
        for k in range(1, len(dicts) + 1):
            assert tiny_bundle.renderer.render_ids(dicts[:k], tools=specs, add_generation_prompt=True) \
                == reference.render_ids(dicts[:k], tools=specs, add_generation_prompt=True)
    text = "héllo <tool_call>\n{\"a\": 1}</tool_call>  wörld\n\n"
    assert tiny_bundle.tokenizer.encode(text) == hf.encode(text, add_special_tokens=False)
    ids = hf.encode(text + "<|im_end|>", add_special_tokens=False)
    assert tiny_bundle.tokenizer.decode(ids) == hf.decode(ids, skip_special_tokens=False)
    assert len(tiny_bundle.tokenizer) == len(hf) and tiny_bundle.tokenizer.eos_token == "<|im_end|>"
    # A raw completions prompt takes special-token text as control tokens, as transformers does.
    raw = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" + text
    assert tiny_bundle.encode_prompt(raw) == hf.encode(raw, add_special_tokens=False)


def test_rewritten_history_opens_exactly_one_branch(tiny_bundle):
    tokens = SessionTokens(tiny_bundle)
    messages, _ = _tool_conversation(tokens, tiny_bundle, 4)
    edited = list(messages)
    edited[3] = edited[3].model_copy(update={"content": "output elided"})  # a tool result
    rendered = tokens.render(chat(edited, [SHELL_TOOL]))
    assert (rendered.branch, rendered.branch_reason) == (1, BRANCH_HISTORY_REWRITTEN)
    completion = assistant_turn_ids(tiny_bundle, edited, Message(role="assistant", content="done"))
    assistant, finish = tokens.parse(chat(edited, [SHELL_TOOL]), rendered.prompt_ids, completion)
    assert finish == "stop" and assistant.content == "done"
    tokens.commit(chat(edited, [SHELL_TOOL]), rendered, completion, assistant)
    # Continuing the rewritten history extends the new branch; no third branch.
    nxt = tokens.render(chat([*edited, assistant, Message(role="user", content="thanks")],
                             [SHELL_TOOL]))
    assert nxt.branch in (1, 2) and len(tokens.branches) <= 3
    assert nxt.branch_reason in (None, BRANCH_TEMPLATE_REWRITE)
    # ... and the original branch is untouched and still extends.
    orig = tokens.render(chat([*messages, Message(role="tool", content="more", tool_call_id="z")],
                              [SHELL_TOOL]))
    assert orig.branch == 0 and orig.bridged


def test_retry_of_a_delivered_call(tiny_bundle):
    tokens = SessionTokens(tiny_bundle)
    messages, calls = _tool_conversation(tokens, tiny_bundle, 2)
    first_prompt = calls[-1][0]
    again = tokens.render(chat(messages[:-2], [SHELL_TOOL]))
    assert again.branch_reason == BRANCH_RETRY and again.branch == 1
    assert again.prompt_ids == first_prompt.prompt_ids


def test_failed_call_then_retry_stays_on_the_branch(tiny_bundle):
    tokens = SessionTokens(tiny_bundle)
    messages, _ = _tool_conversation(tokens, tiny_bundle, 2)
    failed = tokens.render(chat(messages, [SHELL_TOOL]))  # the engine failed: no commit
    retried = tokens.render(chat(messages, [SHELL_TOOL]))
    assert failed.prompt_ids == retried.prompt_ids
    assert (retried.branch, retried.branch_reason) == (0, None)
    assert len(tokens.branches) == 1


def test_first_call_failing_does_not_shift_branch_numbers(tiny_bundle):
    tokens = SessionTokens(tiny_bundle)
    request = chat([SYSTEM, USER], [SHELL_TOOL])
    tokens.render(request)  # never committed
    again = tokens.render(request)
    assert (again.branch, again.branch_reason) == (0, None)


def test_title_call_without_tools_is_a_side_call(tiny_bundle):
    tokens = SessionTokens(tiny_bundle)
    _tool_conversation(tokens, tiny_bundle, 2)
    title = tokens.render(chat([Message(role="system", content="Write a 5-word title."), USER]))
    assert title.branch_reason == BRANCH_SIDE_CALL
    sub_agent = tokens.render(chat([Message(role="system", content="You are a sub-agent."),
                                    Message(role="user", content="grep TODO")], [SHELL_TOOL]))
    assert sub_agent.branch_reason == BRANCH_SIDE_CALL


def test_title_call_first_then_main_conversation(tiny_bundle):
    tokens = SessionTokens(tiny_bundle)
    title_req = chat([Message(role="system", content="Write a title."), USER])
    r = tokens.render(title_req)
    comp = assistant_turn_ids(tiny_bundle, title_req.messages, Message(role="assistant", content="Lines"))
    tokens.commit(title_req, r, comp, tokens.parse(title_req, r.prompt_ids, comp)[0])
    main = tokens.render(chat([SYSTEM, USER], [SHELL_TOOL]))
    assert (main.branch, main.branch_reason) == (1, BRANCH_NEW_CONVERSATION)


def test_new_user_turn_after_reasoning_is_a_template_rewrite(tiny_bundle):
    # Qwen3's template drops past reasoning at a new user query: the old ids cannot be
    # extended, and the session says why instead of corrupting the branch.
    tokens = SessionTokens(tiny_bundle, "exact")
    reply = Message(role="assistant", reasoning="think hard", content="4")
    _, _, assistant, _ = _turn(tokens, tiny_bundle, [USER], reply, tools=())
    nxt = tokens.render(chat([USER, assistant, Message(role="user", content="and 3+3?")]))
    assert nxt.branch_reason == BRANCH_TEMPLATE_REWRITE


def _user_turns_extend(tokens: SessionTokens, bundle: ModelBundle
                       ) -> tuple[list[int], list[Message]]:
    """Three user turns with reasoning; each prompt extends the last prompt + completion.
    Returns the last prompt + completion and the conversation so far."""
    messages = [USER]
    previous: list[int] = []
    for i in range(3):
        reply = Message(role="assistant", reasoning=f"think {i}", content=str(i))
        rendered, completion, assistant, _ = _turn(tokens, bundle, messages, reply, tools=())
        if previous:
            assert rendered.bridged and rendered.prompt_ids[:len(previous)] == previous
        previous = rendered.prompt_ids + completion
        messages = [*messages, assistant, Message(role="user", content=f"and {i}?")]
    assert len(tokens.branches) == 1
    return previous, messages


def test_user_turns_bridge_with_thinking_retention_all():
    bundle = load_model_bundle("tiny", "qwen3", thinking_retention="all")
    _user_turns_extend(SessionTokens(bundle, "exact"), bundle)


def test_concurrent_calls_on_one_branch_fork_on_commit(tiny_bundle):
    tokens = SessionTokens(tiny_bundle)
    messages, _ = _tool_conversation(tokens, tiny_bundle, 1)
    req = chat(messages, [SHELL_TOOL])
    a, b = tokens.render(req), tokens.render(req)
    reply = Message(role="assistant", content="ok")
    comp = assistant_turn_ids(tiny_bundle, messages, reply)
    first = tokens.commit(req, a, comp, reply)
    second = tokens.commit(req, b, comp, reply)
    assert a.branch == b.branch == first.index == 0
    assert (second.index, second.reason) == (1, BRANCH_CONCURRENT)
    assert b.prompt_ids == a.prompt_ids and list(second.prompt) == b.prompt_ids


def test_a_bridged_prompt_is_an_array_of_its_own_that_its_commit_keeps(tiny_bundle):
    # The gateway hands the engine and the store `RenderedPrompt.prompt` (an int32 array)
    # and the commit keeps that very array as the branch's prompt: no prompt may share its
    # array with another, or a later call would change what an earlier one recorded.
    from array import array

    tokens = SessionTokens(tiny_bundle)
    messages, _ = _tool_conversation(tokens, tiny_bundle, 2)
    req = chat(messages, [SHELL_TOOL])
    a, b = tokens.render(req), tokens.render(req)
    assert a.bridged and isinstance(a.prompt, array) and a.prompt.typecode == "i"
    assert a.prompt is not b.prompt and a.prompt_ids == b.prompt_ids
    extends = a.extends
    assert extends is not None and len(a.prompt) > len(extends.prompt) + len(extends.completion)
    assert a.prompt[:len(extends.prompt) + len(extends.completion)] == (
        extends.prompt + extends.completion)
    before = a.prompt_ids
    reply = Message(role="assistant", content="ok")
    comp = assistant_turn_ids(tiny_bundle, messages, reply)
    kept, forked = tokens.commit(req, a, comp, reply), tokens.commit(req, b, comp, reply)
    assert kept.prompt is a.prompt and forked.prompt is b.prompt
    later = chat([*messages, reply, Message(role="user", content="more?")], [SHELL_TOOL])
    c = tokens.render(later)
    assert c.extends is not None and c.prompt is not kept.prompt
    tokens.commit(later, c, comp, reply)
    assert a.prompt_ids == before and a.prompt_ids == c.prompt_ids[:len(before)]
    ids = a.prompt_ids
    ids.append(0)  # a caller's list is a copy
    assert a.prompt_ids == before


def test_a_prompt_names_the_call_it_extends_also_when_its_commit_forks(tiny_bundle):
    # What the store keeps a prompt against (`Extension.call_id`): the call that committed
    # the ids the prompt starts with, as they were when it was rendered.
    tokens = SessionTokens(tiny_bundle)
    opening = chat([SYSTEM, USER], [SHELL_TOOL])
    first = tokens.render(opening)
    assert first.extends is None  # a new branch extends no call
    reply = Message(role="assistant", content="", tool_calls=[shell_call("h0", "ls")])
    done = assistant_turn_ids(tiny_bundle, opening.messages, reply, [SHELL_TOOL])
    assert tokens.commit(opening, first, done, reply, "call-1").call_id == "call-1"
    follow = chat([SYSTEM, USER, reply, Message(role="tool", content="a b", tool_call_id="h0")],
                  [SHELL_TOOL])
    a, b = tokens.render(follow), tokens.render(follow)
    for rendered in (a, b):
        assert rendered.extends is not None and rendered.extends.call_id == "call-1"
        head = len(rendered.extends.prompt) + len(rendered.extends.completion)
        assert rendered.prompt_ids[:head] == first.prompt_ids + done
    answer = Message(role="assistant", content="2 files")
    more = assistant_turn_ids(tiny_bundle, follow.messages, answer, [SHELL_TOOL])
    kept = tokens.commit(follow, a, more, answer, "call-2")
    forked = tokens.commit(follow, b, more, answer, "call-3")
    assert (kept.index, kept.call_id) == (0, "call-2")
    assert (forked.index, forked.reason, forked.call_id) == (1, BRANCH_CONCURRENT, "call-3")
    # The next prompt extends a branch as its latest call left it (of two alike, the first).
    later = chat([*follow.messages, answer, Message(role="user", content="and now?")],
                 [SHELL_TOOL])
    extends = tokens.render(later).extends
    assert extends is not None and extends.call_id == "call-2"
    assert list(extends.prompt) == a.prompt_ids and list(extends.completion) == more


def test_parse_of_a_rendered_tool_call_gives_the_call_back(tiny_bundle):
    tokens = SessionTokens(tiny_bundle)
    request = chat([SYSTEM, USER], [SHELL_TOOL])
    rendered = tokens.render(request)
    call = ToolCall(id="orig", name="shell", arguments=json.dumps({"cmd": "ls -la", "n": [1, 2]}))
    reply = Message(role="assistant", reasoning="List first.", content="", tool_calls=[call])
    completion = assistant_turn_ids(tiny_bundle, request.messages, reply, [SHELL_TOOL])
    assert completion[-1] == tiny_bundle.stop_token_ids[0]
    message, finish = tokens.parse(request, rendered.prompt_ids, completion)
    assert finish == "tool_calls"
    assert message.reasoning == "List first."
    assert [(c.name, c.arguments_dict()) for c in message.tool_calls] == [
        ("shell", {"cmd": "ls -la", "n": [1, 2]})]
    assert message.tool_calls[0].id.startswith("call_") and message.tool_calls[0].id != "orig"


def test_parse_plain_text_strips_stop_tokens(tiny_bundle):
    tokens = SessionTokens(tiny_bundle)
    request = chat([USER])
    rendered = tokens.render(request)
    completion = tiny_bundle.encode("Hello there.") + [tiny_bundle.stop_token_ids[0]]
    message, finish = tokens.parse(request, rendered.prompt_ids, completion)
    assert (message.content, message.tool_calls, finish) == ("Hello there.", [], "stop")


def test_raw_prompts_pass_through_and_branch_on_ids(tiny_bundle):
    tokens = SessionTokens(tiny_bundle)
    text = chat([], raw_prompt="hello world")
    r = tokens.render(text)
    assert (r.prompt_ids, r.branch, r.branch_reason) == ([14990, 1879], 0, None)
    tokens.commit(text, r, [11, 12], Message(role="assistant", content="x"))
    ext = tokens.render(chat([], raw_prompt_ids=[14990, 1879, 11, 12, 13]))
    assert (ext.branch, ext.bridged) == (0, True)
    other = tokens.render(chat([], raw_prompt_ids=[99, 100]))
    assert (other.branch, other.branch_reason) == (1, BRANCH_NEW_CONVERSATION)
    message, _ = tokens.parse(text, r.prompt_ids, tiny_bundle.encode(" ok") + tiny_bundle.stop_token_ids[:1])
    assert message.content == " ok"


def test_memory_per_token(tiny_bundle):
    tokens = SessionTokens(tiny_bundle)
    _tool_conversation(tokens, tiny_bundle, 10)
    assert tokens.num_tokens() > 500
    assert tokens.nbytes() / tokens.num_tokens() <= 8


def test_check_template_reports(tiny_bundle, capsys):
    from openforge.gateway.template_check import check_template

    assert check_template("tiny") is False
    out = capsys.readouterr().out
    assert "Qwen3Renderer" in out and "is_prefix_stable: False" in out
    assert "ok  tool loop" in out
    # Qwen3 drops past reasoning at new user turns: reported, with where and what.
    assert "BAD chat with reasoning" in out and "re-render rewrites token" in out


def test_check_template_cli_exit_code():
    proc = subprocess.run([sys.executable, "-m", "openforge.cli", "check-template", "tiny",
                           "--renderer", "nope"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "unknown renderer 'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_renderer_is_a_clear_error():
    import pytest

    from openforge.errors import OpenforgeError

    with pytest.raises(OpenforgeError, match="unknown renderer 'nope'"):
        load_model_bundle("tiny", "nope")
    with pytest.raises(OpenforgeError, match="cannot load the tokenizer"):
        load_model_bundle("/nonexistent/model/dir")


def test_default_renderer_with_named_parsers():
    import pytest

    from openforge.errors import OpenforgeError
    from openforge.gateway.model import _default_config

    config = _default_config("default:hermes:think")
    assert (config.name, config.tool_parser, config.reasoning_parser) == ("default", "qwen3", "think")
    with pytest.raises(OpenforgeError, match="unknown tool parser 'xml'"):
        _default_config("default:xml")


def test_images_for_a_text_only_model_are_a_request_error(tiny_bundle):
    import pytest

    from openforge.gateway.conversation import ImageRef

    tokens = SessionTokens(tiny_bundle)
    msg = Message(role="user", content="what is this?", images=[ImageRef(url="data:image/png;base64,AA")])
    with pytest.raises(ValueError, match="text only"):
        tokens.render(chat([msg]))
    with pytest.raises(ValueError, match="no messages"):
        tokens.render(chat([]))


def test_parse_never_fails_on_garbage_ids(tiny_bundle):
    tokens = SessionTokens(tiny_bundle)
    request = chat([USER], [SHELL_TOOL])
    rendered = tokens.render(request)
    tool_call, think_end = 151657, 151668
    for ids in ([], [tool_call], [think_end, think_end, 5], [tool_call, 90, 91, 151658, 151645],
                [151645, 151645]):
        message, finish = tokens.parse(request, rendered.prompt_ids, ids)
        assert finish in ("stop", "tool_calls") and message.role == "assistant"


def test_append_policy_keeps_one_branch_where_the_template_rewrites(tiny_bundle):
    # The same conversation as the template-rewrite case above, under `append`: every id
    # the policy sampled (reasoning included) stays in the next prompt; one branch.
    tokens = SessionTokens(tiny_bundle, "append")
    previous, messages = _user_turns_extend(tokens, tiny_bundle)
    assert "think 0" in tiny_bundle.decode(previous)  # a fresh template render drops it
    assert "think 0" not in tiny_bundle.decode(tokens._full_render(chat(messages[:-1])))


def test_unknown_render_policy_is_refused(tiny_bundle):
    import pytest

    with pytest.raises(ValueError, match="render policy must be one of exact, append"):
        SessionTokens(tiny_bundle, "merge")  # type: ignore[arg-type]


def test_full_renders_tokenize_only_new_texts(tiny_bundle, monkeypatch):
    # `exact` re-renders the whole history at each new user turn (Qwen3 rewrites earlier
    # turns); the session's text cache means only the texts it has not seen get tokenized.
    long_text = "the build log says: " + "compiling module, " * 20
    seen: list[str] = []
    rendering = [False]
    original = type(tiny_bundle.tokenizer).encode_long

    def counting(self, text):
        if rendering[0]:
            seen.append(text)
        return original(self, text)

    monkeypatch.setattr(type(tiny_bundle.tokenizer), "encode_long", counting)
    # Texts other tests' sessions tokenized are not this session's to reuse here.
    monkeypatch.setattr(tiny_bundle.tokenizer, "_shared", SharedTexts())
    tokens = SessionTokens(tiny_bundle, "exact")
    render = tokens.render

    def observed(request, *args):
        rendering[0] = True
        try:
            return render(request, *args)
        finally:
            rendering[0] = False

    monkeypatch.setattr(tokens, "render", observed)
    messages = [SYSTEM, Message(role="user", content=long_text + "turn 0")]
    for i in range(5):
        reply = Message(role="assistant", reasoning="hm", content=f"answer {i} " + long_text)
        before = len(seen)
        rendered, _, assistant, _ = _turn(tokens, tiny_bundle, messages, reply, tools=())
        if i:
            assert rendered.branch_reason == BRANCH_TEMPLATE_REWRITE  # a full render...
            new = seen[before:]
            # ... that tokenized the new user turn and the last answer as history, not
            # the earlier turns again.
            assert len(new) == 2, new
            assert f"turn {i}" in new[1] and f"answer {i - 1}" in new[0]
        messages = [*messages, assistant, Message(role="user", content=long_text + f"turn {i + 1}")]


def _bridge_cases(bundle: ModelBundle):
    """(prompt, completion, new messages) a session can bridge: tool and user turns after a
    long history, a completion cut off before its turn closed, one cut off inside its
    reasoning, and a prompt whose generation prompt opened a reasoning block."""
    history = [SYSTEM, USER]
    for i in range(12):
        call = Message(role="assistant", content="", tool_calls=[shell_call(f"h{i}", f"cat f{i}")])
        history += [call, Message(role="tool", content=f"line {i}\n" * 20, tool_call_id=f"h{i}")]
    prompt = bundle.renderer.render_ids([m.to_renderer() for m in history],
                                        tools=[SHELL_TOOL.to_renderer()],
                                        add_generation_prompt=True)
    reply = Message(role="assistant", reasoning="Look first.", content="",
                    tool_calls=[shell_call("c1", "ls")])
    whole = assistant_turn_ids(bundle, history, reply, [SHELL_TOOL])
    tool = [{"role": "tool", "content": "a\nb", "tool_call_id": "c1"}]
    user = [{"role": "user", "content": "Now count them."}]
    think = bundle.tokenizer.convert_tokens_to_ids("<think>")
    yield prompt, whole, tool
    yield prompt, whole, user
    yield prompt, whole[:-1], tool  # max_tokens cut it before <|im_end|>
    yield prompt, whole[:3], user  # ... inside its reasoning
    yield [*prompt, think, *bundle.encode("\n")], bundle.encode("Plan.\n</think>\n\nDone."), user


def test_a_bridge_reads_the_prompt_from_its_last_turn_only(tiny_bundle, monkeypatch):
    """Bridging costs what a call adds: the renderer is handed the prompt from its last
    turn-ending token on, and the result is what bridging the whole prompt gives."""
    from array import array

    from openforge.gateway.render import bridge, renderer_tools

    appending = load_model_bundle("tiny", "qwen3", thinking_retention="all")
    declined = []
    for renderer in (tiny_bundle.renderer, appending.renderer):
        for prompt, completion, new in _bridge_cases(tiny_bundle):
            whole = renderer.bridge_to_next_turn(list(prompt), list(completion), new,
                                                 tools=renderer_tools([SHELL_TOOL]))
            expected = None if whole is None else list(whole.token_ids)
            if expected is not None and expected[:len(prompt) + len(completion)] != [
                    *prompt, *completion]:
                expected = None  # the bridge rewrote what the engine saw: re-render
            seen: list[int] = []
            real = renderer.bridge_to_next_turn

            def spy(previous, *args, _real=real, _seen=seen, **kwargs):
                _seen.append(len(previous))
                return _real(previous, *args, **kwargs)

            monkeypatch.setattr(renderer, "bridge_to_next_turn", spy)
            added = bridge(renderer, array("i", prompt), array("i", completion), new,
                           [SHELL_TOOL])
            monkeypatch.undo()
            # Only the ids after prompt + completion come back: the caller appends them.
            got = None if added is None else [*prompt, *completion, *added]
            assert got == expected
            assert seen and seen[0] <= 8 < len(prompt)  # "<|im_end|>\n<|im_start|>assistant\n..."
            declined.append(got is None)
    assert any(declined) and not all(declined)  # bridged, and declined (the caller re-renders)


def test_a_renderer_not_known_to_read_only_the_last_turn_gets_the_whole_prompt(tiny_bundle):
    """A subclass (or another family: Qwen3-VL counts the images of the whole prompt) may
    read all of it, so it is handed all of it."""
    from openforge.gateway.render import bridge, renderer_tools

    seen: list[int] = []

    class Counting(type(tiny_bundle.renderer)):  # type: ignore[misc]
        def bridge_to_next_turn(self, previous, *args, **kwargs):
            seen.append(len(previous))
            return super().bridge_to_next_turn(previous, *args, **kwargs)

    renderer = Counting.__new__(Counting)
    renderer.__dict__.update(tiny_bundle.renderer.__dict__)
    prompt, completion, new = next(_bridge_cases(tiny_bundle))
    added = bridge(renderer, prompt, completion, new, [SHELL_TOOL])
    assert seen == [len(prompt)]
    whole = tiny_bundle.renderer.bridge_to_next_turn(list(prompt), list(completion), new,
                                                     tools=renderer_tools([SHELL_TOOL]))
    assert added is not None and added == list(whole.token_ids)[len(prompt) + len(completion):]


def test_sessions_that_open_alike_share_the_first_render(tiny_bundle, monkeypatch):
    """The rollouts of one task open with the same messages: the model renders that first
    prompt once. Anything different in what the renderer is given (a message, the tools'
    key order) renders on its own, and a session's later calls bridge as before."""
    from openforge.gateway.conversation import Tool
    from openforge.gateway.first_renders import FirstRenders

    monkeypatch.setattr(tiny_bundle, "first_renders", FirstRenders(max_entries=2))
    rendered: list[int] = []
    real = tiny_bundle.renderer.render_ids

    def spy(messages, *args, **kwargs):
        rendered.append(len(messages))
        return real(messages, *args, **kwargs)

    monkeypatch.setattr(tiny_bundle.renderer, "render_ids", spy)
    opening = chat([SYSTEM, USER], [SHELL_TOOL])
    first = SessionTokens(tiny_bundle).render(opening).prompt_ids
    first.append(0)  # a caller's list is its own: the kept ids do not change
    again = SessionTokens(tiny_bundle).render(opening).prompt_ids
    assert rendered == [2] and again == first[:-1]

    reordered = Tool(name="shell", description=SHELL_TOOL.description, parameters=dict(
        reversed(list(SHELL_TOOL.parameters.items()))))
    other_user = Message(role="user", content="Count the words of every file.")
    for messages, tools in (([SYSTEM, USER], [reordered]), ([SYSTEM, other_user], [SHELL_TOOL])):
        before = len(rendered)
        ids = SessionTokens(tiny_bundle).render(chat(messages, tools)).prompt_ids
        assert len(rendered) == before + 1
        assert ids == real([m.to_renderer() for m in messages],
                           tools=[t.to_renderer() for t in tools], add_generation_prompt=True)
    cache = tiny_bundle.first_renders
    assert (cache.hits, cache.misses, len(cache)) == (1, 3, 2)
    SessionTokens(tiny_bundle).render(opening)  # the least recently used: gone
    assert (cache.hits, cache.misses) == (1, 4)

    tokens = SessionTokens(tiny_bundle)
    _tool_conversation(tokens, tiny_bundle, 3)  # its first call hits; the rest bridge
    assert (cache.hits, cache.misses) == (2, 4)
    assert len(tokens.branches) == 1
