"""The Kubernetes executor's options, and the Secret and Pod it creates for one attempt.

One bare Pod per attempt (`restartPolicy: Never`; the runner owns retries), three containers
(see `k8s_sandbox`): a trusted `supervisor` sidecar, the `agent` init container that runs
only the harness, and the trusted `verifier`, the one container whose termination message
the executor reads. The spec, with the session token and the scoring credential (from which
the result's signing key is derived), travels in a Secret of the same name,
never in the Pod spec (anyone who may `get pods` would read it); only the supervisor mounts
it. Ownership runs `run ConfigMap -> Secret -> Pod`: deleting the Secret lets the garbage
collector delete the Pod gracefully, and deleting the run's ConfigMap removes everything.

Names are deterministic in the attempt's identity (run, rollout id, attempt), so a restarted
orchestrator finds the Pod it made before; labels select a run's objects for the watch, the
sweep and `--resume`; full ids live in annotations (label values hold 63 characters).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from kubernetes_asyncio.client import models as k8s
from pydantic import Field

from openforge.executors.k8s_sandbox import AGENT, READY, SUPERVISOR, VERIFIER
from openforge.options import PluginOptions
from openforge.sandbox.protocol import (
    AGENT_DIR_ENV,
    HIDDEN_ENV,
    SPEC_FILE_ENV,
    TERMINATION_LOG_ENV,
    TRUSTED_DIR_ENV,
    WORKSPACE_ENV,
)
from openforge.types import RolloutSpec

MANAGED_BY = "app.kubernetes.io/managed-by"
RUN_LABEL = "openforge.io/run-id"
ROLLOUT_LABEL = "openforge.io/rollout-id"
TASK_LABEL = "openforge.io/task-id"
ATTEMPT_LABEL = "openforge.io/attempt"
DIGEST_ANNOTATION = "openforge.io/spec-digest"
TERMINATION_LOG = "/dev/termination-log"
SPEC_KEY = "spec.json"
# Where each volume is mounted, in the containers that mount it.
MOUNTS = {"workspace": "/openforge/workspace", "agent": "/openforge/agent",
          "trusted": "/openforge/trusted", "spec": "/openforge/spec"}
# A resource quantity as the API server takes it ("10Gi", "500M", "1e9").
_QUANTITY = r"^[0-9]+(\.[0-9]+)?([KMGTPE]i|[kMGTPE]|[eE][0-9]+)?$"
# A Secret holds at most 1 MiB (base64 of the spec, plus the object's metadata).
MAX_SPEC_BYTES = 700_000


class KubernetesOptions(PluginOptions):
    """Options of the `kubernetes` executor (`executor_options` in the run config)."""

    image: str
    """the rollout image, see deploy/kubernetes/Dockerfile; digest-pinned ideally"""
    kubeconfig: Path | None = None
    """The kubeconfig file; None: the in-cluster service account, else $KUBECONFIG or
    ~/.kube/config."""
    context: str | None = None
    """The kubeconfig context (None: its current one)."""
    namespace: str = "default"
    """Where the attempts' Secrets and Pods and the run's owner ConfigMap go."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """The containers' imagePullPolicy."""
    image_pull_secrets: list[str] = Field(default_factory=list)
    """Names of Secrets the kubelet pulls the image with."""
    python: str = "python"
    """The image's Python: the trusted containers' `args` are `PYTHON -m
    openforge.executors.k8s_sandbox ROLE`, under the image's own ENTRYPOINT (e.g. tini); the
    agent container's `command` is that, its first process (PID 1: see k8s_sandbox)."""
    entrypoint: list[str] | None = None
    """Replaces the image's ENTRYPOINT of the trusted containers when set (their `command`)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables added to the agent container."""
    gateway_url: str | None = None
    """The gateway URL as Pods must reach it (a Service); None: the runner's own URL."""
    requests: dict[str, str] = Field(default_factory=lambda: {"cpu": "1", "memory": "1Gi"})
    """The agent container's resource requests (it runs the harness)."""
    limits: dict[str, str] = Field(default_factory=lambda: {"memory": "4Gi"})
    """The agent container's resource limits."""
    supervisor_requests: dict[str, str] = Field(
        default_factory=lambda: {"cpu": "100m", "memory": "256Mi"})
    """The supervisor's resource requests (it runs the environment's services)."""
    supervisor_limits: dict[str, str] = Field(default_factory=dict)
    """The supervisor's resource limits."""
    workspace_size_limit: str | None = Field("10Gi", pattern=_QUANTITY)
    """The workspace volume's sizeLimit (the agent writes it; the task's files count too).
    Past it the kubelet evicts this Pod alone, and that counts as the agent's own end
    (docs/sandboxing.md); None: no limit, the agent may fill its node's disk."""
    agent_size_limit: str | None = Field("4Gi", pattern=_QUANTITY)
    """The agent volume's sizeLimit (the agent's HOME and the harness's output), likewise."""
    runtime_class: str | None = None
    """The Pods' runtimeClassName (gVisor or Kata for untrusted agent code)."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """The Pods' nodeSelector."""
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    """The Pods' tolerations, as written in a manifest."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels added to every Pod and Secret."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations added to every Pod."""
    max_concurrency: int = Field(64, ge=1)
    """Pods in flight at most."""
    create_qps: float = Field(20.0, gt=0)
    """Pod creations per second at most (a token bucket)."""
    create_burst: int = Field(10, ge=1)
    """Pod creations at once at most."""
    pending_timeout_s: float = Field(600.0, gt=0)
    """Seconds a Pod may take to start: scheduling, image pull, preparing."""
    image_pull_timeout_s: float = Field(300.0, gt=0)
    """Seconds transient image-pull errors are waited out, at most."""
    admission_wait_s: float = Field(600.0, ge=0)
    """Seconds quota and admission refusals are waited out, at most."""
    node_lost_s: float = Field(60.0, gt=0)
    """A node NotReady or gone, or a Pod in phase Unknown, this long fails the attempt."""
    watch_nodes: bool = True
    """Watch Nodes to see a lost node (needs nodes get/list/watch:
    deploy/kubernetes/rbac.yaml)."""
    kill_margin_s: float = Field(30.0, ge=0)
    """Seconds the executor waits past the rollout timeout before it deletes the Pod."""
    deadline_slack_s: float = Field(15.0, ge=0)
    """activeDeadlineSeconds is pending_timeout_s + the rollout timeout + this."""
    termination_grace_s: int = Field(5, ge=0)
    """The Pods' terminationGracePeriodSeconds: SIGTERM to SIGKILL."""
    force_delete_after_s: float = Field(10.0, ge=0)
    """Past the grace period, a Pod still there after this is force-deleted."""
    resync_s: float = Field(30.0, gt=0)
    """A full list of the run's Pods (and of Nodes) at least this often."""
    api_retries: int = Field(5, ge=0)
    """Retries of an API call that failed transiently (409 Conflict, 429, 5xx)."""
    backoff_s: float = Field(0.5, gt=0)
    """The first back-off of a retried call, doubled each time (also the quota wait's)."""
    backoff_max_s: float = Field(10.0, gt=0)
    """The longest back-off."""
    adopt_window_s: float = Field(60.0, ge=0)
    """After a restart, how long Pods an earlier orchestrator left wait to be claimed."""
    owner_reference: bool = True
    """Own the run's Secrets (and so its Pods) by a per-run ConfigMap."""
    log_tail_lines: int = Field(50, ge=1)
    """Lines of the verifier's log read when its termination message holds no result."""


