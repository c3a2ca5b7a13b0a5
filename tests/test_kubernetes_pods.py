"""The Kubernetes executor's pure parts, no cluster: the Pod and Secret it builds, its
options, and how it reads a Pod's status (result, image pulls, Pod-level reasons, node
loss, API refusals). Times are explicit arguments here, so bounds are exact."""

from __future__ import annotations

import asyncio
import base64
import json
import selectors
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes_asyncio", reason="pip install 'openforge[kubernetes]'")

from kubernetes_asyncio.client import ApiClient, V1OwnerReference  # noqa: E402
from kubernetes_asyncio.client.exceptions import ApiException  # noqa: E402

from openforge import plugins  # noqa: E402
from openforge.executors import k8s_api  # noqa: E402
from openforge.executors.k8s_api import KubeApi, RateLimiter  # noqa: E402
from openforge.executors.k8s_pods import (  # noqa: E402
    KubernetesOptions,
    build_pod,
    build_secret,
    label_value,
    pod_name,
    spec_digest,
)
from openforge.executors.k8s_result import (  # noqa: E402
    agents_storage_eviction,
    compact_message,
    node_lost,
    parse_result,
    pod_level_cause,
    start_problem,
)
from openforge.executors.k8s_watch import WINDOWS_PER_LIST, Informer, NodeWatcher  # noqa: E402
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
    # The trusted containers keep the image's ENTRYPOINT (tini): only `args`. The agent's
    # launcher is its container's first process, which nothing inside can kill.
    for c in (supervisor, verifier):
        assert c["command"] is None
        assert c["args"][:3] == ["python", "-m", "openforge.executors.k8s_sandbox"]
    assert agent["command"] == ["python", "-m", "openforge.executors.k8s_sandbox", "agent"]
    assert agent["args"] is None
    for c in (supervisor, agent, verifier):
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


def test_hidden_folders_are_empty_and_read_only_in_the_agents_container_only() -> None:
    hidden = ["/usr/lib/python3/site-packages/env_pkg/solutions",
              "/usr/lib/python3/site-packages/env_pkg/tasks"]
    owner = V1OwnerReference(api_version="v1", kind="Secret", name=pod_name(_spec()), uid="u")
    podspec = build_pod(_spec(), KubernetesOptions(image="i"), owner, hidden=hidden).to_dict()["spec"]
    supervisor, agent = podspec["init_containers"]
    [verifier] = podspec["containers"]
    covers = [(m["mount_path"], m["read_only"], m["name"]) for m in agent["volume_mounts"]
              if m["name"].startswith("hidden-")]
    assert covers == [(hidden[0], True, "hidden-0"), (hidden[1], True, "hidden-1")]
    volumes = {v["name"]: v for v in podspec["volumes"]}
    assert all(volumes[name]["empty_dir"] is not None for _, _, name in covers)
    # The trusted containers see the installation as it is (a checker reads the answers);
    # the supervisor knows what the agent's container empties, to check it.
    for c in (supervisor, verifier):
        assert not any(m["name"].startswith("hidden-") for m in c["volume_mounts"])
    supervisor_env = {e["name"]: e["value"] for e in supervisor["env"]}
    assert json.loads(supervisor_env["OPENFORGE_HIDDEN_PATHS"]) == hidden


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
    podspec = _pod_dict(_spec(), options)["spec"]
    verifier = podspec["containers"][0]
    assert verifier["command"] == ["/usr/bin/tini", "-g", "--"]
    assert verifier["args"][0] == "/opt/venv/bin/python"
    # Not the agent's: its launcher stays the container's first process.
    agent = podspec["init_containers"][1]
    assert agent["command"][:2] == ["/opt/venv/bin/python", "-m"] and agent["args"] is None


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


def _kubeconfig(tmp_path: Path) -> str:
    """A kubeconfig naming an API server nobody listens on."""
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    return str(config)


async def test_unreachable_api_is_an_infra_error(tmp_path: Path) -> None:
    executor = KubernetesExecutor(image="i", kubeconfig=_kubeconfig(tmp_path), api_retries=0)
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


