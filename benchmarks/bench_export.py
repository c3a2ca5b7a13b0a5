"""Benchmark: export a store of N recorded tokens as token-level samples; peak memory and speed.

    python benchmarks/bench_export.py [--quick] [--tokens 1000000] [--turns 10] [--format samples]

Builds a SQLite store of synthetic multi-turn sessions (each call's prompt extends the
previous call's prompt + completion, the way a tool loop grows, and is stored against it
as the gateway stores it, `NewCall.prompt_base`) until the calls hold
`--tokens` recorded tokens (prompt + completion ids summed over calls), then runs
`export_run` in a fresh child process so that its peak memory is measured on its own:
peak RSS (getrusage of the child, imports included), the peak of Arrow's memory pool and,
with `--tracemalloc`, the peak of Python allocations (tracing costs time and RSS itself). Target: peak RSS < 500 MB at 1M tokens.
Exits 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

TARGET_MB = 500.0
QUICK_TOKENS = 100_000


def build_store(path: Path, tokens: int, turns: int, seed: int = 0) -> dict[str, int]:
    """Synthetic sessions until `tokens` recorded tokens; returns counts."""
    from openforge.store import NewCall, Store, ids_to_blob
    from openforge.types import Call, Session

    rng = random.Random(seed)
    recorded = sessions = calls = 0
    store = Store(path)
    while recorded < tokens:
        sid = f"s{sessions:06d}"
        store.create_session(Session(id=sid, token=f"tok-{sid}", run_id="bench",
                                     rollout_id=f"r-{sid}", task_id=f"t{sessions % 50}",
                                     reward=rng.random()))
        prompt = [rng.randrange(151_643) for _ in range(rng.randint(150, 400))]
        base: str | None = None
        added: list[int] = []
        for turn in range(turns):
            n = rng.randint(20, 120)
            completion = [rng.randrange(151_643) for _ in range(n)]
            call = Call.model_construct(
                id=f"{sid}-{turn}", session_id=sid, branch=0, branch_reason=None, index=turn,
                dialect="chat", request={"model": "policy", "messages": [
                    {"role": "user", "content": "synthetic task"}]},
                response={"choices": [{"message": {"role": "assistant", "content": "x" * n}}]},
                prompt_ids=prompt, completion_ids=completion,
                logprobs=[-rng.random() for _ in range(n)], finish_reason="stop", sampling={},
                weight_version="w0", exact_tokens=True, status="ok", error=None,
                body_digest=f"{sid}-{turn}", retry_count=0, images=[], started_at=float(turn),
                finished_at=float(turn))
            # Stored as the gateway stores it: against the previous call, its new ids only.
            store.add_calls([NewCall(call, prompt_base=base, prompt_blob=ids_to_blob(added))
                             if base else NewCall(call)])
            calls += 1
            recorded += len(prompt) + n
            observation = [rng.randrange(151_643) for _ in range(rng.randint(30, 200))]
            prompt = prompt + completion + observation
            base, added = call.id, observation
            if recorded >= tokens:
                break
        sessions += 1
    store.close()
    return {"recorded_tokens": recorded, "sessions": sessions, "calls": calls}


def _export_child(store_path: str, out: str, fmt: str, trace: bool,
                  queue: multiprocessing.Queue) -> None:
    import tracemalloc

    import pyarrow as pa

    from openforge.export import export_run

    baseline_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if trace:
        tracemalloc.start()
    started = time.perf_counter()
    path = export_run(Path(store_path), fmt, Path(out))
    elapsed = time.perf_counter() - started
    _current, py_peak = tracemalloc.get_traced_memory() if trace else (0, 0)
    queue.put({
        "seconds": elapsed,
        **({"tracemalloc_peak_mb": py_peak / 2**20} if trace else {}),
        "arrow_pool_peak_mb": pa.default_memory_pool().max_memory() / 2**20,
        "rss_after_imports_mb": baseline_kb / 1024,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "parquet_mb": path.stat().st_size / 2**20,
    })


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--format", default="samples", choices=["samples", "verl", "sft"])
    parser.add_argument("--tracemalloc", action="store_true",
                        help="also report the peak of Python allocations (slower, adds RSS)")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: temp)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_TOKENS:,} tokens (CI smoke run; the RSS target is for 1M)")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens = min(args.tokens, QUICK_TOKENS)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        store_path = Path(tmp) / "store.sqlite"
        started = time.perf_counter()
        counts = build_store(store_path, args.tokens, args.turns)
        build_s = time.perf_counter() - started
        ctx = multiprocessing.get_context("spawn")
        queue: multiprocessing.Queue = ctx.Queue()
        child = ctx.Process(target=_export_child,
                            args=(str(store_path), str(Path(tmp) / "out"), args.format,
                                  args.tracemalloc, queue))
        child.start()
        stats = queue.get()
        child.join()
        if child.exitcode != 0:
            print(f"export child failed with exit code {child.exitcode}", file=sys.stderr)
            return 2
        store_mb = store_path.stat().st_size / 2**20
    report = {
        **counts, "format": args.format, "store_mb": round(store_mb, 1),
        "build_seconds": round(build_s, 2),
        **{k: round(v, 2) for k, v in stats.items()},
        "recorded_tokens_per_s": round(counts["recorded_tokens"] / stats["seconds"]),
        "target_peak_rss_mb": TARGET_MB,
    }
    print(json.dumps(report, indent=2))
    ok = stats["peak_rss_mb"] < TARGET_MB
    print(f"export of {counts['recorded_tokens']:,} recorded tokens: peak RSS "
          f"{stats['peak_rss_mb']:.0f} MB ({'within' if ok else 'OVER'} the {TARGET_MB:.0f} MB "
          f"target), {report['recorded_tokens_per_s']:,} recorded tokens/s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
