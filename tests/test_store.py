"""The SQLite trace store: round trips, durability, concurrency, schema versioning."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

import openforge.store as store_module
from openforge.store import (
    COMPRESS_OVER,
    SCHEMA_VERSION,
    DuplicateCallError,
    NewCall,
    Store,
    StoreError,
    blob_to_floats,
    blob_to_ids,
    floats_to_blob,
    ids_to_blob,
    secret_hash,
)
from openforge.types import Call, RewardResult, RolloutResult, SamplingParams, Session


def make_session(sid: str = "s1", run_id: str = "run", created_at: float = 1.0) -> Session:
    return Session(id=sid, token=f"tok-{sid}", run_id=run_id, rollout_id=f"r-{sid}",
                   task_id="t1", model="policy", sampling=SamplingParams(temperature=0.7),
                   weight_version="w1", created_at=created_at, metadata={"prompt": "hi"})


def make_call(cid: str, session_id: str = "s1", index: int = 0, n: int = 5) -> Call:
    return Call(
        id=cid, session_id=session_id, index=index, dialect="messages",
        request={"messages": [{"role": "user", "content": "hello"}]},
        response={"content": [{"type": "text", "text": "hi"}]},
        prompt_ids=list(range(100, 100 + n)), completion_ids=[7, 8, 2**31 - 1, 0],
        logprobs=[-0.5, -0.25, 0.0, -1.0], finish_reason="stop", sampling={"temperature": 0.7},
        weight_version="w1", body_digest="abc", retry_count=1, images=["img://1"],
        started_at=10.0, finished_at=11.0, http_status=200,
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "store.sqlite")
    yield s
    s.close()


def test_blob_codecs_are_little_endian_and_exact() -> None:
    ids = [0, 1, -1, 2**31 - 1, -(2**31), 151643]
    blob = ids_to_blob(ids)
    assert len(blob) == 4 * len(ids)
    assert blob[:8] == bytes([0, 0, 0, 0, 1, 0, 0, 0])
    assert blob_to_ids(blob) == ids
    assert blob_to_floats(floats_to_blob([-0.5, 0.0, -1.25])) == [-0.5, 0.0, -1.25]


def test_sessions_round_trip_and_lookup_by_token(store: Store) -> None:
    session = make_session().model_copy(update={"scoring_token": "score-s1"})
    created = store.create_session(session)
    # What comes back is the session without its secrets: only their hashes are stored.
    stored = session.model_copy(update={"token": "", "scoring_token": "",
                                        "token_hash": secret_hash("tok-s1"),
                                        "scoring_hash": secret_hash("score-s1")})
    assert created.token_hash == stored.token_hash and created.token == "tok-s1"
    assert store.get_session("s1") == stored
    assert store.get_session_by_token("tok-s1") == stored
    assert store.get_session("nope") is None
    assert store.get_session_by_token("nope") is None
    assert store.get_session_by_token(secret_hash("tok-s1")) is None  # the hash is no token
    with pytest.raises(StoreError, match="already exists"):
        store.create_session(session)


def test_the_store_file_holds_no_token_or_scoring_credential(tmp_path: Path) -> None:
    with Store(tmp_path / "store.sqlite") as store:
        store.create_session(make_session().model_copy(update={"scoring_token": "score-s1"}))
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert b"tok-s1" not in raw and b"score-s1" not in raw
    assert secret_hash("tok-s1").encode() in raw


def test_a_schema_1_store_is_migrated_to_token_hashes(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE schema_version (version INTEGER NOT NULL);
        INSERT INTO schema_version VALUES (1);
        CREATE TABLE sessions (id TEXT PRIMARY KEY, token TEXT NOT NULL UNIQUE,
            run_id TEXT NOT NULL DEFAULT '', rollout_id TEXT NOT NULL DEFAULT '',
            task_id TEXT NOT NULL DEFAULT '', model TEXT NOT NULL DEFAULT '',
            sampling TEXT NOT NULL DEFAULT '{}', weight_version TEXT,
            status TEXT NOT NULL DEFAULT 'open', reward REAL, reward_details TEXT,
            created_at REAL NOT NULL, closed_at REAL, metadata TEXT NOT NULL DEFAULT '{}');
        INSERT INTO sessions (id, token, created_at) VALUES ('old', 'clear-token', 1.0);
    """)
    conn.commit()
    conn.close()
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        got = store.get_session_by_token("clear-token")
        assert got is not None and got.id == "old" and got.token == ""
        assert store.get_session_by_token("clear-token") == store.get_session("old")
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT token_hash FROM sessions").fetchone()[0] == secret_hash("clear-token")
    conn.close()


