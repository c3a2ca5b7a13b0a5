"""The Kubernetes executor's options and the Pod it creates for one rollout attempt.

One bare Pod per attempt (`restartPolicy: Never`; the runner owns retries). The name is
deterministic in (run, rollout, attempt), so an orchestrator that restarts finds the Pod it
created before; labels select a run's Pods for the watch, the sweep and `--resume`; full
ids live in annotations (label values are limited to 63 characters). The spec travels in an
env var: a Pod cannot read the orchestrator's disk.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Any, Literal

from kubernetes_asyncio.client import models as k8s
from pydantic import BaseModel, ConfigDict, Field

from openforge.sandbox.protocol import (
    POD_NAME_ENV,
    PROXY_URL_ENV,
    ROLLOUT_ID_ENV,
    SPEC_ENV,
    TERMINATION_LOG_ENV,
)
from openforge.types import RolloutSpec

MANAGED_BY = "app.kubernetes.io/managed-by"
RUN_LABEL = "openforge.io/run-id"
ROLLOUT_LABEL = "openforge.io/rollout-id"
ATTEMPT_LABEL = "openforge.io/attempt"
DIGEST_ANNOTATION = "openforge.io/spec-digest"
CONTAINER = "rollout"
TERMINATION_LOG = "/dev/termination-log"
# One env string must stay under Linux's MAX_ARG_STRLEN (128 KiB) or exec fails in the Pod.
MAX_SPEC_BYTES = 120_000


class KubernetesOptions(BaseModel):
    """Options of the `kubernetes` executor (`executor_options` in the run config)."""

    model_config = ConfigDict(extra="forbid")

    image: str  # the rollout image (deploy/kubernetes/Dockerfile), digest-pinned ideally
    kubeconfig: Path | None = None  # None: in-cluster service account, else $KUBECONFIG
    context: str | None = None
    namespace: str = "default"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: list[str] = Field(default_factory=list)
    command: list[str] = Field(default_factory=lambda: ["python", "-m", "openforge.rollout"],
                               min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    # The gateway URL as Pods must reach it (a Service); default: the runner's own URL.
    gateway_url: str | None = None
    requests: dict[str, str] = Field(default_factory=lambda: {"cpu": "1", "memory": "1Gi"})
    limits: dict[str, str] = Field(default_factory=lambda: {"memory": "4Gi"})
    runtime_class: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    max_concurrency: int = Field(64, ge=1)  # Pods in flight
    create_qps: float = Field(20.0, gt=0)  # Pod creations per second (token bucket)
    create_burst: int = Field(10, ge=1)
    pending_timeout_s: float = Field(600.0, gt=0)  # scheduling + image pull
    kill_margin_s: float = Field(30.0, ge=0)  # client-side wait past the run timeout
    deadline_slack_s: float = Field(15.0, ge=0)  # activeDeadlineSeconds past the timeouts
    termination_grace_s: int = Field(5, ge=0)
    resync_s: float = Field(30.0, gt=0)  # watch window; a fresh list after each
    api_retries: int = Field(5, ge=0)
    backoff_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(10.0, gt=0)
    adopt_window_s: float = Field(60.0, ge=0)  # how long found Pods wait to be claimed
    owner_reference: bool = True
    log_tail_lines: int = Field(50, ge=1)


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
    """`of-<rollout slug>-a<attempt>-<hash>`: deterministic, a DNS label (<= 63 chars)."""
    return f"of-{_slug(spec.rollout_id, 36) or 'r'}-a{spec.attempt}-" \
           f"{_digest(spec.run_id, spec.rollout_id, str(spec.attempt))}"


def owner_name(run_id: str) -> str:
    """The per-run ConfigMap that owns the run's Pods (deleting it garbage-collects them)."""
    return f"openforge-run-{_slug(run_id, 30) or 'run'}-{_digest(run_id, size=8)}"


