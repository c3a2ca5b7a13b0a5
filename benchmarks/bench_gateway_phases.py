"""Where a recorded call's CPU goes inside the gateway, phase by phase, without HTTP.

`bench_gateway.py` measures the whole process (HTTP server, engine client, event loop);
this one replays the same load (S sessions x T turns, tool-call or user-message turns,
growing histories) straight into the gateway's call pipeline (`CallResponse`), in this
process, with an engine that answers at once with the ids `bench_gateway.py`'s stand-in
sends, and a real store. Each pipeline step is timed where it is called (a wrapper around
the function), so the printed microseconds per call add up to the pipeline's own CPU:

    prepare           decode the body, parse the dialect, render the prompt
      load_json         the body's JSON
      dialect_parse     wire request -> canonical conversation (history memo included)
      render            branch lookup, size checks, the renderer's bridge
        bridge            `renderers`' bridge_to_next_turn (tokenizer included)
          tokenizer         encoding the texts the call adds (the backend's own time)
    parse_completion  completion ids -> assistant message (`renderers`' parse_response)
    commit            extend the session's branch
    record            build the Call row and queue it for the store
    store write       `CallRecorder.flush`: the SQLite transaction (compression of large
                      bodies included); one call per transaction here, as the replay sends
                      one call at a time (under concurrent load, the calls that finish in
                      one turn of the event loop share one)

It begins with a session's first call (the whole conversation rendered) in a process that
has tokenized nothing yet, then the same opening in three more sessions, which the model's
`first_renders` serve (`--system-words` makes that opening as long as a harness's).

Then the tool-call load runs once with its sessions spread over three ways in: the
pipeline alone, the gateway's ASGI app (`create_app`: authentication, the body, then the
pipeline) and the Starlette app behind it (router and middlewares too), interleaved call
by call; the difference to the pipeline alone is what each way adds.

After each profile it reads every call back from the store, stops if a prompt reads back
other than the engine was sent or a request body other than the client sent, and prints
how many bytes of prompt ids the store holds against the whole prompts' (a prompt that
extends its branch is stored as its new ids), and of request bodies against those sent
(a body above 4096 bytes is stored as a delta against the body of the call it extends).

After each profile it also tokenizes the texts the load gave `encode_long` again, in the same
order, with the `tokenizers` library alone and with the ASCII path in front of it
(`gateway/ascii_path.py`, a fresh one), and prints both and their ratio (the ids must be
the same: it stops if they are not).

The numbers move with the machine like every timing here; compare phases of one run.

    python benchmarks/bench_gateway_phases.py [--quick] [--sessions N] [--turns N]
                                              [--system-words N]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import itertools
import json
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import bench_gateway as bench  # noqa: E402

import openforge.gateway.branches as branches  # noqa: E402
import openforge.gateway.pipeline as pipeline  # noqa: E402
from openforge.config import GatewayConfig  # noqa: E402
from openforge.gateway.app import create_app  # noqa: E402
from openforge.gateway.ascii_path import AsciiPath  # noqa: E402
from openforge.gateway.dialects.chat import ChatDialect  # noqa: E402
from openforge.gateway.engines.base import Engine, GenerateRequest, GenerateResult  # noqa: E402
from openforge.gateway.first_renders import FirstRenders  # noqa: E402
from openforge.gateway.model import FastTokenizer, load_model_bundle  # noqa: E402
from openforge.gateway.recorder import CallRecorder  # noqa: E402
from openforge.gateway.state import GatewayState  # noqa: E402
from openforge.store import Store  # noqa: E402

SPENT: collections.Counter[str] = collections.Counter()
LONG_TEXTS: list[str] = []  # what the load gave FastTokenizer.encode_long, in order


def timed(owner: Any, name: str, label: str) -> None:
    """Add the wall time of every call of `owner.name` (one thread here: its CPU) to SPENT."""
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[label] += time.perf_counter() - t0

    setattr(owner, name, wrapper)


PHASES = [
    (pipeline.CallResponse, "_prepare", "prepare"),
    (pipeline, "load_json", "  load_json"),
    (ChatDialect, "parse", "  dialect_parse"),
    (branches.SessionTokens, "render", "  render"),
    (branches, "bridge", "    bridge"),
    (FastTokenizer, "encode_long", "      tokenizer (long texts)"),
    (branches.SessionTokens, "parse", "parse_completion"),
    (branches.SessionTokens, "commit", "commit"),
    (pipeline.CallResponse, "_record", "record"),
    (CallRecorder, "flush", "store write"),
]


def record_long_texts() -> None:
    fn = FastTokenizer.encode_long

    @functools.wraps(fn)
    def wrapper(self: FastTokenizer, text: str) -> list[int]:
        LONG_TEXTS.append(text)
        return fn(self, text)

    FastTokenizer.encode_long = wrapper  # type: ignore[method-assign]


def compare_tokenizers(calls: int) -> None:
    """The load's long texts again: the library alone, then the ASCII path in front of it."""
    backend = load_model_bundle("tiny").tokenizer._backend
    fast = AsciiPath.build(backend)
    if not LONG_TEXTS:
        print("  (the load gave the tokenizer no long texts)")
        return
    if fast is None:
        print("  (no ASCII path for this tokenizer)")
        return
    t0 = time.process_time()
    library = [backend.encode_batch_fast([t], add_special_tokens=False)[0].ids
               for t in LONG_TEXTS]
    t1 = time.process_time()
    mine = [fast.encode(t) for t in LONG_TEXTS]
    t2 = time.process_time()
    taken = sum(ids is not None for ids in mine)
    if any(ids is not None and ids != lib for ids, lib in zip(mine, library, strict=True)):
        sys.exit("the ASCII path gave other ids than the library: a bug")
    print(f"  the same {len(LONG_TEXTS)} texts again ({taken} ASCII-path texts, same ids): "
          f"library {1e6 * (t1 - t0) / calls:.1f} us per call, ASCII path "
          f"{1e6 * (t2 - t1) / calls:.1f} (with the library for the rest: "
          f"{(t2 - t1) / (t1 - t0):.2f} of it)")