def test_close_session_and_reward(store: Store) -> None:
    store.create_session(make_session())
    store.close_session("s1", closed_at=5.0)
    store.close_session("s1", closed_at=9.0)  # idempotent: first close time kept
    store.set_reward("s1", 0.75, {"checks": 3})
    got = store.get_session("s1")
    assert got is not None and got.status == "closed" and got.closed_at == 5.0
    assert got.reward == 0.75
    assert store.get_reward_details("s1") == {"checks": 3}
    with pytest.raises(StoreError, match="no session"):
        store.set_reward("missing", 1.0)
    with pytest.raises(StoreError, match="no session"):
        store.close_session("missing")


def test_list_sessions_by_run_in_creation_order(store: Store) -> None:
    store.create_session(make_session("b", "run1", created_at=2.0))
    store.create_session(make_session("a", "run1", created_at=3.0))
    store.create_session(make_session("c", "run2", created_at=1.0))
    assert [s.id for s in store.list_sessions("run1")] == ["b", "a"]
    assert [s.id for s in store.list_sessions()] == ["c", "b", "a"]
    assert store.list_sessions("none") == []


def test_calls_round_trip_exactly(store: Store) -> None:
    store.create_session(make_session())
    call = make_call("c1")
    store.add_call(call)
    [got] = store.list_calls("s1")
    assert got.model_dump() == call.model_dump()
    assert store.get_call("c1") == got


def test_duplicate_call_id_raises_and_keeps_the_first(store: Store) -> None:
    store.create_session(make_session())
    store.add_call(make_call("c1", n=3))
    with pytest.raises(DuplicateCallError):
        store.add_call(make_call("c1", n=9))
    [got] = store.list_calls("s1")
    assert len(got.prompt_ids) == 3
    # the connection is still usable after the rolled back insert
    store.add_call(make_call("c2", index=1))
    assert store.count_calls(session_id="s1") == 2


def test_calls_added_together_commit_together_or_not_at_all(store: Store) -> None:
    store.create_session(make_session())
    image = {"a" * 64: ("image/png", b"png bytes")}
    calls = [make_call(f"c{i}", index=i) for i in range(3)]
    store.add_calls([NewCall(c, images=image) for c in calls])
    assert [c.model_dump() for c in store.list_calls("s1")] == [c.model_dump() for c in calls]
    assert store.count_images() == 1 and store.get_image("a" * 64) is not None

    # One call already recorded: none of the batch is, and the error names the batch.
    with pytest.raises(DuplicateCallError, match="'c3', 'c1'"):
        store.add_calls([NewCall(make_call("c3", index=3)), NewCall(make_call("c1", n=9))])
    assert store.count_calls(session_id="s1") == 3
    assert store.get_call("c3") is None
    store.add_calls([NewCall(make_call("c3", index=3))])  # the connection is still usable
    assert store.count_calls(session_id="s1") == 4


def test_large_request_is_compressed_and_round_trips(store: Store, tmp_path: Path) -> None:
    store.create_session(make_session())
    big = {"messages": [{"role": "user", "content": "x" * (COMPRESS_OVER * 4)}]}
    call = make_call("c1").model_copy(update={"request": big})
    store.add_call(call)
    raw = sqlite3.connect(tmp_path / "store.sqlite").execute(
        "SELECT request, response FROM calls").fetchone()
    assert isinstance(raw[0], bytes) and len(raw[0]) < COMPRESS_OVER
    # A standard zstd frame: any zstd reader takes the column as it is.
    assert json.loads(zstandard.ZstdDecompressor().decompress(raw[0])) == big
    assert isinstance(raw[1], str)  # small: plain JSON text
    assert store.list_calls("s1")[0].request == big


def test_zlib_bodies_of_earlier_stores_still_read_back(store: Store, tmp_path: Path) -> None:
    store.create_session(make_session())
    big = {"messages": [{"role": "user", "content": "y" * (COMPRESS_OVER * 2)}]}
    store.add_call(make_call("c1").model_copy(update={"request": big, "response": big}))
    # What stores written before zstd hold: zlib streams (default and level-1 headers).
    db = sqlite3.connect(tmp_path / "store.sqlite")
    text = json.dumps(big).encode()
    db.execute("UPDATE calls SET request = ?, response = ?",
               (zlib.compress(text, 1), zlib.compress(text)))
    db.commit()
    got = store.list_calls("s1")[0]
    assert got.request == big and got.response == big