def _snake_keys(manifest: dict[str, Any]) -> dict[str, Any]:
    """`tolerationSeconds` (as written in YAML manifests) -> `toleration_seconds` (the model's)."""
    return {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): v for k, v in manifest.items()}


def _slug(text: str, limit: int) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return slug[:limit].strip("-")


def _digest(*parts: str, size: int = 10) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:size]


def label_value(text: str) -> str:
    """`text` as a valid label value: itself when it fits, else a slug plus a hash."""
    if len(text) <= 63 and re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", text):
        return text
    return (_slug(text, 50) + "-" + _digest(text)).strip("-")


def pod_name(spec: RolloutSpec) -> str:
    """`of-<rollout slug>-a<attempt>-<hash>`: deterministic, a DNS label (<= 63 chars).

    The rollout id names one try of one attempt; a resumed run that continues the same try
    reuses it (and so the name), which is how it finds the Pod again.
    """
    return f"of-{_slug(spec.rollout_id, 36) or 'r'}-a{spec.attempt}-" \
           f"{_digest(spec.run_id, spec.rollout_id, str(spec.attempt))}"


def owner_name(run_id: str) -> str:
    """The per-run ConfigMap that owns the run's Secrets (and, through them, its Pods)."""
    return f"openforge-run-{_slug(run_id, 30) or 'run'}-{_digest(run_id, size=8)}"


def run_selector(run_id: str) -> str:
    return f"{MANAGED_BY}=openforge,{RUN_LABEL}={label_value(run_id)}"