@pytest.mark.parametrize("jitter", [0.0, 0.999])
async def test_retries_never_come_back_before_retry_after_on_a_fake_clock(
        jitter: float, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    def busy(retry_after: str | None) -> ApiException:
        exc = ApiException(status=429, reason="Too Many Requests")
        exc.headers = {"Retry-After": retry_after} if retry_after is not None else {}
        return exc

    refusals = [busy("3"), busy("30"), busy(None), busy("0")]

    async def call() -> str:
        if refusals:
            raise refusals.pop(0)
        return "done"

    monkeypatch.setattr(k8s_api.random, "random", lambda: jitter)
    api = KubeApi(object(), "default", retries=5, backoff_s=1.0,  # type: ignore[arg-type]
                  backoff_max_s=10.0, sleep=sleep)
    assert await api.call("create", call) == "done"
    # Our own backoff (1, 2, 4, 8 s, capped at 10) is jittered down to half; a Retry-After
    # is a floor, past our cap too, and the jitter only adds to it (up to half the backoff).
    floors = [3.0, 30.0, 4.0 * 0.5, 0.0]
    ceilings = [3.0 + 0.5, 30.0 + 1.0, 4.0, 0.0 + 4.0]
    assert all(f <= s <= c for f, s, c in zip(floors, slept, ceilings, strict=True)), slept
    if jitter == 0.0:
        assert slept == floors  # exactly what the server asked, not half of it


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
    oom_killed = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    # The agent's own container is the agent's doing: the executor judges it on the
    # session's recorded calls. A trusted container's is the infrastructure's.
    assert pod_level_cause(_ended(agent=oom_killed)) is None
    pod = _ended()
    pod["status"]["initContainerStatuses"].insert(0, {"name": "supervisor", "state": oom_killed})
    oom = pod_level_cause(pod)
    assert oom is not None and "supervisor was OOMKilled" in oom.message
    assert pod_level_cause(_ended()) is None  # just an exit code: the executor says so


def test_the_volumes_the_agent_writes_have_a_size_limit() -> None:
    volumes = {v["name"]: v for v in _pod_dict(_spec(), KubernetesOptions(image="i"))["spec"][
        "volumes"]}
    # Past it the kubelet evicts this Pod alone, before the node's disk fills.
    assert volumes["workspace"]["empty_dir"]["size_limit"] == "10Gi"
    assert volumes["agent"]["empty_dir"]["size_limit"] == "4Gi"
    assert volumes["trusted"]["empty_dir"]["size_limit"] is None  # the agent cannot write it
    options = KubernetesOptions(image="i", workspace_size_limit="50Gi", agent_size_limit=None)
    volumes = {v["name"]: v for v in _pod_dict(_spec(), options)["spec"]["volumes"]}
    assert volumes["workspace"]["empty_dir"]["size_limit"] == "50Gi"
    assert volumes["agent"]["empty_dir"]["size_limit"] is None
    with pytest.raises(ValueError, match="workspace_size_limit"):
        KubernetesOptions(image="i", workspace_size_limit="10 GB")


async def _evicted(message: str) -> dict[str, Any]:
    """A Pod built as the executor builds it (as the API server has it: camelCase), evicted
    by its kubelet with `message`."""
    owner = V1OwnerReference(api_version="v1", kind="Secret", name=pod_name(_spec()), uid="u")
    async with ApiClient() as api:
        pod = api.sanitize_for_serialization(
            build_pod(_spec(), KubernetesOptions(image="i"), owner, hidden=["/opt/env/keys"]))
    return {**pod, **_ended("Evicted", message)}


# The kubelet's own messages (pkg/kubelet/eviction/helpers.go), with their trailing space.
@pytest.mark.parametrize("message, agents", [
    ('Usage of EmptyDir volume "workspace" exceeds the limit "10Gi". ', True),
    ('Usage of EmptyDir volume "agent" exceeds the limit "4Gi". ', True),
    ('Container agent exceeded its local ephemeral storage limit "1Gi". ', True),
    # What trusted code writes, or a volume the agent mounts read-only, is not the agent's.
    ('Usage of EmptyDir volume "trusted" exceeds the limit "1Gi". ', False),
    ('Usage of EmptyDir volume "hidden-0" exceeds the limit "1Mi". ', False),
    ('Container supervisor exceeded its local ephemeral storage limit "1Gi". ', False),
    ('Pod ephemeral local storage usage exceeds the total limit of containers 4Gi. ', False),
    # The node ran low, whoever used it: even naming the agent's container.
    ("The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: "
     "9Gi. Container agent was using 30Gi, request is 0, has larger consumption of "
     "ephemeral-storage. ", False),
    ('The node had condition: [DiskPressure]. Usage of EmptyDir volume "workspace" exceeds '
     'the limit "10Gi". ', False),
])
async def test_an_eviction_for_the_agents_own_storage_is_told_apart(message: str,
                                                                    agents: bool) -> None:
    pod = await _evicted(message)
    own = agents_storage_eviction(pod)
    cause = pod_level_cause(pod)
    if agents:  # judged by the executor on the session's calls, like an OOM-killed agent
        assert own is not None and f"(Evicted: {message.strip()})" in own and cause is None
    else:
        assert own is None
        assert cause is not None and cause.status == "infra_error"
        assert cause.message.startswith("evicted by its node (Evicted: ")


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


# -- bounds in time, on a virtual clock -------------------------------------------------------


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on a virtual clock: whenever no callback is ready, its time jumps to the
    next timer. A wait of a minute takes none, and a bound in time is met exactly, whatever
    the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0
        loop = self

        class Selector(selectors.DefaultSelector):
            def select(self, timeout: float | None = None) -> Any:
                ready = super().select(0)
                if not ready and timeout is None:
                    raise RuntimeError("every task waits, and no timer is set: a deadlock")
                if not ready:
                    loop.now += timeout or 0.0  # nothing to do until the next timer
                return ready

        super().__init__(Selector())

    def time(self) -> float:
        return self.now


T0 = 1796032800.0  # 2026-11-30T10:00:00Z: the API server's clock at virtual time 0


def _node(ready: str, since: float) -> dict[str, Any]:
    stamp = datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": {"name": "n1"}, "status": {"conditions": [
        {"type": "Ready", "status": ready, "reason": "NodeStatusUnknown",
         "message": "Kubelet stopped posting node status.", "lastTransitionTime": stamp}]}}