def test_list_calls_ordered_by_index_and_next_index(store: Store) -> None:
    store.create_session(make_session())
    assert store.next_call_index("s1") == 0
    for cid, index in (("x", 2), ("y", 0), ("z", 1)):
        store.add_call(make_call(cid, index=index))
    assert [c.id for c in store.list_calls("s1")] == ["y", "z", "x"]
    assert store.next_call_index("s1") == 3
    assigned = store.add_call(make_call("w", index=0), assign_index=True)
    assert assigned.index == 3 and store.get_call("w").index == 3


def test_first_call_skips_failed_calls(store: Store) -> None:
    store.create_session(make_session())
    assert store.first_call("s1") is None
    store.add_call(make_call("f", index=0).model_copy(update={"status": "failed"}))
    store.add_call(make_call("b", index=2))
    store.add_call(make_call("a", index=1))
    assert store.first_call("s1").id == "a"
    assert store.first_call("s1", status=None).id == "f"


def test_iter_and_count_calls_filter_by_run_and_session(store: Store) -> None:
    store.create_session(make_session("s1", "run1"))
    store.create_session(make_session("s2", "run1"))
    store.create_session(make_session("s3", "run2"))
    for sid in ("s3", "s2", "s1"):
        for i in range(3):
            store.add_call(make_call(f"{sid}-{i}", session_id=sid, index=2 - i))
    failed = make_call("s1-f", session_id="s1", index=3).model_copy(update={"status": "failed"})
    store.add_call(failed)
    ids = [c.id for c in store.iter_calls(run_id="run1")]
    assert ids == ["s1-2", "s1-1", "s1-0", "s1-f", "s2-2", "s2-1", "s2-0"]
    assert [c.id for c in store.iter_calls(session_id="s3")] == ["s3-2", "s3-1", "s3-0"]
    assert store.count_calls() == 10
    assert store.count_calls(run_id="run1") == 7
    assert store.count_calls(run_id="run1", status="ok") == 6
    assert store.count_calls(session_id="s2") == 3
    assert sum(1 for _ in store.iter_calls()) == 10


def test_iter_calls_streams_past_one_batch_while_writing(store: Store) -> None:
    store.create_session(make_session())
    for i in range(600):
        store.add_call(make_call(f"c{i:04d}", index=i))
    seen = 0
    for _call in store.iter_calls(session_id="s1"):
        if seen == 10:
            # a writer is not blocked by an open reader (WAL); the reader keeps its snapshot
            store.add_call(make_call("late", index=10_000))
        seen += 1
    assert seen in (600, 601)
    assert store.count_calls() == 601


def test_results_round_trip(store: Store) -> None:
    store.create_session(make_session("s1", "run1", 1.0))
    store.create_session(make_session("s2", "run1", 2.0))
    store.create_session(make_session("s3", "run2", 3.0))
    assert store.get_result("s1") is None
    result = RolloutResult(rollout_id="r-s1", task_id="t1", status="ok",
                           reward=RewardResult(score=1.0, passed=True), final_answer="42")
    store.save_result("s1", result)
    store.save_result("s2", RolloutResult(rollout_id="r-s2", status="timeout"))
    store.save_result("s2", RolloutResult(rollout_id="r-s2", status="infra_error"))  # replaces
    store.save_result("s3", RolloutResult(rollout_id="r-s3"))
    assert store.get_result("s1") == result
    pairs = store.list_results("run1")
    assert [(s.id, r.status) for s, r in pairs] == [("s1", "ok"), ("s2", "infra_error")]
    assert len(store.list_results()) == 3


