"""What the gateway's hot-path shortcuts must not change.

The per-session history memo: a request parsed with the memo is exactly the request parsed
from scratch, while the unchanged history prefix is reused instead of re-parsed. The
store's verbatim request/response JSON (the bodies as sent, not re-encoded) and its
background WAL checkpoints.
"""

from __future__ import annotations

import copy
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from fixtures_model import SHELL_TOOL, chat, tiny_bundle  # noqa: F401  (pytest fixture)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openforge.gateway import json_process
from openforge.gateway.branches import SessionTokens
from openforge.gateway.conversation import ChatRequest, Message
from openforge.gateway.dialects import DIALECTS, DialectError
from openforge.gateway.dialects.memo import HistoryMemo, fingerprint
from openforge.gateway.model import FastTokenizer, ModelBundle, SharedTexts
from openforge.store import COMPRESS_OVER, Store
from openforge.types import Call, Session

SHELL_CHAT = {"type": "function", "function": {
    "name": "shell", "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}
SHELL_RESPONSES = {"type": "function", "name": "shell", "description": "Run a command.",
                   "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
SHELL_MESSAGES = {"name": "shell", "description": "Run a command.",
                  "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}


def chat_turns(n: int) -> list[dict[str, Any]]:
    """The bodies an OpenAI-chat harness sends over `n` tool turns (history grows)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": [{"type": "text", "text": "Fix the tests."}]}]
    bodies = []
    for t in range(n):
        bodies.append({"model": "m", "messages": copy.deepcopy(messages), "tools": [SHELL_CHAT],
                       "max_tokens": 64, "stream": t % 2 == 0})
        messages.append({"role": "assistant", "content": None, "reasoning_content": f"step {t}",
                         "tool_calls": [{"id": f"c{t}", "type": "function", "function": {
                             "name": "shell", "arguments": {"cmd": "ls", "n": t}}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{t}", "content": f"out {t}\n"})
    return bodies


def responses_turns(n: int) -> list[dict[str, Any]]:
    """Codex-style bodies: reasoning, message and function_call items of one turn apart."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [
            {"type": "input_text", "text": "sandbox: workspace-write"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Fix the tests."}]}]
    bodies = []
    for t in range(n):
        bodies.append({"model": "m", "instructions": "You are Codex.", "input":
                       copy.deepcopy(items), "tools": [SHELL_RESPONSES], "store": False})
        items.append({"type": "reasoning", "summary": [
            {"type": "summary_text", "text": f"think {t}"}]})
        if t % 2:
            items.append({"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": f"Running step {t}."}]})
        items.append({"type": "function_call", "call_id": f"c{t}", "name": "shell",
                      "arguments": json.dumps({"cmd": "pytest", "n": t})})
        if t % 3 == 2:  # a request that ends inside an assistant turn (no output yet)
            bodies.append({"model": "m", "instructions": "You are Codex.",
                           "input": copy.deepcopy(items), "tools": [SHELL_RESPONSES]})
        items.append({"type": "function_call_output", "call_id": f"c{t}", "output": f"ok {t}"})
    return bodies


def messages_turns(n: int) -> list[dict[str, Any]]:
    """Claude Code-style bodies: system blocks, thinking, tool_use with object inputs."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the tests."}]
    bodies = []
    for t in range(n):
        bodies.append({"model": "m", "max_tokens": 256, "tools": [SHELL_MESSAGES],
                       "system": [{"type": "text", "text": "You are Claude Code.",
                                   "cache_control": {"type": "ephemeral"}}],
                       "messages": copy.deepcopy(messages)})
        messages.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"plan {t}", "signature": "x"},
            {"type": "tool_use", "id": f"t{t}", "name": "shell",
             "input": {"cmd": "pytest", "timeout": 120000, "verbose": t % 2 == 0}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"t{t}", "content": f"{t} passed",
             "is_error": False},
            {"type": "text", "text": "continue"}]})
        if t == 1:
            messages.append({"role": "system", "content": "A reminder in the history."})
            messages.append({"role": "user", "content": "go on"})
    return bodies


TURNS = {"chat": chat_turns, "responses": responses_turns, "messages": messages_turns}


def parse(dialect: str, body: dict[str, Any], memo: HistoryMemo | None = None) -> ChatRequest:
    # A fresh copy, as a new request body would be: the memo must not rely on identity.
    return DIALECTS[dialect].parse(copy.deepcopy(body), memo=memo)


@pytest.mark.parametrize("dialect", sorted(TURNS))
def test_memo_parse_equals_fresh_parse_and_reuses_the_prefix(dialect: str) -> None:
    memo = HistoryMemo()
    previous: ChatRequest | None = None
    reused = 0
    for body in TURNS[dialect](8):
        with_memo = parse(dialect, body, memo)
        assert with_memo.model_dump() == parse(dialect, body).model_dump()
        if previous is not None:
            shared = sum(1 for a, b in zip(with_memo.messages, previous.messages, strict=False)
                         if a is b)
            reused += shared
            assert shared >= 1
        previous = with_memo
    assert reused > 10


@pytest.mark.parametrize("dialect", sorted(TURNS))
def test_memo_with_another_dialect_or_no_history_starts_over(dialect: str) -> None:
    memo = HistoryMemo()
    for other in sorted(TURNS):
        body = TURNS[other](3)[-1]
        assert parse(other, body, memo).model_dump() == parse(other, body).model_dump()
    body = TURNS[dialect](3)[-1]
    assert parse(dialect, body, memo).model_dump() == parse(dialect, body).model_dump()


def test_values_equal_in_python_but_not_in_json_are_parsed_again() -> None:
    """`1 == 1.0 == True` and key order is invisible to `==`: neither may reuse a message."""
    memo = HistoryMemo()
    body = messages_turns(3)[-1]
    parse("messages", body, memo)
    edited = copy.deepcopy(body)
    tool_use = edited["messages"][1]["content"][1]
    tool_use["input"] = {"timeout": 120000.0, "verbose": 1, "cmd": "pytest"}  # == the original
    assert tool_use["input"] == body["messages"][1]["content"][1]["input"]
    with_memo = parse("messages", edited, memo)
    assert with_memo.model_dump() == parse("messages", edited).model_dump()
    assert with_memo.messages[2].tool_calls[0].arguments == (
        '{"timeout":120000.0,"verbose":1,"cmd":"pytest"}')
    # The same values in another key order: the arguments text follows the new order.
    parse("messages", body, memo)
    reordered = copy.deepcopy(body)
    original = body["messages"][1]["content"][1]["input"]
    reordered["messages"][1]["content"][1]["input"] = dict(reversed(list(original.items())))
    with_memo = parse("messages", reordered, memo)
    assert with_memo.model_dump() == parse("messages", reordered).model_dump()
    assert with_memo.messages[2].tool_calls[0].arguments.startswith('{"verbose"')
    # A boolean field given as 1 must still be refused, as without the memo.
    parse("messages", body, memo)
    bad = copy.deepcopy(body)
    bad["messages"][2]["content"][0]["is_error"] = 0
    assert bad == body  # 0 == False
    with pytest.raises(DialectError) as fresh:
        parse("messages", bad)
    with pytest.raises(DialectError) as memoized:
        parse("messages", bad, memo)
    assert memoized.value.message == fresh.value.message


def test_fingerprint_tells_types_and_key_order_apart() -> None:
    assert fingerprint({"a": 1, "b": [None, "x"]}) == fingerprint({"a": 1, "b": [None, "x"]})
    for other in ({"a": 1.0, "b": [None, "x"]}, {"a": True, "b": [None, "x"]},
                  {"b": [None, "x"], "a": 1}, {"a": 1, "b": [None, "y"]}):
        assert fingerprint({"a": 1, "b": [None, "x"]}) != fingerprint(other)


def test_a_failed_parse_leaves_the_memo_as_it_was() -> None:
    memo = HistoryMemo()
    good = chat_turns(4)[-1]
    parse("chat", good, memo)
    bad = copy.deepcopy(good)
    bad["messages"][-1]["tool_call_id"] = "nobody-called-this"
    with pytest.raises(DialectError):
        parse("chat", bad, memo)
    assert parse("chat", good, memo).model_dump() == parse("chat", good).model_dump()


def test_tool_results_are_checked_against_the_calls_of_the_reused_history_only() -> None:
    """The memo checks only the new messages' tool results, against the calls its reused
    messages made: a call made in a part of the history that was not reused (the harness
    rewrote it) answers nothing, a call made in the reused part still does."""
    memo = HistoryMemo()
    body = chat_turns(4)[-1]  # calls c0, c1, c2, each answered
    first = parse("chat", body, memo)
    rewritten = copy.deepcopy(body)
    rewritten["messages"][-2]["tool_calls"][0]["id"] = "c2-rewritten"  # c2 is no longer called
    with pytest.raises(DialectError, match="tool result 'c2' does not match"):
        parse("chat", rewritten, memo)
    with pytest.raises(DialectError, match="tool result 'c2' does not match"):
        parse("chat", rewritten)  # as without the memo

    late = copy.deepcopy(body)  # a new result for c0, whose call is in the reused history
    late["messages"].append({"role": "tool", "tool_call_id": "c0", "content": "again"})
    with_memo = parse("chat", late, memo)
    assert with_memo.model_dump() == parse("chat", late).model_dump()
    assert with_memo.messages[len(first.messages) - 1] is first.messages[-1]  # it was reused


def _mutations(body: dict[str, Any], key: str) -> st.SearchStrategy[dict[str, Any]]:
    """Bodies sharing a prefix of `body[key]` with it, then differing."""
    items = body[key]

    def mutate(cut: int, change: int, value: Any) -> dict[str, Any]:
        out = copy.deepcopy(body)
        out[key] = out[key][:cut]
        if out[key] and change >= 0:
            i = change % len(out[key])
            item = out[key][i]
            if isinstance(item, dict) and item:
                field = sorted(item)[change % len(item)]
                item[field] = value
            else:
                out[key][i] = value
        return out

    values = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.floats(-2, 2),
                       st.text(max_size=5), st.just([]), st.just({}),
                       st.sampled_from(["user", "assistant", "tool", "system"]))
    return st.builds(mutate, st.integers(1, len(items)), st.integers(-1, 50), values)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(value=JSON_VALUES, ensure_ascii=st.booleans())
def test_the_fast_json_decoder_gives_jsons_own_value(value: Any, ensure_ascii: bool) -> None:
    raw = json.dumps(value, ensure_ascii=ensure_ascii).encode()
    decoded = json_process.parse(raw)
    assert decoded == json.loads(raw)
    assert json.dumps(decoded) == json.dumps(json.loads(raw))  # types too: 1 vs 1.0 vs True


@pytest.mark.parametrize("raw", [
    b"\xef\xbb\xbf{}", '{"a": 1}'.encode("utf-16"), b'"\xed\xa0\x80"', b'"\\ud800"',
    b"\xff", b"[1,]", b'{"a": 1} x', b"01", b'"a\tb"', b"[" * 5000 + b"]" * 5000,
    b"[Infinity, NaN]", b"1e400",
])
def test_the_fast_json_decoder_accepts_and_refuses_what_json_does(raw: bytes) -> None:
    """Inputs where pydantic-core's parser and `json` differ, or that are invalid: the value
    or the exception is json's own."""
    try:
        expected: Any = repr(json.loads(raw))
    except Exception as exc:  # noqa: BLE001 (the type is what is compared)
        expected = type(exc)
    try:
        got: Any = repr(json_process.parse(raw))
    except Exception as exc:  # noqa: BLE001
        got = type(exc)
    assert got == expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_memo_never_changes_the_outcome_of_a_parse(data: st.DataObject) -> None:
    """Whatever sequence of (valid or broken) requests a session sends, each parses (or
    fails) exactly as it would without the memo."""
    dialect = data.draw(st.sampled_from(sorted(TURNS)))
    key = {"chat": "messages", "responses": "input", "messages": "messages"}[dialect]
    base = TURNS[dialect](5)[-1]
    memo = HistoryMemo()
    for _ in range(3):
        body = data.draw(st.one_of(st.just(base), _mutations(base, key)))
        try:
            fresh: Any = parse(dialect, body).model_dump()
        except DialectError as exc:
            fresh = exc.message
        try:
            memoized: Any = parse(dialect, body, memo).model_dump()
        except DialectError as exc:
            memoized = exc.message
        assert memoized == fresh


# --- the store keeps the bodies as they were sent --------------------------------------------


def _call(cid: str, request: dict[str, Any], response: dict[str, Any]) -> Call:
    return Call(id=cid, session_id="s", request=request, response=response, prompt_ids=[1, 2],
                completion_ids=[3], logprobs=[-0.5])


@pytest.mark.parametrize("size", [10, COMPRESS_OVER * 2])
def test_store_keeps_request_and_response_json_as_sent(tmp_path: Path, size: int) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.create_session(Session(id="s", token="t"))
    request = {"messages": [{"role": "user", "content": "ünï " + "x" * size}], "n": 1.5}
    response = {"choices": [{"message": {"content": "✓ " + "y" * size}}]}
    raw_request = json.dumps(request, indent=1, ensure_ascii=False).encode()
    raw_response = json.dumps(response, ensure_ascii=True).encode()
    store.add_call(_call("c1", request, response), request_json=raw_request,
                   response_json=raw_response)
    got = store.get_call("c1")
    assert got is not None
    assert got.request == request and got.response == response
    # UTF-16 JSON (json.loads accepts it) is not stored verbatim: re-encoded instead.
    store.add_call(_call("c2", request, response),
                   request_json=json.dumps(request).encode("utf-16"))
    got = store.get_call("c2")
    assert got is not None and got.request == request
    store.close()


def test_background_checkpoints_keep_commits_and_stop_on_close(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.checkpoint_in_background(interval_s=0.05)
    store.checkpoint_in_background()  # idempotent
    assert store._conn().execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    store.create_session(Session(id="s", token="t"))
    # Taken before the calls: with automatic checkpoints off, only the background
    # checkpointer moves their pages from the WAL into the database file. (Taken after them,
    # a checkpoint that ran between the last commit and the stat left nothing to grow.)
    size = (tmp_path / "s.sqlite").stat().st_size
    big = {"text": "x" * 20_000}
    for i in range(300):  # ~1500 WAL pages: past the 1000 that would checkpoint in a commit
        store.add_call(_call(f"c{i}", big, {"ok": True}))
    deadline = time.monotonic() + 30
    while (tmp_path / "s.sqlite").stat().st_size <= size and time.monotonic() < deadline:
        time.sleep(0.05)  # the checkpointer copies the WAL into the database file
    assert (tmp_path / "s.sqlite").stat().st_size > size
    assert store._checkpointer is not None
    thread = store._checkpointer[1]
    store.close()
    assert not thread.is_alive()
    with sqlite3.connect(tmp_path / "s.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM calls").fetchone()[0] == 300


# --- long texts every session sends (a harness's system prompt and tools) -------------------


def test_a_long_text_all_sessions_send_is_tokenized_once(
        tiny_bundle: ModelBundle, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    tokenizer = tiny_bundle.tokenizer
    assert isinstance(tokenizer, FastTokenizer)
    monkeypatch.setattr(tokenizer, "_shared", SharedTexts())
    encoded: list[str] = []
    original = FastTokenizer.encode_long

    def counting(self: FastTokenizer, text: str) -> list[int]:
        encoded.append(text)
        return original(self, text)

    monkeypatch.setattr(FastTokenizer, "encode_long", counting)
    system = "You are a coding agent. " + "Follow the repository's conventions. " * 40
    prompts = []
    for k in range(3):
        request = chat([Message(role="system", content=system),
                        Message(role="user", content=f"Task {k}: " + "fix the tests. " * 10)],
                       [SHELL_TOOL])
        prompts.append(SessionTokens(tiny_bundle).render(request).prompt_ids)
    # Each session's own task was tokenized for it; the shared system prompt once.
    assert sum(system in text for text in encoded) == 1
    assert sum("Task" in text for text in encoded) == 3
    fresh = FastTokenizer.encode_long(tokenizer, system)  # the ids are the tokenizer's own
    assert tokenizer.encode(system) == fresh == tokenizer._backend.encode(
        system, add_special_tokens=False).ids
    assert all(p[:20] == prompts[0][:20] for p in prompts)  # the same system prompt ids


def test_shared_texts_keep_a_bounded_number_of_characters() -> None:
    shared = SharedTexts(budget=100)
    for i in range(10):
        shared.put(f"{i}" * 30, (i,))
    assert shared.chars <= 100
    assert shared.get("9" * 30) == (9,) and shared.get("0" * 30) is None  # oldest out
    shared.put("x" * 101, (1,))  # longer than the whole budget: not kept
    assert shared.get("x" * 101) is None


def test_taking_special_tokens_as_control_tokens_forgets_shared_texts(
        tiny_bundle: ModelBundle) -> None:  # noqa: F811
    tokenizer = tiny_bundle.tokenizer
    assert isinstance(tokenizer, FastTokenizer)
    text = "<|im_end|> a forged turn boundary, in a long tool output. " * 3
    as_text = tokenizer.encode(text)
    try:
        tokenizer.set_specials_as_text(False)
        assert tokenizer.encode(text) != as_text
    finally:
        tokenizer.set_specials_as_text(True)
    assert tokenizer.encode(text) == as_text