class InstantEngine(Engine):
    """Answers every call at once with one fixed completion (ids and logprobs), and keeps
    the prompt ids each call was sent (by call id: the request id is the call's)."""

    name = "instant"

    def __init__(self, model: Any, completion: list[int]) -> None:
        super().__init__(model=model)
        self.completion = completion
        self.prompts: dict[str, Sequence[int]] = {}

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        # A copy (one memcpy of the gateway's int32 array), so that ids changed after they
        # were sent would show in the check against the store.
        self.prompts[request.request_id] = request.prompt_ids[:]
        ids = list(self.completion)
        return GenerateResult.model_construct(completion_ids=ids, logprobs=[-0.5] * len(ids),
                                              finish_reason="stop", completion=None,
                                              weight_version="bench")

    async def close(self) -> None:
        pass


WAYS = ("pipeline alone", "GatewayApp", "its Starlette app")
"""How a call can enter the gateway in process: `CallResponse` itself, the gateway's ASGI
app (`create_app`), or the Starlette app behind it (router and middlewares included)."""


def stored_calls(store: Store, sent: dict[str, Sequence[int]],
                 bodies: dict[str, list[bytes]]) -> str:
    """What the store holds of the prompts the engine was sent and of the request bodies
    (it stops if a prompt or a body reads back other than sent): its bytes of each against
    those of the whole prompts and bodies."""
    for call in store.iter_calls(run_id="bench"):  # a session's calls in order: its bodies'
        if call.prompt_ids != list(sent[call.id]):  # the gateway sends an int32 array
            sys.exit(f"call {call.id}: the store reads back another prompt than sent: a bug")
        if call.request != json.loads(bodies[call.session_id][call.index]):
            sys.exit(f"call {call.id}: the store reads back another request than sent: a bug")
    with sqlite3.connect(store.path) as db:
        # An openforge before store schema 5 (an A/B base) has no request_base column.
        columns = {row[1] for row in db.execute("PRAGMA table_info(calls)")}
        against = "request_base IS NOT NULL" if "request_base" in columns else "0"
        calls, deltas, stored, request_deltas, requests = db.execute(
            "SELECT COUNT(*), SUM(prompt_base IS NOT NULL), SUM(LENGTH(prompt_ids)), "
            f"SUM({against}), SUM(LENGTH(CAST(request AS BLOB))) FROM calls "
            "WHERE session_id IN (SELECT id FROM sessions WHERE run_id = 'bench')"
        ).fetchone()
    whole = 4 * sum(len(ids) for ids in sent.values())
    sent_bytes = sum(len(b) for b in itertools.chain(*bodies.values()))
    return (f"prompt ids stored: {stored / 1e6:.2f} MB for {whole / 1e6:.2f} MB of whole prompts "
            f"({stored / whole:.3f} of it; {deltas} of {calls} calls stored against an earlier "
            f"call, every prompt read back as sent)\n  request bodies stored: "
            f"{requests / 1e6:.2f} MB for {sent_bytes / 1e6:.2f} MB sent ({requests / sent_bytes:.3f} "
            f"of it; {request_deltas} of {calls} stored against an earlier call's, every body "
            "read back as sent)")


