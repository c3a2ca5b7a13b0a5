"""Contract suite of the `kubernetes` executor: real client, real HTTP, real processes.

By default it runs against the in-repo API server + kubelet stand-in (`k8s_standin`). Set
`OPENFORGE_K8S_KUBECONFIG` (and `OPENFORGE_K8S_IMAGE`, `OPENFORGE_K8S_CALLBACK_HOST`, see
docs/scaling-out.md) to run the same scenarios against a real cluster; tests that need the
stand-in's fault injection or process view are skipped there.

Every scenario ends with 0 Pods of its run left, and (stand-in) 0 container processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes_asyncio", reason="pip install 'openforge[kubernetes]'")

from k8s_standin import StandIn, python_command, standin_processes  # noqa: E402

from openforge import plugins  # noqa: E402
from openforge.executors.k8s_api import KubeApi, RateLimiter  # noqa: E402
from openforge.executors.k8s_pods import (  # noqa: E402
    KubernetesOptions,
    build_pod,
    label_value,
    owner_name,
    pod_name,
    run_selector,
)
from openforge.executors.k8s_result import compact_message  # noqa: E402
from openforge.executors.kubernetes import KubernetesExecutor, KubernetesExecutorError  # noqa: E402
from openforge.types import RewardResult, RolloutResult, RolloutSpec, Task  # noqa: E402

TESTS_DIR = Path(__file__).parent
REAL = bool(os.environ.get("OPENFORGE_K8S_KUBECONFIG"))
standin_only = pytest.mark.skipif(REAL, reason="needs the stand-in's fault injection")
BAD_IMAGE = "registry.invalid/openforge/does-not-exist:0"


# -- the cluster under test ----------------------------------------------------------------------


@dataclass
class Cluster:
    kubeconfig: str
    image: str
    command: list[str]
    namespace: str
    callback_host: str
    standin: StandIn | None = None
    context: str | None = None

    def executor(self, **options: Any) -> KubernetesExecutor:
        base: dict[str, Any] = {"image": self.image, "kubeconfig": self.kubeconfig,
                                "context": self.context, "namespace": self.namespace,
                                "command": self.command, "requests": {"cpu": "100m"},
                                "backoff_s": 0.05, "resync_s": 10, "termination_grace_s": 1}
        base.update(options)
        return KubernetesExecutor(**base)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if REAL:
        image = os.environ.get("OPENFORGE_K8S_IMAGE")
        host = os.environ.get("OPENFORGE_K8S_CALLBACK_HOST")
        if not image or not host:
            pytest.fail("OPENFORGE_K8S_KUBECONFIG needs OPENFORGE_K8S_IMAGE (the test image) and "
                        "OPENFORGE_K8S_CALLBACK_HOST (this machine's address as Pods see it)")
        yield Cluster(os.environ["OPENFORGE_K8S_KUBECONFIG"], image,
                      ["python", "-m", "openforge.rollout"],
                      os.environ.get("OPENFORGE_K8S_NAMESPACE", "default"), host,
                      context=os.environ.get("OPENFORGE_K8S_CONTEXT"))
        return
    with StandIn(image_env={"PYTHONPATH": str(TESTS_DIR)}) as standin:
        yield Cluster(str(standin.kubeconfig), "openforge/rollout:test", python_command(),
                      "default", "127.0.0.1", standin)


@dataclass
class Sink:
    """A real HTTP server standing in for the gateway; it records any `POST /s/<token>/result`
    (a route the gateway no longer has), so a test can show that nothing posts one."""

    host: str
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                parts = self.path.strip("/").split("/")
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                ok = len(parts) == 3 and parts[0] == "s" and parts[2] == "result"
                if ok:
                    sink.results[parts[1]] = json.loads(body)
                self.send_response(200 if ok else 404)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        bind = "127.0.0.1" if self.host == "127.0.0.1" else "0.0.0.0"
        self.server = ThreadingHTTPServer((bind, 0), Handler)
        self.url = f"http://{self.host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sink(cluster: Cluster) -> Iterator[Sink]:
    server = Sink(cluster.callback_host)
    yield server
    server.close()


@pytest.fixture
def run_id() -> str:
    return "t-" + uuid.uuid4().hex[:10]


@pytest.fixture
async def kube(cluster: Cluster) -> AsyncIterator[KubeApi]:
    api = await KubeApi.connect(Path(cluster.kubeconfig), cluster.context, cluster.namespace)
    yield api
    await api.close()


def make_spec(sink: Sink, run_id: str, harness: str = "OkHarness", n: int = 0,
              env: str = "executor_plugins:OneTaskEnv", timeout_s: float = 30.0,
              harness_options: dict[str, Any] | None = None) -> RolloutSpec:
    module = "k8s_standin.plugins" if harness == "WaitHarness" else "executor_plugins"
    return RolloutSpec(run_id=run_id, rollout_id=f"only.0.{n}.{uuid.uuid4().hex[:6]}",
                       task=Task(id="only", prompt="write ok.txt"), harness=f"{module}:{harness}",
                       harness_options=harness_options or {}, environment=env, reward="checker",
                       gateway_url=sink.url, session_token=f"tok-{run_id}-{n}",
                       session_id=f"sid-{run_id}-{n}", timeout_s=timeout_s)


async def assert_clean(cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    """0 Pods of the run (and, on the stand-in, 0 container processes) within a few seconds."""
    deadline = time.monotonic() + 15
    while True:
        pods, _ = await kube.list_pods(run_selector(run_id))
        procs = standin_processes() if cluster.standin else []
        if not pods and not procs:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind: pods {[p['metadata']['name'] for p in pods]}, "
                                 f"processes {[p.pid for p in procs]}")
        await asyncio.sleep(0.2)


async def wait_running(kube: KubeApi, run_id: str, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pods, _ = await kube.list_pods(run_selector(run_id))
        if sum(p["status"].get("phase") == "Running" for p in pods) >= count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{count} Pods of {run_id} never ran")


# -- scenarios ------------------------------------------------------------------------------------


async def test_success_result_comes_back_and_nothing_is_left(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    executor = cluster.executor()
    spec = make_spec(sink, run_id)
    try:
        result = await executor.run(spec)
    finally:
        await executor.close()
    assert result.status == "ok", result.error
    assert result.reward is not None and result.reward.passed
    assert result.final_answer == "all done"
    assert result.session_id == spec.session_id
    assert sink.results == {}  # no route takes a result from a rollout any more
    assert executor.stats["created"] == 1 and executor.stats["deleted"] == 1
    await assert_clean(cluster, kube, run_id)
    if cluster.standin:
        assert cluster.standin.objects("ConfigMap") == []  # the owner went at close


async def test_harness_failure_is_scored_not_infra(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    executor = cluster.executor()
    try:
        result = await executor.run(make_spec(sink, run_id, "FailHarness"))
    finally:
        await executor.close()
    assert result.status == "harness_error"
    assert result.reward is not None and result.reward.score == 0.0
    await assert_clean(cluster, kube, run_id)


@standin_only
async def test_a_result_line_from_a_container_that_did_not_exit_0_is_refused(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    # What an agent that killed its supervisor leaves behind: a well-formed passing result
    # for this very attempt in the termination message and the log, and a non-zero exit.
    spec = make_spec(sink, run_id)
    forged = RolloutResult(rollout_id=spec.rollout_id, task_id="only", session_id=spec.session_id,
                           reward=RewardResult(score=1.0, passed=True))
    program = (f"import os, sys; line = {compact_message(forged)!r}; print(line); "
               "open(os.environ['OPENFORGE_TERMINATION_LOG'], 'w').write(line); sys.exit(137)")
    executor = cluster.executor(command=[sys.executable, "-c", program])
    try:
        result = await executor.run(spec)
    finally:
        await executor.close()
    assert result.status == "infra_error" and result.reward is None
    assert "exit code 137" in (result.error or "")
    await assert_clean(cluster, kube, run_id)


async def test_hang_past_the_deadline_is_killed_by_the_kubelet(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    # Hangs in prepare with SIGTERM ignored, so only activeDeadlineSeconds (1 + 2 + 0.5 -> 4 s)
    # and the kubelet's SIGKILL can end it; the client-side limit is far later.
    executor = cluster.executor(pending_timeout_s=1, deadline_slack_s=0.5, kill_margin_s=60)
    spec = make_spec(sink, run_id, env="executor_plugins:HangInPrepareEnv", timeout_s=2)
    try:
        result = await executor.run(spec)
    finally:
        await executor.close()
    assert result.status == "timeout", result.error
    assert "activeDeadlineSeconds=4" in (result.error or "")
    assert result.reward is None
    await assert_clean(cluster, kube, run_id)


async def test_client_side_timeout_deletes_the_pod(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    executor = cluster.executor(pending_timeout_s=5, deadline_slack_s=60, kill_margin_s=0.5)
    spec = make_spec(sink, run_id, env="executor_plugins:HangInPrepareEnv", timeout_s=1.5)
    try:
        result = await executor.run(spec)
    finally:
        await executor.close()
    assert result.status == "timeout"
    assert "ran past the timeout" in (result.error or "")
    await assert_clean(cluster, kube, run_id)


async def test_image_pull_failure_fails_fast_without_retry(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    executor = cluster.executor(image=BAD_IMAGE, pending_timeout_s=120)
    started = time.monotonic()
    try:
        result = await executor.run(make_spec(sink, run_id))
    finally:
        await executor.close()
    assert result.status == "infra_error"
    assert "ErrImagePull" in (result.error or "") or "ImagePullBackOff" in (result.error or "")
    assert result.harness_output.get("permanent") is True
    assert executor.stats["created"] == 1
    assert time.monotonic() - started < 60  # failed on the status, not on the 120 s budget
    await assert_clean(cluster, kube, run_id)


async def test_unschedulable_pod_is_an_infra_error_after_the_pending_budget(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    executor = cluster.executor(requests={"cpu": "100000"}, pending_timeout_s=1.5)
    try:
        result = await executor.run(make_spec(sink, run_id))
    finally:
        await executor.close()
    assert result.status == "infra_error"
    assert "unschedulable" in (result.error or "")
    assert "Insufficient cpu" in (result.error or "")
    await assert_clean(cluster, kube, run_id)


async def test_invalid_spec_fails_fast_with_the_servers_message(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    executor = cluster.executor(requests={"cpu": "lots"})
    try:
        result = await executor.run(make_spec(sink, run_id))
    finally:
        await executor.close()
    assert result.status == "infra_error"
    assert "rejected Pod" in (result.error or "") and "lots" in (result.error or "")
    assert executor.api_calls["create"] == 2  # the owner ConfigMap + one Pod try, no retries
    await assert_clean(cluster, kube, run_id)


async def test_cancel_mid_run_deletes_pods_and_kills_processes(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    executor = cluster.executor()
    specs = [make_spec(sink, run_id, "HangHarness", n=i, timeout_s=120) for i in range(3)]
    tasks = [asyncio.create_task(executor.run(s)) for s in specs]
    try:
        await wait_running(kube, run_id, 3)
        if cluster.standin:
            assert len(standin_processes()) >= 3
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
        await assert_clean(cluster, kube, run_id)  # before close: the `finally` did it
    finally:
        await executor.close()


_ORCHESTRATOR = textwrap.dedent("""
    import asyncio, json, sys
    from openforge.executors.kubernetes import KubernetesExecutor
    from openforge.types import RolloutSpec
    options, specs = json.load(open(sys.argv[1]))
    async def main():
        executor = KubernetesExecutor(**options)
        await asyncio.gather(*[executor.run(RolloutSpec.model_validate(s)) for s in specs])
    asyncio.run(main())