def in_pod_spec(spec: RolloutSpec, options: KubernetesOptions) -> RolloutSpec:
    """The spec as the Pod gets it: the gateway as Pods reach it."""
    if options.gateway_url is None:
        return spec
    return spec.model_copy(update={"gateway_url": options.gateway_url})


def spec_digest(spec: RolloutSpec, options: KubernetesOptions) -> str:
    """Identifies the exact attempt a Pod was made for: only that attempt may adopt it.

    Credentials are left out: a resumed runner names the try by its rollout id and session,
    and may no longer hold the token in clear (the Pod's Secret does).
    """
    bare = in_pod_spec(spec, options).model_copy(update={"session_token": "",
                                                         "scoring_token": ""})
    return _digest(bare.model_dump_json(), size=16)


def deadline_seconds(spec: RolloutSpec, options: KubernetesOptions) -> int:
    """activeDeadlineSeconds: the server-side backstop, counted from the Pod's start."""
    return max(1, math.ceil(options.pending_timeout_s + spec.timeout_s + options.deadline_slack_s))


def _labels(spec: RolloutSpec, options: KubernetesOptions) -> dict[str, str]:
    return {**options.labels, MANAGED_BY: "openforge", RUN_LABEL: label_value(spec.run_id),
            ROLLOUT_LABEL: label_value(spec.rollout_id), TASK_LABEL: label_value(spec.task.id),
            ATTEMPT_LABEL: str(spec.attempt)}


def build_secret(spec: RolloutSpec, options: KubernetesOptions,
                 owner: k8s.V1OwnerReference | None) -> k8s.V1Secret:
    """The attempt's Secret: the spec, session token included, for the supervisor only."""
    spec_json = in_pod_spec(spec, options).model_dump_json()
    if len(spec_json.encode()) > MAX_SPEC_BYTES:
        raise ValueError(f"the rollout spec is {len(spec_json.encode())} bytes; a Secret "
                         f"holds at most {MAX_SPEC_BYTES}: keep task data small (point at "
                         "files the image or a volume provides)")
    return k8s.V1Secret(
        api_version="v1", kind="Secret", type="Opaque",
        metadata=k8s.V1ObjectMeta(name=pod_name(spec), namespace=options.namespace,
                                  labels=_labels(spec, options),
                                  owner_references=[owner] if owner else None),
        data={SPEC_KEY: base64.b64encode(spec_json.encode()).decode()})


def _mount(volume: str, read_only: bool = False) -> k8s.V1VolumeMount:
    return k8s.V1VolumeMount(name=volume, mount_path=MOUNTS[volume], read_only=read_only or None)


def _hardened() -> k8s.V1SecurityContext:
    return k8s.V1SecurityContext(allow_privilege_escalation=False, run_as_non_root=True,
                                 capabilities=k8s.V1Capabilities(drop=["ALL"]))


def _hidden(paths: Sequence[str]) -> tuple[list[k8s.V1Volume], list[k8s.V1VolumeMount]]:
    """An empty read-only folder over each hidden path, for the agent's container: its file
    system is the image's, so an answer key the environment ships in its installed package
    is there unless covered."""
    volumes = [k8s.V1Volume(name=f"hidden-{i}", empty_dir=k8s.V1EmptyDirVolumeSource(
        medium="Memory", size_limit="1Mi")) for i in range(len(paths))]
    mounts = [k8s.V1VolumeMount(name=f"hidden-{i}", mount_path=path, read_only=True)
              for i, path in enumerate(paths)]
    return volumes, mounts


