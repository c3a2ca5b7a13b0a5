"""Kubernetes executor at scale: API calls per rollout, watches, executor CPU and memory.

    python benchmarks/bench_kubernetes.py [--simulate | --real] [--rollouts N]
                                          [--concurrency C] [--quick]

Two runs on the Kubernetes API server + kubelet stand-in of the test suite
(`tests/k8s_standin`), which serves from a process of its own so that the figures below are
the executor's alone:

- `--simulate` (default: 5,000 rollouts at concurrency 2,000): the stand-in's simulated
  kubelet runs no processes; each Pod goes through its real phases on a schedule (the
  supervisor ready after 1 s, the agent 60 s, the verifier's result from the attempt's
  Secret), so that 2,000 are alive at once. This is the scale a real cluster run reaches
  and this machine cannot host.
- `--real` (default: 24 rollouts at concurrency 6): every container is a real process (the
  supervisor, the agent running an empty harness, the verifier).

Prints API calls per rollout (client side, by verb) and as the server counted them, the most
watches open at once (one per run on Pods, one on Nodes), the most Pods alive at once, the
executor's CPU seconds per rollout and its peak RSS, and what was left. With no flag both
run; `--quick` is 500 at 200 simulated (agents 5 s) and 8 at 4 real. Timings depend on the
machine: they are printed, never asserted; the process exits 1 if a rollout failed,
anything was left behind, or the simulated run made more than 3 API calls per rollout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the stand-in is test infrastructure

from openforge.types import RewardResult, RolloutResult, RolloutSpec, Task  # noqa: E402

# How long a simulated rollout's supervisor prepares and its agent runs (real rollouts take
# minutes; these keep the run short while the event rate stays that of a busy cluster).
PREPARE_S = float(os.environ.get("OPENFORGE_BENCH_PREPARE_S", "1.0"))
AGENT_S = float(os.environ.get("OPENFORGE_BENCH_AGENT_S", "60.0"))


def sim_container(pod: dict[str, Any], container: str, volumes: dict[str, dict[str, bytes]]) -> Any:
    """How each container of a simulated Pod behaves (runs in the stand-in's process)."""
    from k8s_standin import SimContainer

    from openforge.executors.k8s_result import compact_message

    if container == "supervisor":
        return SimContainer(run_s=None, ready_after_s=PREPARE_S)  # a sidecar: until stopped
    if container == "agent":
        return SimContainer(run_s=AGENT_S)  # read from the environment the stand-in got
    spec = RolloutSpec.model_validate_json(volumes["spec"]["spec.json"])
    result = RolloutResult(rollout_id=spec.rollout_id, task_id=spec.task.id,
                           attempt=spec.attempt, status="ok", duration_s=AGENT_S,
                           reward=RewardResult(score=1.0, passed=True))
    return SimContainer(run_s=0.05, message=compact_message(result))


def _specs(n: int, run_id: str, harness: str) -> list[RolloutSpec]:
    return [RolloutSpec(run_id=run_id, rollout_id=f"empty.{i}.0.bench", attempt=0,
                        task=Task(id="empty", prompt="nothing"), harness=harness,
                        environment="bench_executor:EmptyEnv", reward="checker",
                        gateway_url="http://127.0.0.1:9", session_token=f"tok-{i}",
                        timeout_s=600) for i in range(n)]


async def _drive(kubeconfig: Path, specs: list[RolloutSpec], concurrency: int,
                 python: str) -> dict[str, Any]:
    from openforge.executors.kubernetes import KubernetesExecutor

    executor = KubernetesExecutor(
        image="openforge/rollout:bench", kubeconfig=str(kubeconfig), python=python,
        max_concurrency=concurrency, create_qps=200, create_burst=200,
        requests={"cpu": "10m", "memory": "16Mi"}, supervisor_requests={"cpu": "10m"},
        termination_grace_s=1, resync_s=30)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = usage.ru_utime + usage.ru_stime
    rss_before = usage.ru_maxrss
    started = time.monotonic()
    try:
        results = await asyncio.gather(*[executor.run(s) for s in specs])
    finally:
        await executor.close()
    elapsed = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"elapsed_s": elapsed, "cpu_s": usage.ru_utime + usage.ru_stime - cpu_before,
            "rss_before_mb": rss_before / 1024, "rss_peak_mb": usage.ru_maxrss / 1024,
            "ok": sum(r.status == "ok" for r in results),
            "errors": sorted({r.error or "" for r in results if r.status != "ok"})[:3],
            "client_calls": dict(executor.api_calls), "stats": dict(executor.stats)}