def test_reopen_sees_committed_data(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    with Store(path) as s:
        s.create_session(make_session())
        s.add_call(make_call("c1"))
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        assert [c.id for c in s.list_calls("s1")] == ["c1"]
        mode = s._conn().execute("PRAGMA journal_mode").fetchone()[0]
        assert mode == "wal"


def _old_store(path: Path, version: int, *new_columns: str) -> Path:
    """A store with one call (c1, session s1) as schema `version` wrote it: without the
    calls columns that later versions added."""
    with Store(path) as store:
        store.create_session(Session(id="s1", token="t1", created_at=1.0))
        store.add_call(make_call("c1"))
    conn = sqlite3.connect(path)
    conn.executescript("".join(f"ALTER TABLE calls DROP COLUMN {c}; " for c in new_columns)
                       + f"UPDATE schema_version SET version = {version};")
    conn.close()
    return path


def test_a_schema_2_store_gains_the_calls_http_status(tmp_path: Path) -> None:
    path = _old_store(tmp_path / "old.sqlite", 2, "http_status", "prompt_base", "request_base")
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        old = store.get_call("c1")
        assert old is not None and old.http_status is None and old.prompt_ids == [100, 101, 102, 103, 104]
        store.add_call(make_call("c2", index=1).model_copy(update={"status": "failed",
                                                                    "http_status": 400}))
        assert [c.http_status for c in store.list_calls("s1")] == [None, 400]


def test_a_schema_3_store_gains_prompt_bases_and_reads_its_whole_prompts(
        tmp_path: Path) -> None:
    path = _old_store(tmp_path / "old.sqlite", 3, "prompt_base", "request_base")
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        first = store.get_call("c1")
        assert first is not None and first.prompt_ids == [100, 101, 102, 103, 104]
        # A call recorded after the migration may be stored against one from before it.
        whole = first.prompt_ids + first.completion_ids + [9, 9]
        store.add_calls([NewCall(make_call("c2", index=1).model_copy(
            update={"prompt_ids": whole}), prompt_blob=ids_to_blob([9, 9]), prompt_base="c1")])
        assert [c.prompt_ids for c in store.list_calls("s1")] == [first.prompt_ids, whole]
        assert _stored_prompt(store, "c2") == ("c1", [9, 9])


def _stored_prompt(store: Store, call_id: str) -> tuple[str | None, list[int]]:
    """A call's row as stored: its prompt base and the ids its prompt_ids blob holds."""
    base, blob = store._conn().execute(
        "SELECT prompt_base, prompt_ids FROM calls WHERE id = ?", (call_id,)).fetchone()
    return base, blob_to_ids(blob)


def _extending(call: Call, base: Call, new_ids: list[int], cid: str, index: int) -> NewCall:
    """A call whose prompt is `base`'s prompt + completion + `new_ids`, stored against it."""
    whole = base.prompt_ids + base.completion_ids + new_ids
    return NewCall(call.model_copy(update={"id": cid, "index": index, "prompt_ids": whole}),
                   prompt_blob=ids_to_blob(new_ids), prompt_base=base.id)


@pytest.mark.parametrize("bases_kept", [16, 0])  # 0: every base read from the file
def test_prompts_stored_against_earlier_calls_read_back_whole_from_every_reader(
        store: Store, bases_kept: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "_BASES_KEPT", bases_kept)
    store.create_session(make_session("s1"))
    store.create_session(make_session("s2"))
    c0 = make_call("c0", n=3)
    store.add_calls([NewCall(c0)])
    n1 = _extending(c0, c0, [201, 202], "c1", 1)
    store.add_calls([n1])
    failed = make_call("f2", index=2).model_copy(update={"status": "failed"})
    # A base earlier in the same transaction, then a chain of three.
    n3 = _extending(c0, n1.call, [203], "c3", 3)
    n4 = _extending(c0, n3.call, [], "c4", 4)  # nothing new: an empty delta
    n5 = _extending(c0, n4.call, [205, 206, 207], "c5", 5)
    store.add_calls([NewCall(failed), n3, n4, n5])
    other = make_call("o0", session_id="s2", n=2)
    store.add_calls([NewCall(other), _extending(other, other, [301], "o1", 1)])
    whole = {c.id: c.prompt_ids for c in (c0, n1.call, failed, n3.call, n4.call, n5.call)}
    whole["o0"] = other.prompt_ids
    whole["o1"] = other.prompt_ids + other.completion_ids + [301]
    assert len(whole["c5"]) == 3 + 4 * 4 + 2 + 1 + 0 + 3  # 4 completions before c5

    # Stored as deltas: only the new ids are in each row.
    assert _stored_prompt(store, "c0") == (None, c0.prompt_ids)
    assert _stored_prompt(store, "c1") == ("c0", [201, 202])
    assert _stored_prompt(store, "c4") == ("c3", [])
    assert _stored_prompt(store, "c5") == ("c4", [205, 206, 207])
    assert _stored_prompt(store, "o1") == ("o0", [301])

    # Every reader rebuilds them: alone (the chain read from the file), in order, filtered.
    for cid, ids in whole.items():
        call = store.get_call(cid)
        assert call is not None and call.prompt_ids == ids, cid
    assert {c.id: c.prompt_ids for c in store.list_calls("s1")} == {
        k: v for k, v in whole.items() if not k.startswith("o")}
    assert {c.id: c.prompt_ids for c in store.iter_calls()} == whole
    assert {c.id: c.prompt_ids for c in store.iter_calls(status="failed")} == {"f2": whole["f2"]}
    assert [c.prompt_ids for c in store.iter_calls(session_id="s2")] == [whole["o0"], whole["o1"]]
    first = store.first_call("s2")
    assert first is not None and first.prompt_ids == whole["o0"]


@pytest.mark.parametrize("base", ["nope", "f1", "o0", "c2"])
def test_a_base_that_is_not_an_earlier_ok_call_of_the_session_is_not_referenced(
        store: Store, base: str) -> None:
    store.create_session(make_session("s1"))
    store.create_session(make_session("s2"))
    c0 = make_call("c0")
    store.add_calls([NewCall(c0), NewCall(make_call("f1", index=1).model_copy(
        update={"status": "failed"})), NewCall(make_call("o0", session_id="s2"))])
    # Unknown, failed, another session's, or the call itself (a later call's id): whole.
    whole = c0.prompt_ids + c0.completion_ids + [5]
    call = make_call("c2", index=2).model_copy(update={"prompt_ids": whole})
    store.add_calls([NewCall(call, prompt_blob=ids_to_blob([5]), prompt_base=base)])
    assert _stored_prompt(store, "c2") == (None, whole)
    got = store.get_call("c2")
    assert got is not None and got.prompt_ids == whole


def test_a_base_the_store_no_longer_remembers_writing_is_looked_up_in_the_file(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "_OK_CALLS_KEPT", 2)
    store.create_session(make_session("s1"))
    calls = [make_call(f"c{i}", index=i) for i in range(5)]
    store.add_calls([NewCall(c) for c in calls])
    assert list(store._ok_calls) == ["c3", "c4"]  # the latest kept, the rest forgotten
    store.add_calls([_extending(calls[0], calls[0], [9], "d0", 5),
                     _extending(calls[4], calls[4], [9], "d4", 6)])
    assert _stored_prompt(store, "d0") == ("c0", [9]) and _stored_prompt(store, "d4") == ("c4", [9])
    got = store.get_call("d0")
    assert got is not None and got.prompt_ids == calls[0].prompt_ids + calls[0].completion_ids + [9]


def test_a_prompt_whose_base_is_gone_or_circular_is_a_clear_error(store: Store) -> None:
    store.create_session(make_session("s1"))
    c0 = make_call("c0")
    n1 = _extending(c0, c0, [1], "c1", 1)
    n2 = _extending(c0, n1.call, [2], "c2", 2)
    store.add_calls([NewCall(c0), n1, n2])
    conn = store._conn()
    conn.execute("UPDATE calls SET prompt_base = 'c2' WHERE id = 'c0'")  # c0 -> c2 -> c1 -> c0
    with pytest.raises(StoreError, match="call 'c2': .*in a cycle .*edited or damaged"):
        store.get_call("c2")
    conn.execute("DELETE FROM calls WHERE id = 'c0'")
    with pytest.raises(StoreError, match="call 'c1': .*against call 'c0', which this store "
                                         "does not hold"):
        list(store.iter_calls())


def _body(turns: int, filler: str) -> tuple[dict[str, object], bytes]:
    """A chat request after `turns` tool turns, as a value and as the bytes a harness sent
    (its tools and options after the messages, as harnesses order them)."""
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a coding agent. " + filler},
        {"role": "user", "content": "Count the lines of every file."}]
    for i in range(turns):
        messages += [{"role": "assistant", "content": "", "tool_calls": [
                         {"id": f"c{i}", "type": "function",
                          "function": {"name": "shell", "arguments": f'{{"cmd":"wc -l f{i}"}}'}}]},
                     {"role": "tool", "tool_call_id": f"c{i}",
                      "content": "\n".join(f"{i * 7 + j} f{i}/{j}.py" for j in range(40))}]
    value = {"model": "policy", "messages": messages,
             "tools": [{"type": "function", "function": {"name": "shell"}}], "stream": False}
    return value, json.dumps(value).encode()


