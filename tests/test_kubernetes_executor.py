"""Contract suite of the `kubernetes` executor: real client, real HTTP, real processes.

By default it runs against the in-repo API server + kubelet stand-in (`k8s_standin`). Set
`OPENFORGE_K8S_KUBECONFIG` (and `OPENFORGE_K8S_IMAGE`, `OPENFORGE_K8S_CALLBACK_HOST`, see
docs/scaling-out.md) to run the same scenarios against a real cluster; tests that need the
stand-in's knobs (fault injection, node loss, eviction...) or its process view are skipped
there.

Every scenario ends with 0 Pods and 0 Secrets of its run left, and (stand-in) 0 container
processes. No bound here depends on how fast the machine is: what is asserted are counts,
orders and causes. Every wait has a generous hang guard (`HANG_GUARD_S`), and so has every
budget a scenario is not about (a Pod's pending time, the grace before a force delete); a
state that may last only a moment is read from a watch begun before it (`first_seen`), not
looked for between polls; watches are counted list by list, not per second. Bounds in time
(node loss at `node_lost_s`, the force delete after the grace period, Retry-After) are
checked exactly on a virtual clock in test_kubernetes_pods.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes_asyncio", reason="pip install 'openforge[kubernetes]'")

from k8s_standin import Image, Node, StandIn, standin_processes  # noqa: E402
from kubernetes_asyncio import client  # noqa: E402

from openforge.executors.k8s_api import KubeApi  # noqa: E402
from openforge.executors.k8s_pods import owner_name, pod_name, run_selector  # noqa: E402
from openforge.executors.k8s_watch import WINDOWS_PER_LIST  # noqa: E402
from openforge.executors.kubernetes import KubernetesExecutor  # noqa: E402
from openforge.types import RolloutResult, RolloutSpec, Task  # noqa: E402

TESTS_DIR = Path(__file__).parent
REAL = bool(os.environ.get("OPENFORGE_K8S_KUBECONFIG"))
standin_only = pytest.mark.skipif(REAL, reason="needs the stand-in's knobs (fault injection)")
BAD_IMAGE = "registry.invalid/openforge/does-not-exist:0"
LOST_NODE = "standin-lost"  # the node the node-loss scenarios cut off; nothing else lands there
HANG_GUARD_S = 120  # a hang guard, never a bound under test
IMAGE = "openforge/rollout:test"
# Like the real image (deploy/kubernetes/Dockerfile): ENTRYPOINT ["tini", "--"].
TINI_IMAGE = Image(entrypoint=[sys.executable, "-m", "k8s_standin.tini", "--"])


# -- the cluster under test ----------------------------------------------------------------------


@dataclass
class Cluster:
    kubeconfig: str
    image: str
    python: str
    namespace: str
    callback_host: str
    standin: StandIn | None = None
    context: str | None = None

    def executor(self, **options: Any) -> KubernetesExecutor:
        # A graceful delete is never forced for being slow: the scenarios that force one
        # (a node that does not answer) set a short force_delete_after_s of their own.
        base: dict[str, Any] = {"image": self.image, "kubeconfig": self.kubeconfig,
                                "context": self.context, "namespace": self.namespace,
                                "python": self.python, "requests": {"cpu": "100m"},
                                "backoff_s": 0.05, "resync_s": 10, "termination_grace_s": 1,
                                "force_delete_after_s": HANG_GUARD_S}
        if self.standin:  # keep ordinary Pods off the node the node-loss tests cut off
            base["node_selector"] = {"pool": "main"}
        base.update(options)
        return KubernetesExecutor(**base)

    def executor_options(self) -> dict[str, Any]:
        """The options `executor()` is built with, as JSON (for a run config or a subprocess)."""
        return self.executor().options.model_dump(mode="json", exclude_defaults=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if REAL:
        image = os.environ.get("OPENFORGE_K8S_IMAGE")
        host = os.environ.get("OPENFORGE_K8S_CALLBACK_HOST")
        if not image or not host:
            pytest.fail("OPENFORGE_K8S_KUBECONFIG needs OPENFORGE_K8S_IMAGE (the test image) and "
                        "OPENFORGE_K8S_CALLBACK_HOST (this machine's address as Pods see it)")
        yield Cluster(os.environ["OPENFORGE_K8S_KUBECONFIG"], image, "python",
                      os.environ.get("OPENFORGE_K8S_NAMESPACE", "default"), host,
                      context=os.environ.get("OPENFORGE_K8S_CONTEXT"))
        return
    nodes = [Node(labels={"pool": "main"}), Node(LOST_NODE, labels={"pool": "lost"})]
    with StandIn(image_env={"PYTHONPATH": str(TESTS_DIR)}, nodes=nodes,
                 images={IMAGE: TINI_IMAGE}) as standin:
        yield Cluster(str(standin.kubeconfig), IMAGE, sys.executable,
                      "default", "127.0.0.1", standin)


@pytest.fixture
def run_id() -> str:
    return "t-" + uuid.uuid4().hex[:10]


@pytest.fixture
async def kube(cluster: Cluster) -> AsyncIterator[KubeApi]:
    api = await KubeApi.connect(Path(cluster.kubeconfig), cluster.context, cluster.namespace)
    yield api
    await api.close()


def make_spec(run_id: str, harness: str = "OkHarness", n: int = 0,
              env: str = "executor_plugins:OneTaskEnv", timeout_s: float = 30.0,
              harness_options: dict[str, Any] | None = None) -> RolloutSpec:
    module = "k8s_standin.plugins" if harness in ("WaitHarness", "AttackHarness") \
        else "executor_plugins"
    return RolloutSpec(run_id=run_id, rollout_id=f"only.0.{n}.{uuid.uuid4().hex[:6]}",
                       task=Task(id="only", prompt="write ok.txt"), harness=f"{module}:{harness}",
                       harness_options=harness_options or {}, environment=env, reward="checker",
                       gateway_url="http://127.0.0.1:9",  # these harnesses make no model call
                       session_token=f"tok-{run_id}-{n}-{uuid.uuid4().hex}",
                       session_id=f"sid-{run_id}-{n}", timeout_s=timeout_s)


async def run_alone(cluster: Cluster, spec: RolloutSpec,
                    **options: Any) -> tuple[RolloutResult, KubernetesExecutor]:
    """`spec` run on an executor of its own, built with `options` and closed after."""
    executor = cluster.executor(**options)
    try:
        return await executor.run(spec), executor
    finally:
        await executor.close()


async def left_behind(cluster: Cluster, kube: KubeApi, run_id: str) -> str:
    """'' when 0 Pods, 0 Secrets of the run (and, stand-in, 0 processes) are left, within a
    hang guard; else what is left."""
    deadline = time.monotonic() + 30
    while True:
        pods, _ = await kube.list_pods(run_selector(run_id))
        secrets = [s for s in cluster.standin.objects("Secret")
                   if s["metadata"]["labels"].get("openforge.io/run-id") == run_id] \
            if cluster.standin else []
        procs = standin_processes() if cluster.standin else []
        if not pods and not secrets and not procs:
            return ""
        if time.monotonic() > deadline:
            return (f"pods {[p['metadata']['name'] for p in pods]}, secrets "
                    f"{[s['metadata']['name'] for s in secrets]}, processes {[p.pid for p in procs]}")
        await asyncio.sleep(0.2)


async def assert_clean(cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    left = await left_behind(cluster, kube, run_id)
    assert not left, f"left behind: {left}"


def assert_clean_now(cluster: Cluster, run_id: str) -> None:
    """`assert_clean` from a test that is not a coroutine (it runs the runner's own loop)."""
    async def left() -> str:
        api = await KubeApi.connect(Path(cluster.kubeconfig), cluster.context, cluster.namespace)
        try:
            return await left_behind(cluster, api, run_id)
        finally:
            await api.close()

    left_now = asyncio.run(left())
    assert not left_now, f"left behind: {left_now}"


def agent_state(pod: dict[str, Any], container: str = "agent") -> dict[str, Any]:
    """The state of the Pod's agent container (or of `container`)."""
    status = pod.get("status") or {}
    for entry in (status.get("initContainerStatuses") or []) + \
            (status.get("containerStatuses") or []):
        if entry["name"] == container:
            return entry.get("state") or {}
    return {}


async def wait_agents_running(kube: KubeApi, run_id: str, count: int,
                              names: tuple[str, ...] = (),
                              container: str = "agent") -> list[dict[str, Any]]:
    """The run's Pods once `count` of them (of `names`, if given) run their agent container
    (or `container`). It looks every 0.1 s: for containers that run until the test ends
    them (`first_seen` for one that may run only briefly)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        pods, _ = await kube.list_pods(run_selector(run_id))
        running = [p for p in pods if "running" in agent_state(p, container)
                   and (not names or p["metadata"]["name"] in names)]
        if len(running) >= count:
            return running
        await asyncio.sleep(0.1)
    raise AssertionError(f"{count} {container} containers of {run_id} never ran")


async def first_seen(list_objects: Any, since: str, check: Any) -> dict[str, Any]:
    """The first state `check` accepts of an object `list_objects` (a typed client's list
    call) lists, read from a watch from `since` (a resourceVersion from before the object
    was made): every state it went through is on the watch, so a state that lasts only
    briefly is not missed between two looks."""
    deadline = time.monotonic() + HANG_GUARD_S
    rv = since
    while time.monotonic() < deadline:
        resp = await list_objects(watch=True, resource_version=rv, timeout_seconds=10,
                                  _preload_content=False)
        try:
            async for line in resp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                assert event.get("type") != "ERROR", obj  # the history is gone: cannot tell
                rv = obj.get("metadata", {}).get("resourceVersion") or rv
                if event.get("type") != "BOOKMARK" and check(obj):
                    return dict(obj)
        finally:
            resp.release()
    raise AssertionError(f"never seen since {since}")


# -- the basics ----------------------------------------------------------------------------------


async def test_results_come_from_the_verifier_and_nothing_is_left(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    executor = cluster.executor()
    spec = make_spec(run_id, "WaitHarness", harness_options={"seconds": 1})
    failing = make_spec(run_id, "FailHarness", n=1)
    _, before = await kube.list_pods(run_selector(run_id))
    ours = {"label_selector": run_selector(run_id)}
    try:
        tasks = [asyncio.create_task(executor.run(s)) for s in (spec, failing)]
        pod = await first_seen(
            functools.partial(kube.core.list_namespaced_pod, cluster.namespace, **ours), before,
            lambda p: p["metadata"]["name"] == pod_name(spec) and "running" in agent_state(p))
        # The token travels in the attempt's Secret, owned by the run; the Pod, owned by the
        # Secret, never holds it.
        assert spec.session_token not in json.dumps(pod)
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "Secret"
        if cluster.standin:
            secret = await first_seen(
                functools.partial(kube.core.list_namespaced_secret, cluster.namespace, **ours),
                before, lambda s: s["metadata"]["name"] == pod_name(spec))
            assert secret["metadata"]["ownerReferences"][0]["name"] == owner_name(run_id)
        result, failure = await asyncio.gather(*tasks)
    finally:
        await executor.close()
    assert result.status == "ok", result.error
    assert result.reward is not None and result.reward.passed
    assert result.final_answer == "waited"
    assert result.session_id == spec.session_id and result.sandbox == "pod"
    # The agent failing on its own is scored (0), not an infrastructure failure.
    assert failure.status == "harness_error", failure.error
    assert failure.reward is not None and failure.reward.score == 0.0
    assert executor.stats["created"] == 2 and executor.stats["deleted"] == 2
    assert executor.stats["force_deleted"] == 0
    await assert_clean(cluster, kube, run_id)
    if cluster.standin:
        assert cluster.standin.objects("ConfigMap") == []  # the owner went at close
        calls = cluster.standin.calls()
        assert calls["create secrets"] == 2 and calls["create pods"] == 2


async def test_timeouts_the_kubelets_deadline_and_the_clients(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    # Hangs in prepare (in the supervisor) with SIGTERM ignored: only activeDeadlineSeconds
    # and the kubelet's SIGKILL can end it (the client's own limits are hang guards here).
    # The budgets stay generous, however long the Pod takes to start; once its supervisor
    # runs, its deadline is cut to 1 s, as `kubectl patch` may do to a live Pod.
    kubelet = cluster.executor(pending_timeout_s=HANG_GUARD_S, kill_margin_s=HANG_GUARD_S)
    hung = make_spec(run_id, env="executor_plugins:HangInPrepareEnv", timeout_s=2)
    # A harness that hangs: the client's own limit (1.5 + 0.5 s once the Pod runs) comes
    # first; the kubelet's deadline is far.
    client = cluster.executor(pending_timeout_s=HANG_GUARD_S, deadline_slack_s=HANG_GUARD_S,
                              kill_margin_s=0.5)
    hanging = make_spec(run_id, "HangHarness", n=1, timeout_s=1.5)
    try:
        tasks = [asyncio.create_task(kubelet.run(hung)), asyncio.create_task(client.run(hanging))]
        await wait_agents_running(kube, run_id, 1, (pod_name(hung),), container="supervisor")
        await kube.core.patch_namespaced_pod(pod_name(hung), cluster.namespace,
                                             {"spec": {"activeDeadlineSeconds": 1}})
        deadline, timeout = await asyncio.gather(*tasks)
    finally:
        await kubelet.close()
        await client.close()
    assert deadline.status == "timeout", deadline.error
    assert "activeDeadlineSeconds" in (deadline.error or "")
    # The Pod's reason, not its exit code (the Pod's name is random hex: it may hold "137").
    assert "137" not in (deadline.error or "").replace(pod_name(hung), "")
    assert timeout.status == "timeout", timeout.error
    assert "ran past the timeout" in (timeout.error or "")
    assert deadline.reward is None and timeout.reward is None
    await assert_clean(cluster, kube, run_id)
    if cluster.standin:  # a graceful delete, and the kubelet finished it: no force needed
        deletes = [d for d in cluster.standin.deletions() if d[1:3] == ("Pod", pod_name(hanging))]
        assert deletes and all(d[3] is None for d in deletes), deletes
        assert client.stats["force_deleted"] == 0


async def test_unschedulable_pod_is_an_infra_error_after_the_pending_budget(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    # Short, yet not a race: at the end of the budget the executor reads the Pod afresh, and
    # the scheduler has said why by then (the stand-in's says so at its first pass, which
    # comes before it serves any later request).
    result, _ = await run_alone(cluster, make_spec(run_id), requests={"cpu": "100000"},
                                pending_timeout_s=1.5)
    assert result.status == "infra_error" and not result.permanent
    assert "unschedulable" in (result.error or "") and "Insufficient cpu" in (result.error or "")
    await assert_clean(cluster, kube, run_id)


async def test_invalid_spec_fails_fast_and_for_good(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    result, executor = await run_alone(cluster, make_spec(run_id), requests={"cpu": "lots"})
    assert result.status == "infra_error" and result.permanent
    assert "rejected Pod" in (result.error or "") and "lots" in (result.error or "")
    # The owner ConfigMap, the Secret, one Pod try: no retries, no waiting.
    assert executor.api_calls["create"] == 3
    await assert_clean(cluster, kube, run_id)


# -- image pulls ---------------------------------------------------------------------------------


async def test_missing_image_ends_the_attempt_for_good(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    result, executor = await run_alone(cluster, make_spec(run_id), image=BAD_IMAGE,
                                       pending_timeout_s=HANG_GUARD_S,
                                       image_pull_timeout_s=HANG_GUARD_S)
    assert result.status == "infra_error" and result.permanent  # the runner will not retry
    assert "image cannot be pulled" in (result.error or "") and "not found" in (result.error or "")
    assert executor.stats["created"] == 1
    await assert_clean(cluster, kube, run_id)


@standin_only
async def test_transient_pull_errors_are_waited_out_then_bounded(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    assert cluster.standin is not None
    busy = ("rpc error: code = Unknown desc = failed to pull and unpack image: 429 Too Many "
            "Requests - Server message: toomanyrequests: You have reached your pull rate limit")
    # Two 429s, then the registry answers: the attempt waits (the kubelet backs off) and runs.
    image = f"openforge/rollout:flaky-{run_id}"
    cluster.standin.pull_fault(image, [busy, busy])
    result, _ = await run_alone(cluster, make_spec(run_id), image=image,
                                image_pull_timeout_s=HANG_GUARD_S)
    assert result.status == "ok", result.error
    # A registry that stays down: the wait is bounded, and the failure is not permanent.
    image = f"openforge/rollout:down-{run_id}"
    cluster.standin.pull_fault(image, [busy] * 1000)
    result, _ = await run_alone(cluster, make_spec(run_id, n=1), image=image,
                                image_pull_timeout_s=1)
    assert result.status == "infra_error" and not result.permanent
    assert "image pull kept failing" in (result.error or "") and "429" in (result.error or "")
    assert "image_pull_timeout_s" in (result.error or "")
    await assert_clean(cluster, kube, run_id)


# -- quota and admission -------------------------------------------------------------------------


@standin_only
async def test_quota_refusals_wait_for_capacity_without_burning_tries(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    assert cluster.standin is not None
    cluster.standin.set_pod_quota(0)
    executor = cluster.executor()
    try:
        task = asyncio.create_task(executor.run(make_spec(run_id)))
        deadline = time.monotonic() + HANG_GUARD_S
        while "waiting for quota" not in executor.progress():
            assert time.monotonic() < deadline and not task.done(), "never waited for quota"
            await asyncio.sleep(0.05)
        assert executor.progress() == "1 waiting for quota"  # what the progress line shows
        while executor.stats["waited for quota"] < 3:  # refused, backed off, asked again
            assert time.monotonic() < deadline and not task.done(), "never asked again"
            await asyncio.sleep(0.05)
        cluster.standin.set_pod_quota(None)  # capacity comes back
        result = await task
    finally:
        cluster.standin.set_pod_quota(None)
        await executor.close()
    assert result.status == "ok", result.error  # the same attempt, the same try
    assert executor.stats["created"] == 1 and executor.progress() == ""
    # A quota that never frees: the wait is bounded, not permanent (a later try may fit).
    cluster.standin.set_pod_quota(0)
    try:
        result, _ = await run_alone(cluster, make_spec(run_id, n=1), admission_wait_s=0.5)
    finally:
        cluster.standin.set_pod_quota(None)
    assert result.status == "infra_error" and not result.permanent
    assert "exceeded quota" in (result.error or "") and "for 0.5s" in (result.error or "")
    await assert_clean(cluster, kube, run_id)


@standin_only
async def test_admission_policy_refusals_wait_rbac_refusals_do_not(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    assert cluster.standin is not None
    policy = ('pods "x" is forbidden: ValidatingAdmissionPolicy \'gpu-hours\' with binding '
              "'nights' denied request: rollouts are paused")
    cluster.standin.inject("create", "pods", 422, count=3, message=policy, reason="Invalid")
    result, executor = await run_alone(cluster, make_spec(run_id))
    assert result.status == "ok", result.error
    assert executor.stats["waited for admission"] == 3
    rbac = ('pods is forbidden: User "system:serviceaccount:openforge:openforge-orchestrator" '
            'cannot create resource "pods" in API group "" in the namespace "default"')
    cluster.standin.inject("create", "pods", 403, count=1, message=rbac)
    result, executor = await run_alone(cluster, make_spec(run_id, n=1))
    assert result.status == "infra_error" and result.permanent
    assert "cannot create resource" in (result.error or "") and "rbac.yaml" in (result.error or "")
    assert executor.stats["waited for admission"] == 0
    await assert_clean(cluster, kube, run_id)


# -- what a cluster does to a running Pod --------------------------------------------------------


@standin_only
async def test_pod_level_reasons_win_over_exit_codes(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    assert cluster.standin is not None
    executor = cluster.executor()
    specs = [make_spec(run_id, "HangHarness", n=i, timeout_s=HANG_GUARD_S) for i in range(3)]
    try:
        tasks = [asyncio.create_task(executor.run(s)) for s in specs]
        await wait_agents_running(kube, run_id, 3)
        evicted, oom, preempted = (pod_name(s) for s in specs)
        cluster.standin.evict(evicted, "The node was low on resource: memory. Threshold "
                              "quantity: 100Mi, available: 80Mi.")
        cluster.standin.oom(oom, "agent")
        cluster.standin.preempt(preempted)
        results = await asyncio.wait_for(asyncio.gather(*tasks), HANG_GUARD_S)
    finally:
        await executor.close()
    errors = [r.error or "" for r in results]
    assert [r.status for r in results] == ["infra_error"] * 3, errors
    assert "evicted by its node (Evicted: The node was low on resource: memory" in errors[0]
    # Without the session's scoring credential nothing says whose end it was.
    assert "the agent container was killed (exit code 137, OOMKilled)" in errors[1]
    assert "preempted by the scheduler (PreemptionByScheduler" in errors[2]
    assert not any("exit code" in e for e in (errors[0], errors[2])), errors
    await assert_clean(cluster, kube, run_id)


@standin_only
async def test_node_loss_is_detected_within_the_bound_then_deleted_gracefully_then_forced(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    assert cluster.standin is not None
    # The run's timeout is far away; the node-loss bound is 1 s. The node controller marks
    # the lost node NotReady (its kubelet is cut off: it neither reports nor acts); on the
    # main node, one Pod's phase turns Unknown.
    options = {"node_lost_s": 1, "termination_grace_s": 1, "force_delete_after_s": 1}
    on_lost = cluster.executor(node_selector={"pool": "lost"}, **options)
    on_main = cluster.executor(**options)
    spec = make_spec(run_id, "HangHarness", timeout_s=HANG_GUARD_S * 10)
    unknown = make_spec(run_id, "HangHarness", n=1, timeout_s=HANG_GUARD_S * 10)
    try:
        tasks = [asyncio.create_task(on_lost.run(spec)), asyncio.create_task(on_main.run(unknown))]
        await wait_agents_running(kube, run_id, 2)
        cluster.standin.partition(LOST_NODE)
        cluster.standin.set_phase_unknown(pod_name(unknown))
        result, lost = await asyncio.wait_for(asyncio.gather(*tasks), HANG_GUARD_S)
        assert result.status == "infra_error", result.error
        assert f"lost with its node: node {LOST_NODE} is NotReady (Unknown" in (result.error or "")
        assert "node_lost_s" in (result.error or "")
        assert lost.status == "infra_error" and "phase Unknown" in (lost.error or ""), lost.error
        # Graceful first (the cut-off kubelet never finishes it), forced only after the
        # grace period: by then the object goes, but the containers still run on the node.
        deletes = [d for d in cluster.standin.deletions() if d[1:3] == ("Pod", pod_name(spec))]
        graces = [d[3] for d in deletes]
        assert graces[-1] == 0 and graces.count(0) == 1 and graces[0] is None, deletes
        assert deletes[-1][0] - deletes[0][0] >= 1 + 1  # grace + force_delete_after_s
        assert on_lost.stats["force_deleted"] == 1
        assert standin_processes()  # 0 Pods listed is not 0 containers
    finally:
        cluster.standin.reconnect(LOST_NODE)  # back: its kubelet kills what was deleted
        await on_lost.close()
        await on_main.close()
    await assert_clean(cluster, kube, run_id)


@standin_only
async def test_a_pod_whose_node_vanished_fails_with_that_cause(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    assert cluster.standin is not None
    executor = cluster.executor(node_selector={"pool": "lost"}, node_lost_s=0.5)
    try:
        task = asyncio.create_task(executor.run(make_spec(run_id, "HangHarness",
                                                          timeout_s=HANG_GUARD_S * 10)))
        await wait_agents_running(kube, run_id, 1)
        cluster.standin.remove_node(LOST_NODE)
        result = await asyncio.wait_for(task, HANG_GUARD_S)
    finally:
        cluster.standin.restore_node(LOST_NODE)
        await executor.close()
    assert result.status == "infra_error", result.error
    # The pod garbage collector took it (DeletionByPodGC), or the node watch saw it go.
    assert "node no longer exists" in (result.error or "") or \
        f"node {LOST_NODE} no longer exists" in (result.error or ""), result.error
    await assert_clean(cluster, kube, run_id)


# -- cancellation, restarts, leftovers -----------------------------------------------------------


async def test_cancel_mid_run_deletes_pods_gracefully_and_kills_processes(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    executor = cluster.executor()
    specs = [make_spec(run_id, "HangHarness", n=i, timeout_s=HANG_GUARD_S) for i in range(2)]
    tasks = [asyncio.create_task(executor.run(s)) for s in specs]
    try:
        await wait_agents_running(kube, run_id, 2)
        if cluster.standin:
            assert len(standin_processes()) >= 2
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
        assert not await left_behind(cluster, kube, run_id)  # before close: `finally` did it
    finally:
        await executor.close()
    if cluster.standin:
        assert executor.stats["force_deleted"] == 0


# An orchestrator that makes its Pods and dies before it collects any of them, however fast
# they run: it never follows one (the test then SIGKILLs it).
_ORCHESTRATOR = textwrap.dedent("""
    import asyncio, json, sys
    from openforge.executors.kubernetes import KubernetesExecutor
    from openforge.types import RolloutSpec
    options, specs = json.load(open(sys.argv[1]))
    async def never(*args):
        await asyncio.Event().wait()
    assert callable(KubernetesExecutor._follow)
    KubernetesExecutor._follow = never
    async def main():
        executor = KubernetesExecutor(**options)
        await asyncio.gather(*[executor.run(RolloutSpec.model_validate(s)) for s in specs])
    asyncio.run(main())
""")


@contextlib.asynccontextmanager
async def crashed_orchestrator(tmp_path: Path, options: dict[str, Any],
                               specs: list[RolloutSpec]) -> AsyncIterator[None]:
    """An orchestrator process (`_ORCHESTRATOR`) that creates the Pods of `specs`, collects
    none, and is SIGKILLed when the block ends: no finally, no close, a crash."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([options, [s.model_dump(mode="json") for s in specs]]))
    crashed = subprocess.Popen([sys.executable, "-c", _ORCHESTRATOR, str(plan)])
    try:
        yield
    finally:
        crashed.send_signal(signal.SIGKILL)
        crashed.wait()


async def test_resume_after_sigkill_adopts_live_and_finished_pods(
        cluster: Cluster, kube: KubeApi, run_id: str, tmp_path: Path) -> None:
    quick, slow = {"seconds": 2}, {"seconds": 3}
    old = [make_spec(run_id, "WaitHarness", n=0, harness_options=quick)] + \
        [make_spec(run_id, "WaitHarness", n=i, harness_options=slow) for i in (1, 2)]

    async def until(check: Any) -> list[dict[str, Any]]:
        deadline = time.monotonic() + HANG_GUARD_S
        while True:
            pods, _ = await kube.list_pods(run_selector(run_id))
            if check(pods):
                return pods
            assert time.monotonic() < deadline, "the Pods never got there"
            await asyncio.sleep(0.05)

    def phase_of(pods: list[dict[str, Any]], spec: RolloutSpec) -> str:
        return next((p["status"].get("phase", "") for p in pods
                     if p["metadata"]["name"] == pod_name(spec)), "")

    async with crashed_orchestrator(tmp_path, cluster.executor_options(), old):
        # The orchestrator made all three Pods and collects none: attempt 0 finishes while
        # nobody watches; then it dies for good.
        await until(lambda pods: len(pods) == 3 and phase_of(pods, old[0]) == "Succeeded")
    pods, _ = await kube.list_pods(run_selector(run_id))
    assert len(pods) == 3  # the crash left them all

    # The restarted orchestrator asks again for attempts 0 and 1 (same identity, same
    # session), and for a new one; attempt 2 is no longer wanted.
    fresh = make_spec(run_id, "WaitHarness", n=3, harness_options=quick)
    # A short window, yet no race: the runs below claim their Pods in the turn of the event
    # loop after the list, before any timer (the window's end) can fire.
    executor = cluster.executor(adopt_window_s=1)
    try:
        assert await executor.adoptable(old[0]) and await executor.adoptable(old[1])
        assert not await executor.adoptable(fresh)
        results = await asyncio.gather(*[executor.run(s) for s in (old[0], old[1], fresh)])
        assert [r.status for r in results] == ["ok", "ok", "ok"], [r.error for r in results]
        # Attempt 0's result was kept in its finished Pod; attempt 1's Pod was adopted as it
        # was (running, most often) and followed to its end.
        assert [r.rollout_id for r in results] == [old[0].rollout_id, old[1].rollout_id,
                                                  fresh.rollout_id]
        assert executor.stats["adopted"] == 2  # 0 Pods recreated for the live attempts
        assert executor.stats["created"] == 1
        # Attempt 2's Pod, unclaimed, is swept once the adoption window has passed; every
        # other Pod goes with its finished attempt. All that before close, so that its own
        # sweep has nothing left to count.
        await until(lambda pods: not pods and executor.stats["swept"] >= 1)
    finally:
        await executor.close()
    assert executor.stats["swept"] == 1
    await assert_clean(cluster, kube, run_id)


async def test_owner_deletion_garbage_collects_the_runs_secrets_and_pods(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    executor = cluster.executor()
    task = asyncio.create_task(executor.run(make_spec(run_id, "HangHarness",
                                                      timeout_s=HANG_GUARD_S)))
    try:
        await wait_agents_running(kube, run_id, 1)
        # What an operator does after an orchestrator died: delete the run's owner.
        await kube.delete_configmap(owner_name(run_id))
        result = await asyncio.wait_for(task, HANG_GUARD_S)
        assert result.status == "infra_error", result.error
    finally:
        await executor.close()
    await assert_clean(cluster, kube, run_id)


async def test_leftover_pods_are_swept_and_strangers_under_our_name_replaced(
        cluster: Cluster, kube: KubeApi, run_id: str, tmp_path: Path) -> None:
    stale = make_spec(run_id, "HangHarness", n=9, timeout_s=HANG_GUARD_S)
    spec = make_spec(run_id)
    impostor = spec.model_copy(update={"session_token": "someone-else",
                                       "harness": "executor_plugins:HangHarness"})
    assert pod_name(impostor) == pod_name(spec)
    async with crashed_orchestrator(tmp_path, cluster.executor_options(), [stale, impostor]):
        await wait_agents_running(kube, run_id, 2)
    result, executor = await run_alone(cluster, spec, adopt_window_s=0)
    assert result.status == "ok", result.error
    assert executor.stats["adopted"] == 0 and executor.stats["created"] == 1
    assert executor.stats["swept"] >= 1  # the stale attempt's Pod
    if cluster.standin:  # the impostor went on a graceful delete: nothing was forced
        graces = [d[3] for d in cluster.standin.deletions() if d[1:3] == ("Pod", pod_name(spec))]
        assert graces and set(graces) == {None}, graces
        assert executor.stats["force_deleted"] == 0
    await assert_clean(cluster, kube, run_id)


@standin_only
async def test_strangers_under_our_name_are_deleted_gracefully_then_forced(
        cluster: Cluster, kube: KubeApi, run_id: str, tmp_path: Path) -> None:
    assert cluster.standin is not None
    # Under the names of two attempts, two Pods on a node then cut off (its kubelet carries
    # out no graceful delete): one an earlier orchestrator made from another spec (found at
    # start), one made outside the run (met as 409 AlreadyExists when creating).
    found, met = make_spec(run_id), make_spec(run_id, n=1)
    impostor = found.model_copy(update={"harness": "executor_plugins:HangHarness"})
    lost = {**cluster.executor_options(), "node_selector": {"pool": "lost"}}
    async with crashed_orchestrator(tmp_path, lost, [impostor]):
        await wait_agents_running(kube, run_id, 1)
    stranger = client.V1Pod(
        metadata=client.V1ObjectMeta(name=pod_name(met)),
        spec=client.V1PodSpec(
            node_selector={"pool": "lost"}, restart_policy="Never",
            termination_grace_period_seconds=1, containers=[client.V1Container(
                name="main", image=IMAGE,
                command=[sys.executable, "-c", "import time; time.sleep(600)"])]))
    await kube.core.create_namespaced_pod(cluster.namespace, stranger)
    deadline = time.monotonic() + HANG_GUARD_S
    while "running" not in agent_state(await kube.read_pod(pod_name(met)) or {}, "main"):
        assert time.monotonic() < deadline, "the stranger never ran"
        await asyncio.sleep(0.1)
    cluster.standin.partition(LOST_NODE)
    executor = cluster.executor(termination_grace_s=1, force_delete_after_s=1)
    try:
        results = await asyncio.gather(executor.run(found), executor.run(met))
    finally:
        cluster.standin.reconnect(LOST_NODE)  # back: its kubelet kills what was deleted
        await executor.close()
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    assert executor.stats["created"] == 2 and executor.stats["force_deleted"] == 2
    deletions = cluster.standin.deletions()
    for spec in (found, met):
        # Graceful first, forced once after that; then our own Pod went, gracefully.
        graces = [d[3] for d in deletions if d[1:3] == ("Pod", pod_name(spec))]
        assert graces[0] is None and graces.count(0) == 1, graces
    await assert_clean(cluster, kube, run_id)


# -- scale-out behaviour -------------------------------------------------------------------------


async def test_concurrency_is_bounded_with_one_shared_watch_per_resync_window(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    executor = cluster.executor(max_concurrency=2, create_qps=50, create_burst=2, resync_s=2)
    specs = [make_spec(run_id, "EmptyHarness", n=i) for i in range(4)]
    if cluster.standin:
        cluster.standin.reset_counters()
    try:
        results = await asyncio.gather(*[executor.run(s) for s in specs])
    finally:
        await executor.close()
    assert [r.status for r in results] == ["ok"] * 4, {r.error for r in results}
    if cluster.standin:
        assert cluster.standin.max_live_pods <= 2
        calls = cluster.standin.calls()
        assert calls["create pods"] == 4 and calls["create secrets"] == 4
        assert calls.get("get pods/log", 0) == 0
        # One shared watch on the run's Pods at any time, and at most two watch windows
        # after each list, counted list by list from what the server served: so the bound
        # holds however many windows the run lasted (the cycle itself, window by window:
        # test_kubernetes_pods.py).
        selector = f"pods?{run_selector(run_id)}"
        assert cluster.standin.max_open_watches()[selector] == 1
        reads = "".join("L" if r == "list" else "w" for r in cluster.standin.reads(selector))
        assert reads.startswith("L"), reads
        assert all(len(windows) <= WINDOWS_PER_LIST for windows in reads.split("L")), reads
    await assert_clean(cluster, kube, run_id)


@standin_only
async def test_transient_api_errors_are_retried(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    assert cluster.standin is not None
    cluster.standin.inject("create", "pods", 500, count=2)
    cluster.standin.inject("create", "secrets", 429, count=1, retry_after=0)
    cluster.standin.inject("list", "pods", 503, count=1)
    cluster.standin.inject("watch", "pods", 410, count=1)
    cluster.standin.inject("deletecollection", "secrets", 504, count=1)
    result, executor = await run_alone(cluster, make_spec(run_id))
    assert result.status == "ok", result.error
    assert executor.api_calls["create"] >= 5  # owner + secret twice + pod three times
    await assert_clean(cluster, kube, run_id)


@standin_only
async def test_watch_history_loss_is_repaired_by_relisting(
        cluster: Cluster, kube: KubeApi, run_id: str) -> None:
    assert cluster.standin is not None
    executor = cluster.executor(resync_s=120)  # no scheduled list during the test
    cluster.standin.reset_counters()
    try:
        task = asyncio.create_task(executor.run(make_spec(run_id, "WaitHarness",
                                                          harness_options={"seconds": 2})))
        await wait_agents_running(kube, run_id, 1)
        # History goes: the watcher resumes from a version now forgotten, gets 410 Gone, and
        # lists the run's Pods again. Waited for while the executor is open, whether or not
        # the rollout has ended by then.
        cluster.standin.compact()
        selector = f"pods?{run_selector(run_id)}"
        deadline = time.monotonic() + HANG_GUARD_S
        while cluster.standin.calls().get("watch expired (410)", 0) < 1 or \
                cluster.standin.reads(selector).count("list") < 2:
            assert time.monotonic() < deadline, cluster.standin.reads(selector)
            await asyncio.sleep(0.05)
        result = await task
    finally:
        await executor.close()
    assert result.status == "ok", result.error
    await assert_clean(cluster, kube, run_id)


def test_openforge_run_with_the_kubernetes_executor(cluster: Cluster, tmp_path: Path) -> None:
    """The whole job: runner, gateway (real model calls from the mini harness), Pods, report."""
    from openforge.config import EngineConfig
    from openforge.runner import read_results, run_from_config

    run_id = "run-" + uuid.uuid4().hex[:8]
    script = EngineConfig(name="scripted", options={"script": str(TESTS_DIR / "demo_solutions.yaml")})
    config = _run_config(cluster, tmp_path, run_id, engine=script, limit=1,
                         harness="mini", environment="demo", reward="checker")
    summary = run_from_config(config)
    records = read_results(summary.run_dir)
    assert [r.status for r in records] == ["ok"], [r.error for r in records]
    assert summary.metrics.pass_at[1] == 1.0
    assert_clean_now(cluster, run_id)


_RUN = "import sys; from openforge.config import RunConfig; from openforge.runner import " \
       "run_from_config; run_from_config(RunConfig.model_validate_json(open(sys.argv[1]).read()))"


def _run_config(cluster: Cluster, tmp_path: Path, run_id: str, **overrides: Any) -> Any:
    import socket

    from openforge.config import EngineConfig, GatewayConfig, RunConfig

    with socket.socket() as s:  # a fixed port: the Pods are told the gateway's URL
        s.bind(("127.0.0.1" if cluster.standin else "0.0.0.0", 0))
        port = s.getsockname()[1]
    options = cluster.executor_options()
    options["gateway_url"] = f"http://{cluster.callback_host}:{port}"
    base: dict[str, Any] = {
        "engine": EngineConfig(name="scripted", options={"replies": [{"content": "pong"}]}),
        "gateway": GatewayConfig(host="127.0.0.1" if cluster.standin else "0.0.0.0", port=port),
        "runs_dir": tmp_path, "run_id": run_id, "executor": "kubernetes",
        "executor_options": options, "environment": "executor_plugins:OneTaskEnv",
        "reward": "checker", "timeout_s": 300}
    base.update(overrides)
    return RunConfig(**base)


@standin_only
def test_resume_after_sigkill_continues_live_tries_through_the_runner(
        cluster: Cluster, tmp_path: Path) -> None:
    """The runner's attempt identity: after SIGKILL, `--resume` recreates no Pod for a live
    attempt, reopens its session (the Pod's next model call lands) and keeps its result."""
    from openforge.runner import read_results, run_from_config
    from openforge.store import Store

    assert cluster.standin is not None
    run_id = "run-" + uuid.uuid4().hex[:8]
    config = _run_config(cluster, tmp_path, run_id, k=2, concurrency=2,
                         harness="k8s_standin.plugins:AcrossRestartHarness",
                         harness_options={"patience": HANG_GUARD_S})
    plan = tmp_path / "config.json"
    plan.write_text(config.model_dump_json())
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR)}
    crashed = subprocess.Popen([sys.executable, "-c", _RUN, str(plan)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    store_path = tmp_path / run_id / "store.sqlite"

    def calls_recorded() -> int:
        if not store_path.exists():
            return 0
        with Store(store_path) as store:
            return store.count_calls(run_id=run_id)

    try:  # the crash comes once each Pod's first model call is recorded
        deadline = time.monotonic() + HANG_GUARD_S
        while calls_recorded() < 2:
            assert time.monotonic() < deadline and crashed.poll() is None, "no calls came"
            time.sleep(0.2)
    finally:
        crashed.send_signal(signal.SIGKILL)
        crashed.wait()
    cluster.standin.reset_counters()
    summary = run_from_config(config, resume=tmp_path / run_id)
    records = read_results(summary.run_dir)
    assert [(r.status, r.passed, r.tries) for r in records] == [("ok", True, 1)] * 2, \
        [r.error for r in records]
    assert cluster.standin.calls().get("create pods", 0) == 0  # 0 Pods recreated
    with Store(summary.run_dir / "store.sqlite") as store:
        # Both calls of each Pod are in its one session: before the crash and after resume.
        assert [store.count_calls(session_id=r.session_id) for r in records] == [2, 2]
        assert len(store.list_sessions(run_id)) == 2
    assert_clean_now(cluster, run_id)


def test_a_missing_image_is_not_retried_by_the_runner(cluster: Cluster, tmp_path: Path) -> None:
    from openforge.runner import read_results, run_from_config

    run_id = "run-" + uuid.uuid4().hex[:8]
    config = _run_config(cluster, tmp_path, run_id, harness="executor_plugins:OkHarness",
                         max_infra_retries=2)
    config.executor_options["image"] = BAD_IMAGE
    summary = run_from_config(config)
    [record] = read_results(summary.run_dir)
    assert record.status == "infra_error" and record.tries == 1  # 1 Pod, not 3
    assert "image cannot be pulled" in (record.error or "")
