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
    record            build the Call row and write it
      store.add_call    the SQLite insert (compression of large bodies included)

After each profile it tokenizes the texts the load gave `encode_long` again, in the same
order, with the `tokenizers` library alone and with the ASCII path in front of it
(`gateway/ascii_path.py`, a fresh one), and prints both and their ratio (the ids must be
the same: it stops if they are not).

The numbers move with the machine like every timing here; compare phases of one run.

    python benchmarks/bench_gateway_phases.py [--quick] [--sessions N] [--turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import json
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import bench_gateway as bench  # noqa: E402

import openforge.gateway.branches as branches  # noqa: E402
import openforge.gateway.pipeline as pipeline  # noqa: E402
from openforge.config import GatewayConfig  # noqa: E402
from openforge.gateway.ascii_path import AsciiPath  # noqa: E402
from openforge.gateway.dialects.chat import ChatDialect  # noqa: E402
from openforge.gateway.engines.base import Engine, GenerateRequest, GenerateResult  # noqa: E402
from openforge.gateway.model import FastTokenizer, load_model_bundle  # noqa: E402
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
    (Store, "add_call", "  store.add_call"),
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
    """Answers every call at once with one fixed completion (ids and logprobs)."""

    name = "instant"

    def __init__(self, model: Any, completion: list[int]) -> None:
        super().__init__(model=model)
        self.completion = completion

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        ids = list(self.completion)
        return GenerateResult.model_construct(completion_ids=ids, logprobs=[-0.5] * len(ids),
                                              finish_reason="stop", completion=None,
                                              weight_version="bench")

    async def close(self) -> None:
        pass


async def replay(profile: str, sessions: int, turns: int) -> tuple[float, int, float]:
    """CPU seconds of the pipeline for the whole load, the calls, and calls per sample."""
    bundle = load_model_bundle("tiny")
    completion = bench.reply_ids(bundle)[profile]
    with TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "phases.sqlite")
        state = GatewayState(GatewayConfig(), store, InstantEngine(bundle, completion), bundle)
        lives = []
        for k in range(sessions):
            opened = state.sessions.open(run_id="bench", task_id=f"t{k}")
            lives.append(state.sessions.by_token(opened.token))
        histories = [bench.first_messages(k) for k in range(sessions)]

        async def receive() -> dict[str, Any]:
            await asyncio.sleep(3600)  # the client never leaves
            return {"type": "http.disconnect"}

        cpu = 0.0
        for turn in range(turns):
            for k, messages in enumerate(histories):
                body = json.dumps({"model": "policy", "messages": messages,
                                   "tools": [bench.SHELL], "max_tokens": 128}).encode()
                sent: list[dict[str, Any]] = []

                async def send(message: dict[str, Any], sent: list[dict[str, Any]] = sent
                               ) -> None:
                    sent.append(message)

                t0 = time.process_time()
                await pipeline.CallResponse(state, lives[k], "chat", body, retry_count=0)(
                    {"type": "http"}, receive, send)
                cpu += time.process_time() - t0
                answer = json.loads(sent[-1]["body"])["choices"][0]["message"]
                bench.next_turn(messages, answer, profile, turn, k)
        merge = bench.merge_rate(store.path)
        state.close()
        store.close()
    return cpu, sessions * turns, merge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="8 sessions x 5 turns (CI smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.turns = 8, 5
    record_long_texts()
    for owner, name, label in PHASES:
        timed(owner, name, label)
    print(f"bench_gateway_phases: {args.sessions} sessions x {args.turns} turns, in process, "
          "no HTTP; microseconds per call")
    for profile in ("tools", "users"):
        SPENT.clear()
        LONG_TEXTS.clear()
        cpu, calls, merge = asyncio.run(replay(profile, args.sessions, args.turns))
        print(f"\n{profile}: the pipeline {1e6 * cpu / calls:.0f} us CPU per call "
              f"({calls} calls, {merge:.1f} calls per sample)")
        for _, _, label in PHASES:
            print(f"  {label:<30} {1e6 * SPENT[label] / calls:8.1f}")
        compare_tokenizers(calls)


if __name__ == "__main__":
    main()
