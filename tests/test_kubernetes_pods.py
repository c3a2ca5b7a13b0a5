"""The Kubernetes executor's pure parts, no cluster: the Pod and Secret it builds, its
options, and how it reads a Pod's status (result, image pulls, Pod-level reasons, node
loss, API refusals). Times are explicit arguments here, so bounds are exact."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes_asyncio", reason="pip install 'openforge[kubernetes]'")

from kubernetes_asyncio.client import V1OwnerReference  # noqa: E402
from kubernetes_asyncio.client.exceptions import ApiException  # noqa: E402

from openforge import plugins  # noqa: E402
from openforge.executors.k8s_api import RateLimiter  # noqa: E402
from openforge.executors.k8s_pods import (  # noqa: E402
    KubernetesOptions,
    build_pod,
    build_secret,
    label_value,
    pod_name,
    spec_digest,
)
from openforge.executors.k8s_result import (  # noqa: E402
    compact_message,
    node_lost,
    parse_result,
    pod_level_cause,
    start_problem,
)
from openforge.executors.k8s_watch import NodeWatcher  # noqa: E402
from openforge.executors.kubernetes import (  # noqa: E402
    KubernetesExecutor,
    KubernetesExecutorError,
    refusal,
)
from openforge.options import OptionsError  # noqa: E402
from openforge.types import RewardResult, RolloutResult, RolloutSpec, Task  # noqa: E402


def _spec(**kw: Any) -> RolloutSpec:
    base: dict[str, Any] = {"run_id": "run-1", "rollout_id": "Some Task/with spaces.0.1.abc",
                            "task": Task(id="t", prompt="p", data={"answer": "42"}),
                            "harness": "mini", "environment": "demo", "reward": "checker",
                            "gateway_url": "http://127.0.0.1:9", "session_token": "secret-token"}
    base.update(kw)
    return RolloutSpec(**base)


def _pod_dict(spec: RolloutSpec, options: KubernetesOptions) -> dict[str, Any]:
    owner = V1OwnerReference(api_version="v1", kind="Secret", name=pod_name(spec), uid="u-1")
    return build_pod(spec, options, owner).to_dict()


# -- the Pod and the Secret ----------------------------------------------------------------------


def test_pod_has_a_trusted_supervisor_an_agent_and_a_verifier() -> None:
    options = KubernetesOptions(image="reg/rollout@sha256:" + "a" * 64, runtime_class="gvisor",
                                gateway_url="http://openforge-gateway.openforge.svc:8000",
                                node_selector={"pool": "rollouts"}, env={"FOO": "bar"},
                                tolerations=[{"key": "rollouts", "operator": "Exists",
                                              "effect": "NoExecute", "tolerationSeconds": 30}],
                                image_pull_secrets=["regcred"])
    spec = _spec(timeout_s=100)
    pod = _pod_dict(spec, options)
    meta, podspec = pod["metadata"], pod["spec"]
    assert len(meta["name"]) <= 63 and meta["name"] == pod_name(_spec())
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "openforge"
    assert meta["labels"]["openforge.io/run-id"] == "run-1"
    assert meta["annotations"]["openforge.io/rollout-id-full"] == "Some Task/with spaces.0.1.abc"
    assert meta["owner_references"][0]["kind"] == "Secret"  # the Pod goes with its Secret
    assert podspec["restart_policy"] == "Never"
    assert podspec["automount_service_account_token"] is False
    assert podspec["enable_service_links"] is False
    assert podspec["share_process_namespace"] is None  # each container its own PID namespace
    assert podspec["active_deadline_seconds"] == 600 + 100 + 15
    assert podspec["termination_grace_period_seconds"] == 5
    assert podspec["runtime_class_name"] == "gvisor"
    assert podspec["tolerations"][0]["toleration_seconds"] == 30
    supervisor, agent = podspec["init_containers"]
    [verifier] = podspec["containers"]
    assert (supervisor["name"], agent["name"], verifier["name"]) == \
        ("supervisor", "agent", "verifier")
    # A native sidecar, started first; the agent starts once its probe says it is ready.
    assert supervisor["restart_policy"] == "Always"
    assert supervisor["startup_probe"]["_exec"]["command"] == \
        ["test", "-e", "/openforge/trusted/ready"]
    assert agent["restart_policy"] is None
    # The image's ENTRYPOINT (tini) stays: only `args`.
    for c in (supervisor, agent, verifier):
        assert c["command"] is None
        assert c["args"][:3] == ["python", "-m", "openforge.executors.k8s_sandbox"]
        assert c["security_context"]["allow_privilege_escalation"] is False
        assert c["security_context"]["capabilities"]["drop"] == ["ALL"]
    mounts = {c["name"]: {m["name"] for m in c["volume_mounts"]}
              for c in (supervisor, agent, verifier)}
    assert mounts == {"supervisor": {"workspace", "agent", "trusted", "spec"},
                      "agent": {"workspace", "agent"}, "verifier": {"trusted"}}
    # Only the verifier's termination message is ever read.
    assert verifier["termination_message_path"] == "/dev/termination-log"
    assert verifier["termination_message_policy"] == "FallbackToLogsOnError"
    agent_env = {e["name"]: e["value"] for e in agent["env"]}
    assert agent_env["FOO"] == "bar" and "OPENFORGE_TRUSTED_DIR" not in agent_env
    assert agent["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    # No token, no task data, nowhere in the Pod.
    text = json.dumps(pod, default=str)
    assert "secret-token" not in text and '"42"' not in text
    [secret_volume] = [v for v in podspec["volumes"] if v["secret"]]
    assert secret_volume["secret"]["secret_name"] == pod_name(spec)


def test_the_secret_carries_the_spec_as_pods_reach_the_gateway() -> None:
    options = KubernetesOptions(image="i", gateway_url="http://gw.svc:8000")
    owner = V1OwnerReference(api_version="v1", kind="ConfigMap", name="openforge-run-x", uid="u")
    secret = build_secret(_spec(), options, owner).to_dict()
    assert secret["metadata"]["name"] == pod_name(_spec())
    assert secret["metadata"]["owner_references"][0]["kind"] == "ConfigMap"
    inside = RolloutSpec.model_validate_json(base64.b64decode(secret["data"]["spec.json"]))
    assert inside.session_token == "secret-token"
    assert inside.gateway_url == "http://gw.svc:8000"


def test_an_entrypoint_option_names_the_command() -> None:
    options = KubernetesOptions(image="i", entrypoint=["/usr/bin/tini", "-g", "--"],
                                python="/opt/venv/bin/python")
    verifier = _pod_dict(_spec(), options)["spec"]["containers"][0]
    assert verifier["command"] == ["/usr/bin/tini", "-g", "--"]
    assert verifier["args"][0] == "/opt/venv/bin/python"


def test_identity_names_and_digests() -> None:
    a = pod_name(_spec(rollout_id="x" * 300))
    assert a == pod_name(_spec(rollout_id="x" * 300)) and len(a) <= 63
    assert a != pod_name(_spec(rollout_id="x" * 300, attempt=1))
    assert label_value("ok-value_1.2") == "ok-value_1.2"
    long = label_value("Weird id/with: stuff" * 10)
    assert len(long) <= 63 and long[0].isalnum() and long[-1].isalnum()
    # The digest is of the spec as the Pod gets it: a runner on another port adopts the same
    # Pod when Pods reach the gateway through a Service.
    options = KubernetesOptions(image="i", gateway_url="http://gw.svc:8000")
    assert spec_digest(_spec(gateway_url="http://127.0.0.1:1"), options) == \
        spec_digest(_spec(gateway_url="http://127.0.0.1:2"), options)
    # Credentials are not part of it (a resumed runner may not hold them in clear); what the
    # Pod does is.
    assert spec_digest(_spec(), options) == spec_digest(_spec(session_token="other"), options)
    assert spec_digest(_spec(), options) != spec_digest(_spec(harness="other"), options)


def test_oversized_spec_is_refused_with_a_clear_message() -> None:
    spec = _spec(task=Task(id="t", prompt="x" * 800_000))
    with pytest.raises(ValueError, match="keep task data small"):
        build_secret(spec, KubernetesOptions(image="i"), None)


def test_options_errors_are_one_line() -> None:
    with pytest.raises(OptionsError, match=r"^executor 'kubernetes' option image: required, not "
                                            r"given \(the rollout image"):
        plugins.create("executor", "kubernetes")
    with pytest.raises(OptionsError, match="option max_concurrency"):
        KubernetesExecutor(image="i", max_concurrency=0)
    with pytest.raises(OptionsError, match=r"option imag: not a known option \(valid: .*image,"):
        KubernetesExecutor(image="i", imag="typo")
    with pytest.raises(OptionsError, match="option command: not a known option"):
        KubernetesExecutor(image="i", command=["python"])  # replaced by python / entrypoint
    with pytest.raises(KubernetesExecutorError, match="kubeconfig: /nonexistent does not exist"):
        KubernetesExecutor(image="i", kubeconfig="/nonexistent")


async def test_unreachable_api_is_an_infra_error(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    executor = KubernetesExecutor(image="i", kubeconfig=str(config), api_retries=0)
    try:
        result = await executor.run(_spec())
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


# -- reading a Pod's status ----------------------------------------------------------------------


def test_termination_message_fits_in_4k_and_parses_back() -> None:
    big = RolloutResult(rollout_id="r", status="ok", final_answer="a" * 10_000,
                        reward=RewardResult(score=1.0, passed=True, details={
                            "x": "y" * 10_000, "scrubbed_links": 2}),
                        harness_output={"stdout": "z" * 100_000})
    message = compact_message(big)
    assert message.startswith("OPENFORGE_RESULT ") and len(message.encode()) <= 4096
    parsed = parse_result("noise\n" + message)
    assert parsed is not None and parsed.status == "ok" and parsed.reward is not None
    # The reward's own details are dropped; what the supervisor counted of the agent is not.
    assert parsed.reward.details == {"scrubbed_links": 2}
    assert parse_result("OPENFORGE_RESULT {not json") is None


def test_a_termination_message_is_taken_only_with_the_attempts_signature() -> None:
    from openforge.sandbox.protocol import scoring_result_key
    from openforge.store import secret_hash

    spec = RolloutSpec(run_id="run", rollout_id="r", task=Task(id="t", prompt="p"), harness="h",
                       environment="e", reward="w", gateway_url="http://gw", session_token="tok",
                       session_id="s", scoring_token="the-scoring-credential")
    key = scoring_result_key(spec)
    assert key is not None
    result = RolloutResult(rollout_id="r", task_id="t", session_id="s", status="ok",
                           reward=RewardResult(score=1.0, passed=True))
    signed = compact_message(result, key)
    assert parse_result(signed, key) == result.model_copy(update={"harness_output": {}})
    # A resumed executor holds only the credential's hash (the store's): the same key.
    resumed = spec.model_copy(update={"scoring_token": "",
                                      "scoring_hash": secret_hash(spec.scoring_token)})
    assert scoring_result_key(resumed) == key
    assert "scoring_hash" not in resumed.model_dump()  # never sent into a Pod
    # Unsigned, signed with another key, or altered after signing: no result.
    assert parse_result(compact_message(result), key) is None
    assert parse_result(compact_message(result, b"k" * 32), key) is None
    assert parse_result(signed.replace('"score": 1.0', '"score": 0.9'), key) is None
    # The key is in no part of the Pod's spec digest, nor the credential it comes from.
    assert spec_digest(spec, KubernetesOptions(image="i")) == \
        spec_digest(resumed, KubernetesOptions(image="i"))


def _waiting(reason: str, message: str, name: str = "agent") -> dict[str, Any]:
    return {"status": {"phase": "Pending", "initContainerStatuses": [
        {"name": name, "state": {"waiting": {"reason": reason, "message": message}}}]}}


@pytest.mark.parametrize("reason,message,permanent", [
    ("ErrImagePull", 'failed to pull and unpack image "docker.io/x/y:1": failed to resolve '
     'reference "docker.io/x/y:1": docker.io/x/y:1: not found', True),
    ("ImagePullBackOff", 'Back-off pulling image "r/x": ErrImagePull: pull access denied, '
     "repository does not exist or may require authorization", True),
    ("ErrImagePull", "failed to authorize: failed to fetch anonymous token: 401 Unauthorized",
     True),
    ("InvalidImageName", 'couldn\'t parse image name "X": invalid reference format', True),
    ("ErrImagePull", "failed to copy: httpReadSeeker: failed open: unexpected status code "
     "https://registry-1.docker.io/v2/x/manifests/1: 429 Too Many Requests - Server message: "
     "toomanyrequests: You have reached your pull rate limit", False),
    ("ErrImagePull", "failed to do request: Head \"https://reg/v2/x\": dial tcp 10.0.0.1:443: "
     "i/o timeout", False),
    ("ImagePullBackOff", 'Back-off pulling image "r/x": ErrImagePull: 503 Service Unavailable',
     False),
])
def test_image_pull_errors_are_told_apart(reason: str, message: str, permanent: bool) -> None:
    problem = start_problem(_waiting(reason, message))
    assert problem is not None
    cause, transient = problem
    assert cause.permanent is permanent and transient is not permanent
    assert reason in cause.message


def test_a_container_that_cannot_start_is_permanent_and_initializing_is_not() -> None:
    problem = start_problem(_waiting("CreateContainerConfigError",
                                     "container has runAsNonRoot and image will run as root"))
    assert problem is not None and problem[0].permanent and "runAsNonRoot" in problem[0].message
    assert start_problem(_waiting("PodInitializing", "")) is None
    assert start_problem(_waiting("ContainerCreating", "")) is None


def _ended(reason: str = "", message: str = "", conditions: list[Any] | None = None,
           agent: dict[str, Any] | None = None) -> dict[str, Any]:
    killed = {"terminated": {"exitCode": 137, "reason": "Error"}}
    status: dict[str, Any] = {"phase": "Failed", "conditions": conditions or [],
                              "initContainerStatuses": [{"name": "agent",
                                                         "state": agent or killed}]}
    if reason:
        status.update(reason=reason, message=message)
    return {"status": status}


def test_pod_level_reasons_win_over_exit_codes() -> None:
    evicted = pod_level_cause(_ended("Evicted", "The node was low on resource: memory."))
    assert evicted is not None and evicted.status == "infra_error"
    assert evicted.message.startswith("evicted by its node (Evicted: The node was low")
    deadline = pod_level_cause(_ended("DeadlineExceeded", "Pod was active on the node longer "
                                      "than the specified deadline"))
    assert deadline is not None and deadline.status == "timeout"
    preempted = pod_level_cause(_ended(conditions=[{
        "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
        "message": "Preempted in order to admit critical pod"}]))
    assert preempted is not None and "preempted by the scheduler" in preempted.message
    oom = pod_level_cause(_ended(agent={"terminated": {"exitCode": 137, "reason": "OOMKilled"}}))
    assert oom is not None and "agent was OOMKilled" in oom.message
    assert pod_level_cause(_ended()) is None  # just an exit code: the executor says so


def test_node_loss_from_the_pod_and_from_the_node_watch_with_explicit_times() -> None:
    assert node_lost({"status": {"phase": "Unknown"}}) is not None
    assert node_lost({"status": {"phase": "Running", "reason": "NodeLost",
                                 "message": "Node n1 which was running pod p is unresponsive"}})
    assert node_lost({"status": {"phase": "Running"}}) is None
    watcher = NodeWatcher(api=None, resync_s=30)  # type: ignore[arg-type]  # state only
    watcher.synced.set()
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T10:00:00Z"}
    watcher.objects = {"n1": {"metadata": {"name": "n1"}, "status": {"conditions": [ready]}},
                       "n2": {"metadata": {"name": "n2"}, "status": {"conditions": [
                           {**ready, "status": "Unknown", "reason": "NodeStatusUnknown",
                            "message": "Kubelet stopped posting node status.",
                            "lastTransitionTime": "2026-11-30T10:00:00Z"}]}}}
    t0 = 1796032800.0  # 2026-11-30T10:00:00Z
    assert watcher.problem("n1", t0 + 999) is None
    since, why = watcher.problem("n2", t0 + 5) or (0.0, "")
    assert since == t0 and "node n2 is NotReady (Unknown: NodeStatusUnknown" in why
    # A node that vanished is lost from when it was first missed.
    since, why = watcher.problem("n3", t0 + 7) or (0.0, "")
    assert since == t0 + 7 and "node n3 no longer exists" in why
    assert (watcher.problem("n3", t0 + 20) or (0.0, ""))[0] == t0 + 7


def _api_error(status: int, message: str) -> ApiException:
    exc = ApiException(status=status, reason="x")
    exc.body = json.dumps({"kind": "Status", "message": message})
    return exc


@pytest.mark.parametrize("status,message,kind", [
    (403, 'pods "p" is forbidden: exceeded quota: q, requested: pods=1, used: pods=10, '
     "limited: pods=10", "wait"),
    (403, 'admission webhook "policy.example.com" denied the request: outside working hours',
     "wait"),
    (422, "pods \"p\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied "
     "request: paused", "wait"),
    (403, 'pods is forbidden: User "u" cannot create resource "pods" in API group ""',
     "permanent"),
    (422, 'Pod "p" is invalid: spec.containers[0].resources.requests[cpu]: Invalid value',
     "permanent"),
    (500, "etcdserver: request timed out", "error"),
])
def test_refusals_are_told_apart(status: int, message: str, kind: str) -> None:
    assert refusal(_api_error(status, message))[0] == kind