def _turns(session: str, n: int, filler: str = "Check your work. " * 200) -> list[NewCall]:
    """A session's `n` calls, each body the one before with a tool turn added, and each
    prompt stored against the call before (as the gateway records a branch)."""
    calls: list[NewCall] = []
    for i in range(n):
        value, raw = _body(i, filler)
        call = make_call(f"{session}-{i}", session_id=session, index=i).model_copy(
            update={"request": value})
        if calls:
            new = _extending(call, calls[-1].call, [9], call.id, i)
            calls.append(new._replace(request_json=raw))
        else:
            calls.append(NewCall(call, request_json=raw))
    return calls


def _stored_request(store: Store, call_id: str) -> tuple[str | None, str | bytes]:
    return store._conn().execute(
        "SELECT request_base, request FROM calls WHERE id = ?", (call_id,)).fetchone()


@pytest.mark.parametrize("bases_kept", [16, 0])  # 0: every base read from the file
def test_requests_stored_against_earlier_calls_read_back_whole_from_every_reader(
        tmp_path: Path, bases_kept: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "_BASES_KEPT", bases_kept)
    monkeypatch.setattr(store_module, "_REQUEST_CHAIN_MAX", 4)
    path = tmp_path / "store.sqlite"
    with Store(path) as store:
        store.create_session(make_session("s1"))
        store.create_session(make_session("s2"))
        one, two = _turns("s1", 12, filler="x" * 5000), _turns("s2", 3)
        store.add_calls(one[:3])  # bases within one transaction
        for new in one[3:]:
            store.add_calls([new])  # ... and committed before
        store.add_calls(two)
        sent = {c.call.id: json.loads(c.request_json or b"") for c in one + two}
        # The store holds one text per branch it extends: the latest call's.
        assert list(store._request_texts) == ["s1-11", "s2-2"]
        assert store._request_text_bytes == sum(len(t) for t, _ in store._request_texts.values())
        bases = {cid: _stored_request(store, cid)[0] for cid in sent}
        # Each body against the one before; after 4 in a row, one whole, so a read follows
        # at most 4.
        assert [bases[c.call.id] for c in one] == [
            None, "s1-0", "s1-1", "s1-2", "s1-3", None, "s1-5", "s1-6", "s1-7", "s1-8", None,
            "s1-10"]
        assert [bases[c.call.id] for c in two] == [None, "s2-0", "s2-1"]
        # A delta row holds what its call added: a few hundred bytes, whatever the body's size.
        _, delta = _stored_request(store, "s1-9")
        assert isinstance(delta, bytes) and len(delta) < 600 < len(one[9].request_json or b"")
        assert store.get_call("s1-9").request == sent["s1-9"]  # type: ignore[union-attr]
        assert {c.id: c.request for c in store.list_calls("s1")} == {
            k: v for k, v in sent.items() if k.startswith("s1")}
        assert {c.id: c.request for c in store.iter_calls()} == sent
        assert [c.request for c in store.iter_calls(session_id="s2")] == [
            sent["s2-0"], sent["s2-1"], sent["s2-2"]]
    with Store(path) as reopened:  # nothing held in memory: every chain read from the file
        for cid, value in sent.items():
            got = reopened.get_call(cid)
            assert got is not None and got.request == value, cid