def bench(n: int, concurrency: int, simulate: bool, agent_s: float = AGENT_S) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-k8s-") as tmp:
        kubeconfig, stats = Path(tmp) / "kubeconfig", Path(tmp) / "stats.json"
        env = {**os.environ, "OPENFORGE_BENCH_AGENT_S": str(agent_s), "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "benchmarks"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
        argv = [sys.executable, "-m", "k8s_standin", "--kubeconfig", str(kubeconfig),
                "--stats", str(stats), "--nodes", "4", "--node-cpu", "100000"]
        if simulate:
            argv += ["--simulate", "bench_kubernetes:sim_container"]
        server = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            specs = _specs(n, "bench-sim" if simulate else "bench-real",
                           "bench_executor:EmptyHarness")
            figures = asyncio.run(_drive(kubeconfig, specs, concurrency, sys.executable))
        finally:
            if server.stdin is not None:
                server.stdin.close()
            server.wait(120)
        figures.update(json.loads(stats.read_text()))
    figures.update(rollouts=n, concurrency=concurrency, simulate=simulate, agent_s=agent_s)
    return figures


def report(f: dict[str, Any]) -> bool:
    n = f["rollouts"]
    kind = f"simulated kubelet, no processes, agents run {f['agent_s']:g} s" if f["simulate"] else \
        "real processes: supervisor, agent, verifier per Pod"
    total = sum(f["client_calls"].values())
    watches = {k: v for k, v in f["max_open_watches"].items() if v}
    print(f"kubernetes executor on the stand-in ({kind}): {n} rollouts at concurrency "
          f"{f['concurrency']}")
    print(f"  ok                      {f['ok']}/{n} in {f['elapsed_s']:.1f} s "
          f"({60 * n / f['elapsed_s']:.0f} rollouts/minute)")
    print(f"  API calls per rollout   {total / n:.3f} (client: " + ", ".join(
        f"{k} {v}" for k, v in sorted(f["client_calls"].items())) + ")")
    print("  server saw              " + ", ".join(
        f"{k} {v}" for k, v in sorted(f["calls"].items()) if v))
    print("  most watches open       " + ", ".join(f"{k or '-'}: {v}"
                                                   for k, v in sorted(watches.items())))
    print(f"  most Pods alive at once {f['max_live_pods']}")
    print(f"  executor CPU            {1000 * f['cpu_s'] / n:.2f} ms per rollout "
          f"({f['cpu_s']:.1f} s in all)")
    print(f"  executor peak RSS       {f['rss_peak_mb']:.0f} MB ({f['rss_before_mb']:.0f} MB "
          "before the first rollout)")
    print(f"  left behind             {f['pods_left']} Pods, {f['secrets_left']} Secrets")
    if f["errors"]:
        print("  errors                  " + "; ".join(f["errors"]))
    # At scale the run's shared calls (lists, watches, the owner) are spread thin: <= 3 each.
    scale_ok = total / n <= 3 or not f["simulate"]
    return f["ok"] == n and not f["pods_left"] and not f["secrets_left"] and scale_ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", action="store_true", help="only the simulated run")
    parser.add_argument("--real", action="store_true", help="only the real-process run")
    parser.add_argument("--rollouts", type=int)
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--quick", action="store_true", help="500 at 200 simulated, 8 at 4 real")
    args, _ = parser.parse_known_args()  # nox passes the same posargs to every benchmark
    runs = []
    if not args.real:
        runs.append((True, (500, 200, 5.0) if args.quick else (5000, 2000, AGENT_S)))
    if not args.simulate:
        runs.append((False, (8, 4, 0.0) if args.quick else (24, 6, 0.0)))
    ok = True
    for simulate, (n, concurrency, agent_s) in runs:
        ok &= report(bench(args.rollouts or n, args.concurrency or concurrency, simulate, agent_s))
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