_RUNNING = {"metadata": {"name": "p", "uid": "u-1"}, "spec": {"nodeName": "n1"},
            "status": {"phase": "Running", "initContainerStatuses": [
                {"name": "agent", "state": {"running": {}}}]}}


def _failed(status: str, error: str, permanent: bool = False) -> RolloutResult:
    return RolloutResult(rollout_id="r", status=status,  # type: ignore[arg-type]
                         error=error, permanent=permanent)


@pytest.mark.parametrize("loss,cause", [
    ("its node turns NotReady", "node n1 is NotReady (Unknown: NodeStatusUnknown"),
    ("the node watch brings that 30 s late", "node n1 is NotReady (Unknown: NodeStatusUnknown"),
    ("its node is deleted", "node n1 no longer exists"),
    ("its phase turns Unknown", "phase Unknown (its node stopped reporting)"),
])
def test_node_loss_fails_the_attempt_at_its_bound_on_a_virtual_clock(
        loss: str, cause: str, tmp_path: Path) -> None:
    """A running Pod whose node is lost at 10 s fails at 10 s + node_lost_s: not a moment
    before, and at it even when no event comes then (the bound counts from the loss)."""
    loop = VirtualTimeLoop()

    async def scenario() -> RolloutResult:
        executor = KubernetesExecutor(image="i", kubeconfig=_kubeconfig(tmp_path),
                                      node_lost_s=60)
        executor.clock = lambda: T0 + loop.time()
        nodes = NodeWatcher(api=None, resync_s=30)  # type: ignore[arg-type]  # state only
        nodes.synced.set()
        nodes.objects = {"n1": _node("True", T0)}
        executor._nodes = nodes
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        following = asyncio.create_task(executor._follow(
            _spec(timeout_s=3600), "p", _RUNNING, queue, _failed))
        await asyncio.sleep(10)
        if loss == "its phase turns Unknown":
            queue.put_nowait(("pod", {**_RUNNING, "status": {**_RUNNING["status"],
                                                           "phase": "Unknown"}}))
        else:  # what the Node watch does, then tells the Pods on that node
            if loss == "its node is deleted":
                del nodes.objects["n1"]
            else:
                nodes.objects["n1"] = _node("Unknown", T0 + 10)
            if loss == "the node watch brings that 30 s late":
                await asyncio.sleep(30)
            queue.put_nowait(("node", _RUNNING))
        await asyncio.sleep(69 - loop.time())
        assert not following.done()  # 59 s after the loss: still running
        result = await following
        assert loop.time() == 70.0  # at the bound, exactly
        return result

    try:
        result = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert result.status == "infra_error" and not result.permanent
    assert f"lost with its node: {cause}" in (result.error or "")
    assert "for 60s or more (node_lost_s)" in (result.error or "")


