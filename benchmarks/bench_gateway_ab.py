"""Two gateways side by side under one load: this tree's and another checkout's.

On a shared machine one run of `bench_gateway.py` moves by a tenth or more between runs,
more than most changes to the gateway are worth. Here the gateway of another checkout (A,
e.g. a `git worktree` of the commit before a change) and this tree's (B) serve at the
same time, against one engine stand-in, under one load whose sessions alternate between
them call by call: both see the same machine, so the ratio of their CPU per call holds
still where each alone does not. Each round opens fresh sessions on both and drives
S sessions x T tool-call turns (S/2 on each gateway); it prints both gateways' CPU ms per
recorded call and B/A, then the median and range of B/A over the rounds.

    git worktree add /tmp/base HEAD~1
    python benchmarks/bench_gateway_ab.py /tmp/base [--rounds 8] [--workers 2] [--system-words N]
                                               [--group K]

With `--workers-b M`, B runs M workers where A runs `--workers`: against this checkout
itself (`bench_gateway_ab.py . --workers-b 2`) that compares one worker with two, each
gateway serving S/2 sessions (`bench_gateway.py`'s `workers` phase measures this, and
two workers carrying twice one worker's sessions).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import bench_gateway as bench  # noqa: E402

HERE = Path(__file__).resolve().parent.parent


def start(src: Path, store: Path, standin_url: str, profile: str,
          workers: int) -> tuple[Any, str]:
    """A gateway whose `openforge` is imported from `src`."""
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(src)
    try:
        return bench.start_gateway(store, standin_url, profile, workers=workers)
    finally:
        if previous is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = previous


async def run(args: argparse.Namespace) -> None:
    other = Path(args.other).resolve() / "src"
    if not (other / "openforge").is_dir():
        raise SystemExit(f"{args.other} is not an openforge checkout (no src/openforge)")
    half = args.sessions // 2
    workers_b = args.workers_b or args.workers
    print(f"bench_gateway_ab: A = {other.parent} ({args.workers} worker(s)), B = {HERE} "
          f"({workers_b}); {2 * half} sessions x {args.turns} {args.profile} turns per "
          f"round, system prompt +{args.system_words} words, {args.group} per task, load average {os.getloadavg()[0]:.1f} at start")
    standin, standin_url = bench.start_helper("--standin", "--latency-ms",
                                              str(args.latency_ms))
    ratios: list[float] = []  # NaN: a round too short to measure (`bench.ratio`)
    with TemporaryDirectory() as tmp:
        a, a_url = start(other, Path(tmp) / "a.sqlite", standin_url, args.profile, args.workers)
        b, b_url = start(HERE / "src", Path(tmp) / "b.sqlite", standin_url, args.profile,
                         workers_b)
        try:
            for r in range(args.rounds):
                m = await bench.side_by_side(a, a_url, half, b, b_url, half, args.turns,
                                             args.profile, b_first=r % 2 == 1)
                ratios.append(bench.ratio(m.b_ms, m.a_ms))
                print(f"round {r + 1}: A {m.a_ms:.3f} ms/call, B {m.b_ms:.3f} ms/call, "
                      f"B/A {ratios[-1]:.3f}", flush=True)
        finally:
            bench.stop(a)
            bench.stop(b)
            bench.stop(standin)
    measured = [r for r in ratios if not math.isnan(r)]
    if not measured:
        print("B/A: not measured: each round's CPU was below the CPU clock's 10 ms ticks on "
              "one side; run more --sessions or --turns")
        return
    print(f"B/A: median {statistics.median(measured):.3f}, range {min(measured):.3f}-"
          f"{max(measured):.3f} over {len(measured)} of {len(ratios)} rounds (CPU ms per "
          "recorded call; below 1: B costs less)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", help="the other checkout (its src/openforge is A)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=64, help="both gateways together")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1, help="of each gateway")
    parser.add_argument("--workers-b", type=int, help="of B, when not --workers")
    parser.add_argument("--profile", choices=("tools", "users"), default="tools")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--system-words", type=int, default=0, metavar="N",
                        help="make every session's system prompt N words longer")
    parser.add_argument("--group", type=int, default=1, metavar="K",
                        help="K sessions per task: they open with the same messages")
    args = parser.parse_args()
    if args.rounds < 1 or args.sessions < 2:
        parser.error("--rounds must be at least 1 and --sessions at least 2")
    bench.use_system_words(args.system_words)
    bench.use_group(args.group)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
