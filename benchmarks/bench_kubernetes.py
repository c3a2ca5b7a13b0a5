"""Kubernetes executor at scale: rollouts/minute and API calls per rollout.

    python benchmarks/bench_kubernetes.py [--rollouts 200] [--concurrency 32] [--quick]

Runs N rollouts through the real gateway (sessions opened in process, results POSTed by
each Pod to `/s/<token>/result` and read back from the store) on the Kubernetes API server
+ kubelet stand-in of the test suite (`tests/k8s_standin`): every Pod is a real
`python -m openforge.rollout` process. Prints the rate, the API calls per rollout (client
side, by verb, and as the server counted them), the most Pods alive at once, and what was
left behind (must be 0 Pods, 0 processes). `--quick` is 40 rollouts at concurrency 8.
Timing figures depend on the machine: they are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the stand-in is test infrastructure

from k8s_standin import StandIn, python_command, standin_processes  # noqa: E402

from openforge import plugins  # noqa: E402
from openforge.config import EngineConfig, GatewayConfig  # noqa: E402
from openforge.environment import Environment  # noqa: E402
from openforge.executors.kubernetes import KubernetesExecutor  # noqa: E402
from openforge.gateway.model import load_model_bundle  # noqa: E402
from openforge.gateway.server import Gateway  # noqa: E402
from openforge.harness import Command, Harness, HarnessContext  # noqa: E402
from openforge.store import Store  # noqa: E402
from openforge.types import RewardResult, RolloutSpec, Task  # noqa: E402


class EmptyHarness(Harness):
    """A harness process that exits at once: the figure is openforge's own overhead."""

    def command(self, ctx: HarnessContext) -> Command:
        return Command(argv=["/bin/true"])


class EmptyEnv(Environment):
    """One task, nothing to prepare, always passes."""

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        yield Task(id="empty", prompt="nothing")

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        return RewardResult(score=1.0, passed=True)


async def bench(n: int, concurrency: int, workdir: Path) -> dict[str, Any]:
    bundle = await asyncio.to_thread(load_model_bundle, "tiny")
    engine = plugins.create("engine", "scripted", model=bundle, replies=[{"content": "ok"}])
    store = Store(workdir / "store.sqlite")
    gateway = Gateway(GatewayConfig(), EngineConfig(name="scripted"), store, engine=engine,
                      bundle=bundle)
    await gateway.start()
    image_env = {"PYTHONPATH": f"{ROOT / 'benchmarks'}:{ROOT / 'tests'}"}
    with StandIn(image_env=image_env) as k8s:
        executor = KubernetesExecutor(
            image="openforge/rollout:bench", kubeconfig=str(k8s.kubeconfig),
            command=python_command(), max_concurrency=concurrency, create_qps=100,
            create_burst=concurrency, requests={"cpu": "100m"})
        sessions = []
        specs = []
        for i in range(n):
            rollout_id = f"empty.{i}"
            session = gateway.open_session("bench", rollout_id, "empty")
            sessions.append(session)
            specs.append(RolloutSpec(run_id="bench", rollout_id=rollout_id,
                                     task=Task(id="empty", prompt="nothing"),
                                     harness="bench_kubernetes:EmptyHarness",
                                     environment="bench_kubernetes:EmptyEnv", reward="checker",
                                     gateway_url=gateway.url, session_token=session.token,
                                     timeout_s=120))
        started = time.monotonic()
        try:
            results = await asyncio.gather(*[executor.run(s) for s in specs])
        finally:
            await executor.close()
        elapsed = time.monotonic() - started
        await asyncio.sleep(0.5)
        stored = sum(store.get_result(s.id) is not None for s in sessions)
        figures = {
            "rollouts": n, "concurrency": concurrency, "elapsed_s": elapsed,
            "ok": sum(r.status == "ok" for r in results),
            "results_in_gateway_store": stored,
            "client_calls": dict(executor.api_calls),
            "server_calls": k8s.calls(),
            "max_live_pods": k8s.max_live_pods,
            "pods_left": len(k8s.pods()),
            "processes_left": len(standin_processes()),
        }
    await gateway.stop()
    store.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="40 rollouts at concurrency 8")
    args, _ = parser.parse_known_args()  # nox passes the same posargs to every benchmark
    n, concurrency = (40, 8) if args.quick else (args.rollouts, args.concurrency)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-k8s-") as tmp:
        f = asyncio.run(bench(n, concurrency, Path(tmp)))
    total = sum(f["client_calls"].values())
    print(f"kubernetes executor (stand-in API server + kubelet, real processes): "
          f"{f['rollouts']} rollouts at concurrency {f['concurrency']}")
    print(f"  rollouts/minute        {60 * f['rollouts'] / f['elapsed_s']:.0f} "
          f"({f['elapsed_s']:.1f} s)")
    print(f"  ok                     {f['ok']}/{f['rollouts']}; results in the gateway store: "
          f"{f['results_in_gateway_store']}/{f['rollouts']}")
    print(f"  API calls per rollout  {total / f['rollouts']:.2f} (client: "
          + ", ".join(f"{k} {v}" for k, v in sorted(f["client_calls"].items())) + ")")
    print("  server saw             " + ", ".join(
        f"{k} {v}" for k, v in sorted(f["server_calls"].items())))
    print(f"  max Pods alive at once {f['max_live_pods']}")
    print(f"  left behind            {f['pods_left']} Pods, {f['processes_left']} processes")
    if f["pods_left"] or f["processes_left"] or f["results_in_gateway_store"] != f["rollouts"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