class _PodUnderOurName:
    """The calls `_replace` makes, answered on a virtual clock: the Pod stays until it is
    force-deleted (its node does not answer), or goes at `ends_at` (its kubelet finishes a
    graceful delete)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ends_at: float | None = None) -> None:
        self.loop, self.ends_at, self.there = loop, ends_at, True
        self.calls: list[tuple[float, str, int | None]] = []

    async def delete_pod(self, name: str, grace_s: int | None = None) -> bool:
        self.calls.append((self.loop.time(), "delete Pod", grace_s))
        self.there = self.there and grace_s != 0
        return True

    async def read_pod(self, name: str) -> dict[str, Any] | None:
        if self.ends_at is not None and self.loop.time() >= self.ends_at:
            self.there = False
        return {"metadata": {"name": name}} if self.there else None

    async def delete_secret(self, name: str) -> bool:
        self.calls.append((self.loop.time(), "delete Secret", None))
        return True


@pytest.mark.parametrize("ends_at", [None, 2.2])
def test_a_pod_under_our_name_is_deleted_gracefully_then_forced_on_a_virtual_clock(
        ends_at: float | None, tmp_path: Path) -> None:
    loop = VirtualTimeLoop()
    executor = KubernetesExecutor(image="i", kubeconfig=_kubeconfig(tmp_path), backoff_s=0.5,
                                  termination_grace_s=5, force_delete_after_s=10)
    pod = _PodUnderOurName(loop, ends_at)
    try:
        loop.run_until_complete(executor._replace(pod, "p", node="n1"))  # type: ignore[arg-type]
    finally:
        loop.close()
    if ends_at is None:  # graceful first; forced only 5 + 10 s later; the Secret after it
        assert pod.calls == [(0.0, "delete Pod", None), (15.0, "delete Pod", 0),
                             (15.0, "delete Secret", None)]
        assert executor.stats["force_deleted"] == 1
    else:  # gone at the first look (every backoff_s) after its kubelet finished: no force
        assert pod.calls == [(0.0, "delete Pod", None), (2.5, "delete Secret", None)]
        assert executor.stats["force_deleted"] == 0


async def test_a_shared_watch_lists_again_after_every_two_windows() -> None:
    """The informer's cycle, window by window: each watch here ends as a server ends a
    window (after one event), so no clock is involved."""
    reads: list[tuple[str, str]] = []  # ("list", "") / ("watch", the version it resumes from)
    open_watches, most_open = [0], [0]
    version = [0]
    enough = asyncio.Event()

    class Api:  # what the informer calls, answering at once
        async def list_objects(self, resource: str, selector: str) -> tuple[list[Any], str]:
            reads.append(("list", ""))
            if len(reads) > 3 * (1 + WINDOWS_PER_LIST):
                enough.set()
                await asyncio.Event().wait()  # hold here until stopped
            version[0] += 1
            return [{"metadata": {"name": "p"}}], str(version[0])

        async def watch_objects(self, resource: str, selector: str, rv: str,
                                timeout_s: float) -> AsyncIterator[dict[str, Any]]:
            reads.append(("watch", rv))
            open_watches[0] += 1
            most_open[0] = max(most_open[0], open_watches[0])
            try:
                version[0] += 1
                yield {"type": "MODIFIED", "object": {"metadata": {
                    "name": "p", "resourceVersion": str(version[0])}}}
            finally:
                open_watches[0] -= 1

    informer = Informer(Api(), "pods", "run=x", resync_s=30)  # type: ignore[arg-type]
    informer.start()
    await asyncio.wait_for(enough.wait(), 60)  # a hang guard
    await informer.stop()
    # A list, then two windows, the second resuming from the version the first saw last;
    # then a list again. One watch open at a time.
    assert reads == [("list", ""), ("watch", "1"), ("watch", "2")] + \
        [("list", ""), ("watch", "4"), ("watch", "5")] + \
        [("list", ""), ("watch", "7"), ("watch", "8"), ("list", "")]
    assert WINDOWS_PER_LIST == 2 and most_open == [1]


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
