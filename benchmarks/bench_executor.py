"""Local executor overhead: spawn-to-result latency of an empty rollout, and rollouts/minute.

    python benchmarks/bench_executor.py [--quick] [--rollouts-per-level 16]
                                        [--sandbox auto|bwrap|namespaces|none]

An empty rollout runs the whole supervisor path (`python -m openforge.rollout`: plugins,
workspace, the agent's sandbox around a harness process that does nothing, the check that no
process of it is left, final state, reward, the signed result line) so the figure is what
openforge adds on top of the harness itself, per sandbox mode. Where the executor applies a
cgroup per rollout (`max_processes`), a line compares rollouts with and without it; the next
line does the same for the watch of each rollout's folder (`disk_max`, `files_max`), and the
one after for the `cpu` cgroup beside the `pids` one.

The last line is the CPU a neighbour keeps while an agent runs busy processes (`cpu share`):
one process (the gateway, a runner, another rollout's check) spins for SPIN_S seconds while
HOG_PROCS processes spin beside it, once in the runner's own cgroup (as without a `cpu`
cgroup per rollout) and once in a rollout's `cpu` cgroup (`RolloutCgroup(cpu_share=True)`,
the executor's default); printed: the neighbour's CPU seconds per second in each, and their
ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from openforge.environment import Environment
from openforge.harness import Command, Harness, HarnessContext
from openforge.types import RewardResult, RolloutSpec, Task


class EmptyHarness(Harness):
    """A harness process that exits at once."""

    def command(self, ctx: HarnessContext) -> Command:
        return Command(argv=["/bin/true"])


class EmptyEnv(Environment):
    """One task, nothing to prepare, always passes."""

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        yield Task(id="empty", prompt="nothing")

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        return RewardResult(score=1.0, passed=True)


async def _level(executor: Any, url: str, concurrency: int, n: int) -> dict[str, Any]:
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    statuses: list[str] = []

    async def one(i: int) -> None:
        spec = RolloutSpec(run_id="bench", rollout_id=f"c{concurrency}-{i}", task=Task(id="empty", prompt="-"),
                           harness="bench_executor:EmptyHarness", environment="bench_executor:EmptyEnv",
                           reward="checker", gateway_url=url, session_token=f"t{i}", timeout_s=60)
        async with sem:
            t0 = time.perf_counter()
            result = await executor.run(spec)
            latencies.append(time.perf_counter() - t0)
            statuses.append(result.status)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - t0
    return {"concurrency": concurrency, "rollouts": n, "ok": statuses.count("ok"),
            "p50_s": round(statistics.median(latencies), 3),
            "max_s": round(max(latencies), 3),
            "rollouts_per_min": round(n / wall * 60, 1)}


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts-per-level", type=int, default=16)
    parser.add_argument("--sandbox", default="auto", choices=["auto", "bwrap", "namespaces", "none"])
    parser.add_argument("--quick", action="store_true",
                        help="4 rollouts at concurrency 1 and 4 (CI smoke run)")
    args = parser.parse_args(argv)
    levels = (1, 4) if args.quick else (1, 4, 16)
    if args.quick:
        args.rollouts_per_level = min(args.rollouts_per_level, 4)
    # The rollout subprocess imports this module by name to build the empty plugins.
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [here, os.environ.get("PYTHONPATH", "")] if p)
    sys.path.insert(0, here)
    from openforge.executors.local import LocalExecutor

    url = "http://127.0.0.1:9"  # nothing is sent to the gateway: the result is the last line
    executor = LocalExecutor(sandbox=args.sandbox)
    print(executor.describe_sandbox())
    print(f"cpu cores: {os.cpu_count()}")
    await _level(executor, url, 1, 2)  # warm the page cache
    for concurrency in levels:
        n = max(args.rollouts_per_level, concurrency)
        print(json.dumps(await _level(executor, url, concurrency, n)))
    if executor.limits:
        # What the rollout's cgroups cost (made, joined, emptied, removed).
        bare = LocalExecutor(sandbox=args.sandbox, max_processes=None)
        bare.cpu_share = False  # no option turns it off: it costs nothing else
        await _compare("cgroup", executor, bare, url, args.rollouts_per_level)
    if executor.disk_limits:
        # What the watch of the rollout's folder costs (`du` every disk_check_s).
        await _compare("disk watch", executor,
                       LocalExecutor(sandbox=args.sandbox, disk_max=None, files_max=None),
                       url, args.rollouts_per_level)
    if executor.cpu_share:
        # What the `cpu` cgroup adds beside the `pids` one.
        pids_only = LocalExecutor(sandbox=args.sandbox)
        pids_only.cpu_share = False
        await _compare("cpu cgroup", executor, pids_only, url, args.rollouts_per_level)
        cpu_share()


HOG_PROCS, SPIN_S = 8, 3.0
# Spins for SPIN_S seconds of wall time, then prints the CPU seconds it got.
_SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n" \
    "print(time.process_time())"


def cpu_share() -> None:
    """The neighbour's CPU per second beside HOG_PROCS busy processes, without and with a
    `cpu` cgroup around them (see the module's docstring)."""
    from openforge.sandbox.cgroups import RolloutCgroup, joiner, unavailable

    why = unavailable(["cpu"])
    if why is not None:
        print(json.dumps({"cpu share": f"not measured: {why}"}))
        return
    got = {}
    for way in ("without", "with"):
        group = RolloutCgroup.create("bench-cpu", cpu_share=True) if way == "with" else None
        join = joiner(group.procs_files) if group is not None else None
        try:
            hogs = [subprocess.Popen([sys.executable, "-c", _SPIN.format(s=SPIN_S + 1)],
                                     stdout=subprocess.DEVNULL, preexec_fn=join)
                    for _ in range(HOG_PROCS)]
            time.sleep(0.5)  # all of them busy before the neighbour starts
            neighbour = subprocess.run([sys.executable, "-c", _SPIN.format(s=SPIN_S)],
                                       capture_output=True, text=True, check=True)
            got[way] = float(neighbour.stdout) / SPIN_S
            for hog in hogs:
                hog.wait()
        finally:
            if group is not None:
                group.close()
    print(json.dumps({"cpu share": {
        "busy processes beside it": HOG_PROCS, "cores": os.cpu_count(),
        "neighbour_cpu_per_s_without": round(got["without"], 3),
        "neighbour_cpu_per_s_with": round(got["with"], 3),
        "ratio": round(got["with"] / max(got["without"], 1e-3), 2)}}))


async def _compare(label: str, executor: Any, bare: Any, url: str, rollouts: int) -> None:
    """One rollout with `executor` and one with `bare` (the same without `label`), in turn,
    so that both see the same machine; prints both medians and their ratio."""
    with_, without = [], []
    for _ in range(rollouts):
        with_.append((await _level(executor, url, 1, 1))["p50_s"])
        without.append((await _level(bare, url, 1, 1))["p50_s"])
    a, b = statistics.median(with_), statistics.median(without)
    print(json.dumps({label: {"rollouts": len(with_), "p50_with_s": a, "p50_without_s": b,
                              "ratio": round(a / b, 3)}}))

if __name__ == "__main__":
    asyncio.run(main())
