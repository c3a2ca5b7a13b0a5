"""Group commit (`gateway/recorder.py`): the calls recorded in one turn of the event loop
share one transaction; a call that cannot be written costs no other call its row."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from openforge.gateway.recorder import CallRecorder
from openforge.store import NewCall, Store, blob_to_ids, ids_to_blob
from openforge.types import Call, SamplingParams, Session


def call(cid: str, index: int) -> Call:
    return Call(id=cid, session_id="s1", index=index, dialect="chat",
                request={"messages": [{"role": "user", "content": cid}]},
                prompt_ids=[1, 2, 3], completion_ids=[4], logprobs=[-0.5])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "store.sqlite")
    s.create_session(Session(id="s1", token="tok", run_id="run", rollout_id="r", task_id="t",
                             model="policy", sampling=SamplingParams()))
    yield s
    s.close()


class Transactions:
    """The sizes of the `add_calls` transactions a store was asked for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        original = Store.add_calls

        def counted(store: Store, calls: Any) -> None:
            self.sizes.append(len(calls))
            original(store, calls)

        monkeypatch.setattr(Store, "add_calls", counted)


async def test_calls_recorded_in_one_loop_turn_share_one_transaction(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    transactions = Transactions(monkeypatch)
    recorder = CallRecorder(store)
    failures: list[Exception] = []
    waits = [recorder.record(NewCall(call(f"c{i}", i)), failures.append) for i in range(5)]
    assert store.count_calls(session_id="s1") == 0  # queued, not written yet
    for wait in waits:
        await wait
    assert transactions.sizes == [5]
    assert [c.id for c in store.list_calls("s1")] == [f"c{i}" for i in range(5)]
    # The next turn's call gets a transaction of its own, committed as soon.
    await recorder.record(NewCall(call("c5", 5)), failures.append)
    assert transactions.sizes == [5, 1] and not failures


async def test_a_call_that_cannot_be_written_costs_no_other_call_its_row(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    store.add_call(call("taken", 0))
    transactions = Transactions(monkeypatch)
    recorder = CallRecorder(store)
    failures: list[tuple[str, Exception]] = []
    waits = [recorder.record(NewCall(c), lambda exc, c=c: failures.append((c.id, exc)))
             for c in (call("a", 1), call("taken", 2), call("b", 3))]
    for wait in waits:
        await wait
    # The shared transaction failed as a whole; then each call alone.
    assert transactions.sizes == [3, 1, 1, 1]
    assert [c.id for c in store.list_calls("s1")] == ["taken", "a", "b"]
    assert [(cid, type(exc).__name__) for cid, exc in failures] == [
        ("taken", "DuplicateCallError")]


async def test_a_call_stored_against_one_that_could_not_be_written_is_stored_whole(
        store: Store) -> None:
    recorder = CallRecorder(store)
    unwritable = call("a", 0).model_copy(update={"logprobs": ["not a float"]})
    after = call("b", 1).model_copy(update={"prompt_ids": [1, 2, 3, 4, 5]})
    failures: list[str] = []
    waits = [recorder.record(NewCall(unwritable), lambda exc: failures.append("a")),
             recorder.record(NewCall(after, prompt_blob=ids_to_blob([5]), prompt_base="a"),
                             lambda exc: failures.append("b"))]
    for wait in waits:
        await wait
    assert failures == ["a"]
    # "a" has no row, so "b" was not stored against it: its row holds its whole prompt.
    base, blob = store._conn().execute(
        "SELECT prompt_base, prompt_ids FROM calls WHERE id = 'b'").fetchone()
    assert (base, blob_to_ids(blob)) == (None, [1, 2, 3, 4, 5])
    assert [(c.id, c.prompt_ids) for c in store.list_calls("s1")] == [("b", [1, 2, 3, 4, 5])]


async def test_a_failing_failure_handler_is_logged_and_the_others_still_finish(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    store.add_call(call("taken", 0))
    recorder = CallRecorder(store)

    def broken(exc: Exception) -> None:
        raise RuntimeError("the failed row could not be written either")

    waits = [recorder.record(NewCall(call("taken", 1)), broken),
             recorder.record(NewCall(call("a", 2)), broken)]
    for wait in waits:
        await wait
    assert [c.id for c in store.list_calls("s1")] == ["taken", "a"]
    assert "call taken: not recorded" in caplog.text


async def test_flush_writes_what_is_queued_at_once(store: Store) -> None:
    """At shutdown (`GatewayState.close`) the queue is written before the store closes."""
    recorder = CallRecorder(store)
    wait = recorder.record(NewCall(call("c0", 0)), pytest.fail)
    recorder.flush()
    assert wait.done() and store.count_calls(session_id="s1") == 1
    await wait
    assert store.count_calls(session_id="s1") == 1