async def replay(profile: str, sessions: int, turns: int, ways: tuple[str, ...] = WAYS[:1]
                 ) -> tuple[dict[str, float], int, float, str]:
    """CPU seconds per call of each way in, the calls, and calls per sample.

    Session k's call of turn t enters by `ways[(k + t) % len(ways)]`, so every way sees
    the same mix of sessions and turns, interleaved call by call (the machine's speed
    moves alike for all of them).
    """
    bundle = load_model_bundle("tiny")  # one per process: its tokenizer's caches too
    # Each replay starts as a fresh gateway process would: no text tokenized yet.
    bundle.tokenizer._shared.clear()
    completion = bench.reply_ids(bundle)[profile]
    with TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "phases.sqlite")
        engine = InstantEngine(bundle, completion)
        state = GatewayState(GatewayConfig(), store, engine, bundle)
        app = create_app(state)
        entries = {"GatewayApp": app, "its Starlette app": app.starlette}
        opened = [state.sessions.open(run_id="bench", task_id=f"t{k}") for k in range(sessions)]
        tokens = [session.token for session in opened]
        bodies: dict[str, list[bytes]] = {session.id: [] for session in opened}
        histories = [bench.first_messages(k) for k in range(sessions)]
        cpu = dict.fromkeys(ways, 0.0)
        counts = dict.fromkeys(ways, 0)
        if len(ways) > 1:
            # One uncounted call through each way first, on sessions of its own: the first
            # call through a code path pays for warming it up.
            for i, way in enumerate(ways):
                warm = state.sessions.open(run_id="warm", task_id=f"warm{i}")
                body = json.dumps({"model": "policy", "messages": bench.first_messages(
                    sessions + i), "tools": [bench.SHELL], "max_tokens": 128}).encode()
                await _enter(way, state, warm.token, body, entries)
        for turn in range(turns):
            for k, messages in enumerate(histories):
                body = json.dumps({"model": "policy", "messages": messages,
                                   "tools": [bench.SHELL], "max_tokens": 128}).encode()
                way = ways[(k + turn) % len(ways)]
                t0 = time.process_time()
                sent = await _enter(way, state, tokens[k], body, entries)
                cpu[way] += time.process_time() - t0
                bodies[opened[k].id].append(body)
                counts[way] += 1
                answer = json.loads(sent[-1]["body"])["choices"][0]["message"]
                bench.next_turn(messages, answer, profile, turn, k)
        merge = bench.merge_rate(store.path)
        state.close()
        stored = stored_calls(store, engine.prompts, bodies)
        store.close()
    return ({way: cpu[way] / max(counts[way], 1) for way in ways}, sessions * turns, merge,
            stored)