""")


async def test_resume_adopts_running_pods_deletes_strays_creates_the_rest(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str, tmp_path: Path) -> None:
    slow = {"seconds": 4}
    old = [make_spec(sink, run_id, "WaitHarness", n=i, harness_options=slow) for i in range(3)]
    options = {"image": cluster.image, "kubeconfig": cluster.kubeconfig, "context": cluster.context,
               "namespace": cluster.namespace, "command": cluster.command,
               "requests": {"cpu": "100m"}}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([options, [s.model_dump(mode="json") for s in old]]))
    crashed = subprocess.Popen([sys.executable, "-c", _ORCHESTRATOR, str(plan)])
    try:
        await wait_running(kube, run_id, 3)
    finally:
        crashed.send_signal(signal.SIGKILL)  # no finally, no close: a crash
        crashed.wait()
    pods, _ = await kube.list_pods(run_selector(run_id))
    assert len(pods) == 3  # the crash left them running

    # The restarted orchestrator asks again for attempts 0 and 1, and for a new one;
    # attempt 2 is no longer wanted (say, it was recorded before the crash).
    fresh = make_spec(sink, run_id, "WaitHarness", n=3, harness_options={"seconds": 0.5})
    executor = cluster.executor(adopt_window_s=1)
    try:
        results = await asyncio.gather(*[executor.run(s) for s in (old[0], old[1], fresh)])
        assert [r.status for r in results] == ["ok", "ok", "ok"], [r.error for r in results]
        assert executor.stats["adopted"] == 2
        assert executor.stats["created"] == 1
        assert executor.stats["swept"] == 1  # attempt 2's Pod, unclaimed
        assert [r.session_id for r in results] == [s.session_id for s in (old[0], old[1], fresh)]
    finally:
        await executor.close()
    await assert_clean(cluster, kube, run_id)


async def test_owner_deletion_garbage_collects_the_runs_pods(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    executor = cluster.executor()
    tasks = [asyncio.create_task(executor.run(make_spec(sink, run_id, "HangHarness", n=i,
                                                        timeout_s=120))) for i in range(2)]
    try:
        await wait_running(kube, run_id, 2)
        pods, _ = await kube.list_pods(run_selector(run_id))
        refs = pods[0]["metadata"]["ownerReferences"]
        assert refs[0]["kind"] == "ConfigMap" and refs[0]["name"] == owner_name(run_id)
        # What an operator does after an orchestrator died: delete the run's owner.
        await kube.delete_configmap(owner_name(run_id))
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        # Gone mid-run: either seen finishing as it was killed, or seen disappearing.
        assert all(r.status == "infra_error" for r in results), [r.error for r in results]
    finally:
        await executor.close()
    await assert_clean(cluster, kube, run_id)


async def test_leftover_pods_are_swept_at_start(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    stale = build_pod(make_spec(sink, run_id, "HangHarness", n=9, timeout_s=120),
                      KubernetesOptions(image=cluster.image, namespace=cluster.namespace,
                                        command=cluster.command, requests={"cpu": "100m"}), None)
    await kube.create_pod(stale)
    await wait_running(kube, run_id, 1)
    executor = cluster.executor(adopt_window_s=0)
    try:
        result = await executor.run(make_spec(sink, run_id))
        assert result.status == "ok"
        assert executor.stats["swept"] == 1
    finally:
        await executor.close()
    await assert_clean(cluster, kube, run_id)


async def test_a_pod_from_another_spec_under_our_name_is_replaced(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    spec = make_spec(sink, run_id)
    impostor = spec.model_copy(update={"session_token": "someone-else", "session_id": "else",
                                       "harness": "executor_plugins:HangHarness"})
    assert pod_name(impostor) == pod_name(spec)
    await kube.create_pod(build_pod(impostor, KubernetesOptions(
        image=cluster.image, namespace=cluster.namespace, command=cluster.command,
        requests={"cpu": "100m"}), None))
    await wait_running(kube, run_id, 1)
    executor = cluster.executor()
    try:
        result = await executor.run(spec)
    finally:
        await executor.close()
    assert result.status == "ok", result.error
    assert executor.stats["adopted"] == 0 and executor.stats["created"] == 1
    assert result.session_id == spec.session_id  # the result of our spec, not the impostor's
    await assert_clean(cluster, kube, run_id)


async def test_concurrency_is_bounded_and_every_rollout_reports(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    executor = cluster.executor(max_concurrency=6, create_qps=50, create_burst=6)
    specs = [make_spec(sink, run_id, n=i) for i in range(24)]
    if cluster.standin:
        cluster.standin.reset_counters()
    try:
        results = await asyncio.gather(*[executor.run(s) for s in specs])
    finally:
        await executor.close()
    assert [r.status for r in results] == ["ok"] * 24, {r.error for r in results}
    assert [r.session_id for r in results] == [s.session_id for s in specs]
    if cluster.standin:
        assert cluster.standin.max_live_pods <= 6
        calls = cluster.standin.calls()
        assert calls["create pods"] == 24 and calls.get("get pods/log", 0) == 0
        assert calls["watch pods"] <= 3  # one shared watch, not one per Pod
    await assert_clean(cluster, kube, run_id)


@standin_only
async def test_transient_api_errors_are_retried(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    assert cluster.standin is not None
    cluster.standin.inject("create", "pods", 500, count=2)
    cluster.standin.inject("create", "pods", 429, count=1, retry_after=0)
    cluster.standin.inject("list", "pods", 503, count=1)
    cluster.standin.inject("watch", "pods", 410, count=1)
    cluster.standin.inject("delete", "pods", 504, count=1)
    executor = cluster.executor()
    try:
        result = await executor.run(make_spec(sink, run_id))
    finally:
        await executor.close()
    assert result.status == "ok", result.error
    assert executor.api_calls["create"] >= 4  # owner + 3 failed tries + 1 good
    await assert_clean(cluster, kube, run_id)


@standin_only
async def test_watch_history_loss_is_repaired_by_relisting(
        cluster: Cluster, sink: Sink, kube: KubeApi, run_id: str) -> None:
    assert cluster.standin is not None
    executor = cluster.executor(resync_s=120)  # no scheduled list during the test
    cluster.standin.reset_counters()
    try:
        task = asyncio.create_task(executor.run(make_spec(sink, run_id, "WaitHarness",
                                                          harness_options={"seconds": 3})))
        await wait_running(kube, run_id, 1)
        # Other objects move the global resourceVersion past what this run's watch saw...
        await kube.ensure_configmap(f"unrelated-{run_id}", {}, {})
        # ...then history goes: the watcher resumes from a version now forgotten.
        cluster.standin.compact()
        result = await task
    finally:
        await executor.close()
        await kube.delete_configmap(f"unrelated-{run_id}")
    assert result.status == "ok", result.error
    assert cluster.standin.calls().get("watch expired (410)", 0) >= 1
    assert executor.api_calls["list"] >= 2  # the 410 made it list again
    await assert_clean(cluster, kube, run_id)


def test_openforge_run_with_the_kubernetes_executor(cluster: Cluster, tmp_path: Path) -> None:
    """The whole job: runner, gateway (real model calls from the mini harness), Pods, report."""
    import socket

    from openforge.config import EngineConfig, GatewayConfig, RunConfig
    from openforge.runner import read_results, run_from_config

    with socket.socket() as s:  # a fixed port, so the Pods can be told the gateway's URL
        s.bind(("127.0.0.1" if cluster.standin else "0.0.0.0", 0))
        port = s.getsockname()[1]
    run_id = "run-" + uuid.uuid4().hex[:8]
    config = RunConfig(
        engine=EngineConfig(name="scripted", options={"script": str(TESTS_DIR / "demo_solutions.yaml")}),
        gateway=GatewayConfig(host="127.0.0.1" if cluster.standin else "0.0.0.0", port=port),
        runs_dir=tmp_path, run_id=run_id, concurrency=2, limit=2, executor="kubernetes",
        executor_options={"image": cluster.image, "kubeconfig": cluster.kubeconfig,
                          "context": cluster.context, "namespace": cluster.namespace,
                          "command": cluster.command, "requests": {"cpu": "100m"},
                          "gateway_url": f"http://{cluster.callback_host}:{port}"})
    summary = run_from_config(config)
    records = read_results(summary.run_dir)
    assert [r.status for r in records] == ["ok", "ok"], [r.error for r in records]
    assert summary.metrics.pass_at[1] == 1.0

    async def left() -> None:
        api = await KubeApi.connect(Path(cluster.kubeconfig), cluster.context, cluster.namespace)
        try:
            await assert_clean(cluster, api, run_id)
        finally:
            await api.close()

    asyncio.run(left())


# -- units: the Pod, options, helpers (no cluster) -----------------------------------------------


def _spec(**kw: Any) -> RolloutSpec:
    base: dict[str, Any] = {"run_id": "run-1", "rollout_id": "Some Task/with spaces.0.1.abc",
                            "task": Task(id="t", prompt="p"), "harness": "mini",
                            "environment": "demo", "reward": "checker",
                            "gateway_url": "http://127.0.0.1:9", "session_token": "secret"}
    base.update(kw)
    return RolloutSpec(**base)


def test_pod_spec_follows_the_design() -> None:
    options = KubernetesOptions(image="reg/rollout@sha256:" + "a" * 64, runtime_class="gvisor",
                                gateway_url="http://openforge-gateway.openforge.svc:8000",
                                node_selector={"pool": "rollouts"},
                                tolerations=[{"key": "rollouts", "operator": "Exists",
                                              "effect": "NoExecute", "tolerationSeconds": 30}],
                                image_pull_secrets=["regcred"])
    pod = build_pod(_spec(timeout_s=100), options, None).to_dict()
    spec, meta = pod["spec"], pod["metadata"]
    assert len(meta["name"]) <= 63 and meta["name"] == pod_name(_spec())
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "openforge"
    assert meta["labels"]["openforge.io/run-id"] == "run-1"
    assert meta["annotations"]["openforge.io/rollout-id-full"] == "Some Task/with spaces.0.1.abc"
    assert spec["restart_policy"] == "Never"
    assert spec["automount_service_account_token"] is False
    assert spec["enable_service_links"] is False
    assert spec["active_deadline_seconds"] == 600 + 100 + 15
    assert spec["termination_grace_period_seconds"] == 5
    assert spec["runtime_class_name"] == "gvisor"
    assert spec["tolerations"][0]["toleration_seconds"] == 30
    container = spec["containers"][0]
    assert container["termination_message_policy"] == "FallbackToLogsOnError"
    env = {e["name"]: e for e in container["env"]}
    inside = RolloutSpec.model_validate_json(env["OPENFORGE_SPEC"]["value"])
    assert inside.gateway_url == "http://openforge-gateway.openforge.svc:8000"
    assert env["OPENFORGE_POD_NAME"]["value_from"]["field_ref"]["field_path"] == "metadata.name"
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}


def test_names_and_labels_are_valid_and_deterministic() -> None:
    a = pod_name(_spec(rollout_id="x" * 300))
    assert a == pod_name(_spec(rollout_id="x" * 300)) and len(a) <= 63
    assert a != pod_name(_spec(rollout_id="x" * 300, attempt=1))
    assert label_value("ok-value_1.2") == "ok-value_1.2"
    long = label_value("Weird id/with: stuff" * 10)
    assert len(long) <= 63 and long[0].isalnum() and long[-1].isalnum()


def test_oversized_spec_is_refused_with_a_clear_message() -> None:
    spec = _spec(task=Task(id="t", prompt="x" * 200_000))
    with pytest.raises(ValueError, match="keep task data small"):
        build_pod(spec, KubernetesOptions(image="i"), None)


def test_options_errors_are_one_line() -> None:
    with pytest.raises(KubernetesExecutorError, match=r"option image: Field required \(the rollout image"):
        plugins.create("executor", "kubernetes")
    with pytest.raises(KubernetesExecutorError, match="option max_concurrency"):
        KubernetesExecutor(image="i", max_concurrency=0)
    with pytest.raises(KubernetesExecutorError, match="option imag"):
        KubernetesExecutor(image="i", imag="typo")
    with pytest.raises(KubernetesExecutorError, match="kubeconfig: /nonexistent does not exist"):
        KubernetesExecutor(image="i", kubeconfig="/nonexistent")


async def test_unreachable_api_is_an_infra_error(tmp_path: Path, run_id: str) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    executor = KubernetesExecutor(image="i", kubeconfig=str(config), api_retries=0)
    try:
        result = await executor.run(_spec(run_id=run_id))
    finally:
        await executor.close()
    assert result.status == "infra_error" and "Kubernetes API" in (result.error or "")


async def test_rate_limiter_spaces_acquisitions_on_a_fake_clock() -> None:
    now = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    limiter = RateLimiter(rate=2.0, burst=3, clock=lambda: now[0], sleep=sleep)
    for _ in range(5):
        await limiter.acquire()
    assert slept == [0.5, 0.5]  # 3 from the burst, then one every 1/rate seconds


def test_termination_message_fits_in_4k() -> None:
    big = RolloutResult(rollout_id="r", status="ok", final_answer="a" * 10_000,
                        reward=RewardResult(score=1.0, passed=True, details={"x": "y" * 10_000}),
                        harness_output={"stdout": "z" * 100_000})
    message = compact_message(big)
    assert message.startswith("OPENFORGE_RESULT ") and len(message.encode()) <= 4096
    parsed = RolloutResult.model_validate_json(message.split(" ", 1)[1])
    assert parsed.status == "ok" and parsed.reward is not None and parsed.reward.passed
