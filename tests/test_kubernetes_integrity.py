"""Reward integrity on Kubernetes: the agent's container cannot write the result the
executor reads, nor hold a credential that can, nor outlive its container.

The policy is an adversary (`k8s_standin.plugins.AttackHarness`): in the agent's container
it forges a result on its stdout and in every termination log it can name (a violation,
scored 0, that says where), looks for the
trusted side's volume, the spec (with the task's data), the host's HOME, the supervisor's
and verifier's processes and their environment, tries to kill them, and leaves a setsid'd
orphan without the marker variable. The stand-in runs each container in PID and mount
namespaces of its own (as a container runtime does), which needs root: CI runs as root.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

pytest.importorskip("kubernetes_asyncio", reason="pip install 'openforge[kubernetes]'")

from k8s_standin import Image, StandIn, standin_processes  # noqa: E402

from openforge.executors.k8s_api import KubeApi  # noqa: E402
from openforge.executors.k8s_pods import run_selector  # noqa: E402
from openforge.executors.kubernetes import KubernetesExecutor  # noqa: E402
from openforge.types import RolloutSpec, Task  # noqa: E402

TESTS_DIR = Path(__file__).parent
IMAGE = "openforge/rollout:test"


@pytest.fixture(scope="module")
def standin() -> Iterator[StandIn]:
    tini = Image(entrypoint=[sys.executable, "-m", "k8s_standin.tini", "--"])
    with StandIn(image_env={"PYTHONPATH": str(TESTS_DIR)}, images={IMAGE: tini}) as k8s:
        if not k8s.isolated:
            pytest.skip("containers run in their own PID and mount namespaces only as root "
                        "with unshare and setpriv (util-linux): CI runs as root")
        yield k8s


@pytest.fixture
async def kube(standin: StandIn) -> AsyncIterator[KubeApi]:
    api = await KubeApi.connect(Path(standin.kubeconfig), None, "default")
    yield api
    await api.close()


def _executor(standin: StandIn) -> KubernetesExecutor:
    return KubernetesExecutor(image=IMAGE, kubeconfig=str(standin.kubeconfig),
                              python=sys.executable, requests={"cpu": "100m"}, backoff_s=0.05,
                              termination_grace_s=1, force_delete_after_s=2)


def _spec(run_id: str, harness: str, env: str, **options: str) -> RolloutSpec:
    rollout_id = f"only.0.0.{uuid.uuid4().hex[:6]}"
    options = {k: v.replace("{rollout}", rollout_id) for k, v in options.items()}
    return RolloutSpec(run_id=run_id, rollout_id=rollout_id, task=Task(id="only", prompt="p"),
                       harness=harness, harness_options=options, environment=env,
                       reward="checker", gateway_url="http://127.0.0.1:9",
                       session_token=f"tok-{uuid.uuid4().hex}", timeout_s=60)


async def _clean(kube: KubeApi, run_id: str) -> None:
    for _ in range(150):
        pods, _ = await kube.list_pods(run_selector(run_id))
        if not pods and not standin_processes():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"left: {len(pods)} Pods, processes {standin_processes()}")


async def test_the_agent_cannot_forge_read_or_outlive_its_container(
        standin: StandIn, kube: KubeApi) -> None:
    run_id = "i-" + uuid.uuid4().hex[:8]
    canary = Path.home() / f".openforge-k8s-canary-{uuid.uuid4().hex}"
    canary.write_text("the orchestrator's secret")
    spec = _spec(run_id, "k8s_standin.plugins:AttackHarness", "k8s_standin.plugins:AttackEnv",
                 rollout="{rollout}", canary=str(canary))
    executor = _executor(standin)
    try:
        result = await executor.run(spec)
    finally:
        await executor.close()
        canary.unlink()
    # The verdict, from the verifier: neither forged line was taken as a result, and writing
    # them is a violation, scored 0, saying where each was (the supervisor found the one on
    # the harness's stdout, the executor the one in the agent's own termination message).
    assert result.status == "violation", result.error
    assert result.reward is not None and not result.reward.passed
    assert result.reward.score == 0.0
    error = result.error or ""
    assert error.startswith("violation: forged result line in the agent container's "
                            "termination message: OPENFORGE_RESULT ")
    assert "forged result line in the agent's output (harness.stdout)" in error
    found = json.loads(result.final_answer or "{}")  # what the attack found, as its answer
    assert found["orphan"]  # the attack did run
    assert found["forged_files"] == ["/dev/termination-log"]  # its own: nobody reads it
    assert found["spec"] is None  # the Secret is the supervisor's alone
    assert found["canary"] is None  # no host HOME in a container
    assert found["trusted_dir"] is False  # the supervisor/verifier volume is not there
    assert found["trusted_processes_seen"] == [] and found["killed"] == []
    await _clean(kube, run_id)  # the orphan died with the agent's container


async def test_a_killed_agent_launcher_fails_the_pod_never_passes(
        standin: StandIn, kube: KubeApi) -> None:
    run_id = "i-" + uuid.uuid4().hex[:8]
    # The harness writes the file that would pass, then kills the process that runs it.
    spec = _spec(run_id, "executor_plugins:KillParentHarness", "executor_plugins:OneTaskEnv")
    executor = _executor(standin)
    try:
        result = await executor.run(spec)
    finally:
        await executor.close()
    assert result.status == "infra_error", result.error
    assert result.reward is None
    assert "the agent container was killed (exit code 137" in (result.error or "")
    await _clean(kube, run_id)