async def _enter(way: str, state: GatewayState, token: str, body: bytes,
                 entries: dict[str, Any]) -> list[dict[str, Any]]:
    """One chat call through `way`; the ASGI messages it sent."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope, receive = _request(token, body)
    if way == WAYS[0]:
        live = state.sessions.by_token(token)  # looked up as the app does, for a fair sum
        assert live is not None
        await pipeline.CallResponse(state, live, "chat", body, retry_count=0)(
            scope, receive, send)
    else:
        await entries[way](scope, receive, send)
    return sent


def _request(token: str, body: bytes) -> tuple[dict[str, Any], Any]:
    """The ASGI scope and receive of one chat call, as uvicorn would hand them over."""
    path = f"/s/{token}/v1/chat/completions"
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"", "client": ("127.0.0.1", 50000),
             "server": ("127.0.0.1", 8000),
             "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                         (b"authorization", f"Bearer {token}".encode()),
                         (b"content-length", str(len(body)).encode())]}
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await asyncio.sleep(3600)  # the client never leaves
        return {"type": "http.disconnect"}

    return scope, receive


def first_calls(sessions: int) -> None:
    """A session's first render, in a process that has tokenized nothing yet, then in
    sessions that open with the same messages (the model's `first_renders` keep it)."""
    from openforge.gateway.conversation import ChatRequest, Message, Tool

    bundle = load_model_bundle("tiny")
    bundle.tokenizer._shared.clear()
    bundle.first_renders = FirstRenders()
    request = ChatRequest(
        messages=[Message(**m) for m in bench.first_messages(0)],
        tools=[Tool(name="shell", parameters=bench.SHELL["function"]["parameters"])])
    spent = []
    for _ in range(max(sessions, 2)):
        t0 = time.process_time()
        ids = branches.SessionTokens(bundle).render(request).prompt_ids
        spent.append(time.process_time() - t0)
    print(f"\na session's first call ({len(ids)} prompt tokens): {1e6 * spent[0]:.0f} us "
          f"rendered in a fresh process; {1e6 * min(spent[1:]):.0f}-{1e6 * max(spent[1:]):.0f} "
          f"us in {len(spent) - 1} sessions that open alike")


def compare_ways(sessions: int, turns: int) -> None:
    """The tool-call load once more, its sessions spread over the three ways in."""
    spent, calls, _, _ = asyncio.run(replay("tools", sessions, turns, WAYS))
    print(f"\nthe way in (tool-call turns, {calls} calls, a third through each way): "
          "us CPU per call, and beyond the pipeline alone")
    for way in WAYS:
        print(f"  {way:<30} {1e6 * spent[way]:8.1f} {1e6 * (spent[way] - spent[WAYS[0]]):8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="8 sessions x 5 turns (CI smoke run)")
    parser.add_argument("--system-words", type=int, default=0, metavar="N",
                        help="make every session's system prompt N words longer")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.turns = 8, 5
    bench.use_system_words(args.system_words)
    print(f"bench_gateway_phases: {args.sessions} sessions x {args.turns} turns, system prompt "
          f"+{args.system_words} words, in process, no HTTP; microseconds per call")
    first_calls(4)
    compare_ways(args.sessions, args.turns)  # before the phase timers wrap the pipeline
    record_long_texts()
    for owner, name, label in PHASES:
        timed(owner, name, label)
    for profile in ("tools", "users"):
        SPENT.clear()
        LONG_TEXTS.clear()
        spent, calls, merge, stored = asyncio.run(replay(profile, args.sessions, args.turns))
        print(f"\n{profile}: the pipeline {1e6 * spent[WAYS[0]]:.0f} us CPU per call "
              f"({calls} calls, {merge:.1f} calls per sample)")
        for _, _, label in PHASES:
            print(f"  {label:<30} {1e6 * SPENT[label] / calls:8.1f}")
        print(f"  {stored}")
        compare_tokenizers(calls)


if __name__ == "__main__":
    main()