def build_pod(spec: RolloutSpec, options: KubernetesOptions,
              secret: k8s.V1OwnerReference | None, hidden: Sequence[str] = ()) -> k8s.V1Pod:
    """The Pod for one attempt, built from typed models (a misspelled field fails here).

    `secret` is the attempt's Secret as an owner reference (None only in tests that build
    a Pod on its own): the Pod goes when the Secret does. `hidden`: the environment's hidden
    folders (`Environment.hidden_paths`, absolute), empty in the agent's container; the
    supervisor checks they are the ones it finds in the image.
    """
    hidden_volumes, hidden_mounts = _hidden(hidden)
    def role(name: str) -> dict[str, Any]:
        return {"name": name, "image": options.image,
                "image_pull_policy": options.image_pull_policy,
                "command": list(options.entrypoint) if options.entrypoint else None,
                "args": [options.python, "-m", "openforge.executors.k8s_sandbox", name],
                "security_context": _hardened()}

    def env(values: dict[str, str]) -> list[k8s.V1EnvVar]:
        return [k8s.V1EnvVar(name=k, value=v) for k, v in values.items()]

    paths = {WORKSPACE_ENV: MOUNTS["workspace"], AGENT_DIR_ENV: MOUNTS["agent"]}
    supervisor = k8s.V1Container(
        **role(SUPERVISOR), restart_policy="Always",  # a native sidecar
        env=env({**paths, TRUSTED_DIR_ENV: MOUNTS["trusted"],
                 SPEC_FILE_ENV: f"{MOUNTS['spec']}/{SPEC_KEY}", "PYTHONUNBUFFERED": "1",
                 HIDDEN_ENV: json.dumps(list(hidden))}),
        volume_mounts=[_mount("workspace"), _mount("agent"), _mount("trusted"),
                       _mount("spec", read_only=True)],
        resources=k8s.V1ResourceRequirements(requests=options.supervisor_requests or None,
                                             limits=options.supervisor_limits or None),
        # The agent starts once this passes: the workspace and services are ready.
        startup_probe=k8s.V1Probe(
            _exec=k8s.V1ExecAction(command=["test", "-e", f"{MOUNTS['trusted']}/{READY}"]),
            period_seconds=1, failure_threshold=max(1, math.ceil(options.pending_timeout_s))))
    # The launcher is the agent container's first process, not under the image's init:
    # as PID 1 nothing the agent runs can kill it (k8s_sandbox.run_agent).
    agent = k8s.V1Container(
        **{**role(AGENT), "command": [options.python, "-m", "openforge.executors.k8s_sandbox",
                                      AGENT], "args": None},
        env=env({**dict(sorted(options.env.items())), **paths,
                 "HOME": f"{MOUNTS['agent']}/home", "PYTHONUNBUFFERED": "1"}),
        volume_mounts=[_mount("workspace"), _mount("agent"), *hidden_mounts],
        resources=k8s.V1ResourceRequirements(requests=options.requests or None,
                                             limits=options.limits or None))
    verifier = k8s.V1Container(
        **role(VERIFIER),
        env=env({TRUSTED_DIR_ENV: MOUNTS["trusted"], TERMINATION_LOG_ENV: TERMINATION_LOG}),
        volume_mounts=[_mount("trusted")],
        resources=k8s.V1ResourceRequirements(requests={"cpu": "10m", "memory": "32Mi"}),
        termination_message_path=TERMINATION_LOG,
        termination_message_policy="FallbackToLogsOnError")
    annotations = {**options.annotations, "openforge.io/run-id-full": spec.run_id,
                   "openforge.io/rollout-id-full": spec.rollout_id,
                   "openforge.io/task-id-full": spec.task.id,
                   DIGEST_ANNOTATION: spec_digest(spec, options)}
    def empty(size_limit: str | None = None) -> k8s.V1EmptyDirVolumeSource:
        return k8s.V1EmptyDirVolumeSource(size_limit=size_limit)

    return k8s.V1Pod(
        api_version="v1", kind="Pod",
        metadata=k8s.V1ObjectMeta(name=pod_name(spec), namespace=options.namespace,
                                  labels=_labels(spec, options), annotations=annotations,
                                  owner_references=[secret] if secret else None),
        spec=k8s.V1PodSpec(
            restart_policy="Never", init_containers=[supervisor, agent],
            containers=[verifier],
            # The volumes the agent writes have a size limit: past it the kubelet evicts
            # this Pod alone (not its neighbours when the node's disk fills), and soon.
            volumes=[k8s.V1Volume(name="workspace",
                                  empty_dir=empty(options.workspace_size_limit)),
                     k8s.V1Volume(name="agent", empty_dir=empty(options.agent_size_limit)),
                     k8s.V1Volume(name="trusted", empty_dir=empty()),
                     # Readable by the image's user whoever it is: only the supervisor
                     # mounts it.
                     k8s.V1Volume(name="spec", secret=k8s.V1SecretVolumeSource(
                         secret_name=pod_name(spec), default_mode=0o444,
                         items=[k8s.V1KeyToPath(key=SPEC_KEY, path=SPEC_KEY)])),
                     *hidden_volumes],
            active_deadline_seconds=deadline_seconds(spec, options),
            termination_grace_period_seconds=options.termination_grace_s,
            automount_service_account_token=False, enable_service_links=False,
            security_context=k8s.V1PodSecurityContext(
                seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault")),
            runtime_class_name=options.runtime_class,
            node_selector=options.node_selector or None,
            tolerations=[k8s.V1Toleration(**_snake_keys(t)) for t in options.tolerations] or None,
            image_pull_secrets=[k8s.V1LocalObjectReference(name=n)
                                for n in options.image_pull_secrets] or None))