def test_a_request_is_stored_whole_where_its_base_is_not_held_or_shares_too_little(
        store: Store) -> None:
    store.create_session(make_session("s1"))
    calls = _turns("s1", 4)
    store.add_calls(calls[:2])
    assert _stored_request(store, "s1-1")[0] == "s1-0"
    # A base this store did not write (another process, or before a restart): whole.
    store._request_texts.clear()
    store.add_calls([calls[2]])
    assert _stored_request(store, "s1-2")[0] is None
    # A body that shares less than half with its base's: whole.
    other = {"model": "policy", "messages": [{"role": "user", "content": "z" * 3000}]}
    changed = calls[3]._replace(call=calls[3].call.model_copy(update={"request": other}),
                                request_json=json.dumps(other).encode())
    store.add_calls([changed])
    assert _stored_request(store, "s1-3")[0] is None
    assert [c.request for c in store.list_calls("s1")] == [
        *(c.call.request for c in calls[:3]), other]
    # A body small enough to be stored as plain text still is.
    store.create_session(make_session("s2"))
    small = _turns("s2", 2, filler="")
    assert len(small[1].request_json or b"") <= COMPRESS_OVER
    store.add_calls(small)
    assert _stored_request(store, "s2-1") == (None, (small[1].request_json or b"").decode())