def run_selector(run_id: str) -> str:
    return f"{MANAGED_BY}=openforge,{RUN_LABEL}={label_value(run_id)}"


def spec_digest(spec: RolloutSpec) -> str:
    """Identifies the exact attempt a Pod was made for: only that attempt may adopt it."""
    return _digest(spec.model_dump_json(), size=16)


def deadline_seconds(spec: RolloutSpec, options: KubernetesOptions) -> int:
    """activeDeadlineSeconds: the server-side backstop, counted from the Pod's start."""
    return max(1, math.ceil(options.pending_timeout_s + spec.timeout_s + options.deadline_slack_s))


def build_pod(spec: RolloutSpec, options: KubernetesOptions,
              owner: k8s.V1OwnerReference | None) -> k8s.V1Pod:
    """The Pod for one attempt, built from typed models (a misspelled field fails here)."""
    in_pod = spec if options.gateway_url is None else \
        spec.model_copy(update={"gateway_url": options.gateway_url})
    spec_json = in_pod.model_dump_json()
    if len(spec_json.encode()) > MAX_SPEC_BYTES:
        raise ValueError(f"the rollout spec is {len(spec_json.encode())} bytes; a Pod env var "
                         f"holds at most {MAX_SPEC_BYTES}: keep task data small (point at files)")
    env = [k8s.V1EnvVar(name=k, value=v) for k, v in sorted(options.env.items())]
    env += [
        k8s.V1EnvVar(name=SPEC_ENV, value=spec_json),
        k8s.V1EnvVar(name=TERMINATION_LOG_ENV, value=TERMINATION_LOG),
        k8s.V1EnvVar(name=ROLLOUT_ID_ENV, value=spec.rollout_id),
        k8s.V1EnvVar(name=PROXY_URL_ENV, value=in_pod.session_url),
        k8s.V1EnvVar(name=POD_NAME_ENV, value_from=k8s.V1EnvVarSource(
            field_ref=k8s.V1ObjectFieldSelector(field_path="metadata.name"))),
        k8s.V1EnvVar(name="PYTHONUNBUFFERED", value="1"),
    ]
    labels = {**options.labels, MANAGED_BY: "openforge", RUN_LABEL: label_value(spec.run_id),
              ROLLOUT_LABEL: label_value(spec.rollout_id), ATTEMPT_LABEL: str(spec.attempt)}
    annotations = {**options.annotations, "openforge.io/run-id-full": spec.run_id,
                   "openforge.io/rollout-id-full": spec.rollout_id,
                   "openforge.io/task-id": spec.task.id, DIGEST_ANNOTATION: spec_digest(spec)}
    container = k8s.V1Container(
        name=CONTAINER, image=options.image, image_pull_policy=options.image_pull_policy,
        command=list(options.command), env=env,
        resources=k8s.V1ResourceRequirements(requests=options.requests or None,
                                             limits=options.limits or None),
        termination_message_path=TERMINATION_LOG,
        termination_message_policy="FallbackToLogsOnError",
        security_context=k8s.V1SecurityContext(allow_privilege_escalation=False))
    return k8s.V1Pod(
        api_version="v1", kind="Pod",
        metadata=k8s.V1ObjectMeta(name=pod_name(spec), namespace=options.namespace,
                                  labels=labels, annotations=annotations,
                                  owner_references=[owner] if owner else None),
        spec=k8s.V1PodSpec(
            restart_policy="Never", containers=[container],
            active_deadline_seconds=deadline_seconds(spec, options),
            termination_grace_period_seconds=options.termination_grace_s,
            automount_service_account_token=False, enable_service_links=False,
            runtime_class_name=options.runtime_class,
            node_selector=options.node_selector or None,
            tolerations=[k8s.V1Toleration(**_snake_keys(t)) for t in options.tolerations] or None,
            image_pull_secrets=[k8s.V1LocalObjectReference(name=n)
                                for n in options.image_pull_secrets] or None))