def test_a_request_whose_prompt_base_is_refused_and_non_utf8_bodies_are_stored_whole(
        store: Store) -> None:
    store.create_session(make_session("s1"))
    first, second, third = _turns("s1", 3)
    # Sent as UTF-16: stored as the value encoded again; a later body may be stored against
    # that text, and reads back all the same.
    first = first._replace(request_json=json.dumps(first.call.request).encode("utf-16"))
    refused = second._replace(prompt_base="nope")
    store.add_calls([first, refused, third])
    assert [_stored_request(store, c)[0] for c in ("s1-0", "s1-1", "s1-2")] == [
        None, None, "s1-1"]
    assert [c.request for c in store.list_calls("s1")] == [
        c.call.request for c in (first, second, third)]


def test_calls_not_committed_are_never_request_bases(store: Store) -> None:
    store.create_session(make_session("s1"))
    store.add_call(make_call("dup", index=9))
    a, b = _turns("s1", 2)
    with pytest.raises(DuplicateCallError):
        store.add_calls([a, NewCall(make_call("dup", index=5))])
    assert "s1-0" not in store._request_texts and store.get_call("s1-0") is None
    store.add_calls([b])  # its base was never written: stored whole, prompt and request
    assert _stored_request(store, "s1-1")[0] is None and _stored_prompt(store, "s1-1")[0] is None
    got = store.get_call("s1-1")
    assert got is not None and got.request == b.call.request


def test_a_request_whose_base_is_gone_or_damaged_is_a_clear_error(store: Store) -> None:
    store.create_session(make_session("s1"))
    store.add_calls(_turns("s1", 3))
    conn = store._conn()
    conn.execute("UPDATE calls SET request = ? WHERE id = 's1-2'",
                 (zstandard.ZstdCompressor().compress(b"\xff" * 12),))
    with pytest.raises(StoreError, match="call 's1-2': its request cannot be rebuilt .*damaged"):
        store.get_call("s1-2")
    conn.execute("DELETE FROM calls WHERE id = 's1-0'")
    with pytest.raises(StoreError, match="call 's1-1': its request is stored against call "
                                         "'s1-0', which this store does not hold"):
        store.get_call("s1-1")


def test_a_schema_4_store_gains_request_bases_and_reads_its_whole_requests(
        tmp_path: Path) -> None:
    path = _old_store(tmp_path / "old.sqlite", 4, "request_base")
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        first = store.get_call("c1")
        assert first is not None and first.request == make_call("c1").request
        calls = _turns("s1", 2)
        store.add_calls(calls)
        assert _stored_request(store, "s1-1")[0] == "s1-0"
        assert [c.request for c in store.list_calls("s1")][1:] == [c.call.request for c in calls]


def test_newer_schema_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer openforge"):
        Store(path)


def test_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.sqlite"
    path.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not an openforge store"):
        Store(path)
    with pytest.raises(StoreError, match="directory"):
        Store(tmp_path)


def test_closed_store_refuses_use(tmp_path: Path) -> None:
    s = Store(tmp_path / "store.sqlite")
    s.close()
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.get_session("x")


def test_many_threads_write_concurrently(store: Store) -> None:
    store.create_session(make_session())
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(25):
                store.add_call(make_call(f"t{t}-{i}"), assign_index=True)
                store.list_calls("s1")
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    calls = store.list_calls("s1")
    assert len(calls) == 200
    assert [c.index for c in calls] == list(range(200))  # assign_index never raced


def _process_writer(path: str, worker: int, n: int) -> None:
    s = Store(path)
    for i in range(n):
        s.add_call(make_call(f"p{worker}-{i}"), assign_index=True)
    s.close()


def test_several_processes_write_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"  # does not exist yet: the processes race to create it
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_process_writer, args=(str(path), w, 30)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    with Store(path) as s:
        calls = s.list_calls("s1")
        assert len(calls) == 90
        assert sorted(c.index for c in calls) == list(range(90))
