"""The `kubernetes` executor: one bare Pod per rollout attempt.

Per attempt: a Pod with a deterministic name (`k8s_pods.pod_name`), run labels, an
`activeDeadlineSeconds` backstop, requests/limits, no service-account token, the spec in an
env var; it runs the rollout supervisor `python -m openforge.rollout`, which leaves its
result in the termination message (a compact copy) and as its last log line; a result for
another rollout, task, attempt or session is refused. The executor waits on one shared
watch per run (`k8s_watch`), fails fast on image-pull errors and rejected specs, bounds Pods
in flight and the creation rate, retries transient API errors (`k8s_api`).

Cleanup, four layers: (1) every attempt deletes its Pod with grace 0 in `finally`, also on
cancellation; (2) a label sweep of the run's Pods at start (after the adoption window) and
at close; (3) `activeDeadlineSeconds` stops a Pod nobody deletes; (4) every Pod is owned by a
per-run ConfigMap, so deleting it (or `kubectl delete cm openforge-run-...`) lets the
cluster's garbage collector remove what an orchestrator that died left behind.

Restart: a new executor finds the run's Pods by label. A `run(spec)` for an attempt whose
Pod exists and was made from the same spec adopts it instead of creating another; Pods no
attempt claims within `adopt_window_s` are deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from openforge.errors import OpenforgeError
from openforge.executor import Executor
from openforge.types import RolloutResult, RolloutSpec


class KubernetesExecutorError(OpenforgeError):
    """The kubernetes executor is misconfigured or its client is missing."""


if importlib.util.find_spec("kubernetes_asyncio") is None:
    raise KubernetesExecutorError(
        "the kubernetes executor needs the Kubernetes client: pip install 'openforge[kubernetes]'")

from kubernetes_asyncio.client import V1OwnerReference  # noqa: E402
from kubernetes_asyncio.client.exceptions import ApiException  # noqa: E402

from openforge.executors.k8s_api import KubeApi, RateLimiter, message_of, reason_of  # noqa: E402
from openforge.executors.k8s_pods import (  # noqa: E402
    DIGEST_ANNOTATION,
    MANAGED_BY,
    RUN_LABEL,
    KubernetesOptions,
    build_pod,
    deadline_seconds,
    label_value,
    owner_name,
    pod_name,
    run_selector,
    spec_digest,
)
from openforge.executors.k8s_result import (  # noqa: E402
    container_state,
    parse_result,
    unschedulable,
    waiting_error,
)
from openforge.executors.k8s_watch import PodWatcher  # noqa: E402
from openforge.sandbox.protocol import ResultRefused, check_result  # noqa: E402

log = logging.getLogger("openforge.executors.kubernetes")
_SYNC_TIMEOUT_S = 60.0


@dataclass
class _Refused:
    """No Pod for this attempt: why, and whether trying again could help."""

    message: str
    permanent: bool = True


@dataclass
class _RunScope:
    """What the executor holds for one run id: its owner, its watch, Pods found at start."""

    run_id: str
    watcher: PodWatcher
    owner: V1OwnerReference | None
    found: dict[str, dict[str, Any]] = field(default_factory=dict)
    sweeper: asyncio.Task[None] | None = None


class KubernetesExecutor(Executor):
    """One bare Pod per attempt on a Kubernetes cluster; results via the gateway."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        try:
            self.config = KubernetesOptions.model_validate(options)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            hint = " (the rollout image, see deploy/kubernetes/Dockerfile)" if where == "image" else ""
            raise KubernetesExecutorError(
                f"kubernetes executor option {where}: {err['msg']}{hint}") from None
        _check_kubeconfig(self.config.kubeconfig)
        self._api: KubeApi | None = None
        self._scopes: dict[str, _RunScope] = {}
        self._lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(self.config.max_concurrency)
        self._limiter = RateLimiter(self.config.create_qps, self.config.create_burst)
        self.stats: Counter[str] = Counter()
        self._calls: Counter[str] = Counter()

    def describe_sandbox(self) -> str:
        """One line for the run's header saying where rollouts run."""
        c = self.config
        runtime = f", runtimeClass {c.runtime_class}" if c.runtime_class else ""
        return (f"sandbox: Kubernetes Pods in namespace {c.namespace} (image {c.image}{runtime}, "
                f"at most {c.max_concurrency} at a time)")

    @property
    def api_calls(self) -> Counter[str]:
        """Requests made so far, by verb (create, delete, list, watch, log, ...)."""
        return self._calls

    # -- per-run state -------------------------------------------------------------------------

    async def _connect(self) -> KubeApi:
        if self._api is None:
            c = self.config
            try:
                self._api = await KubeApi.connect(c.kubeconfig, c.context, c.namespace,
                                                  retries=c.api_retries, backoff_s=c.backoff_s,
                                                  backoff_max_s=c.backoff_max_s,
                                                  calls=self._calls)
            except Exception as exc:
                where = c.kubeconfig or "$KUBECONFIG / ~/.kube/config"
                raise KubernetesExecutorError(
                    f"cannot load the Kubernetes client configuration from {where}: {exc}") from None
        return self._api

    async def _scope(self, run_id: str) -> _RunScope:
        async with self._lock:
            if run_id in self._scopes:
                return self._scopes[run_id]
            api = await self._connect()
            owner = None
            if self.config.owner_reference:
                labels = {MANAGED_BY: "openforge", RUN_LABEL: label_value(run_id)}
                cm = await api.ensure_configmap(owner_name(run_id), labels, {"run-id": run_id})
                owner = V1OwnerReference(api_version="v1", kind="ConfigMap",
                                         name=cm["metadata"]["name"], uid=cm["metadata"]["uid"],
                                         block_owner_deletion=False, controller=False)
            watcher = PodWatcher(api, run_selector(run_id), self.config.resync_s)
            watcher.start()
            try:
                async with asyncio.timeout(_SYNC_TIMEOUT_S):
                    await watcher.synced.wait()
            except TimeoutError:
                await watcher.stop()
                raise KubernetesExecutorError(
                    f"cannot list Pods in namespace {self.config.namespace} "
                    f"within {_SYNC_TIMEOUT_S:g}s") from None
            scope = _RunScope(run_id, watcher, owner, found=dict(watcher.pods))
            if scope.found:
                log.info("found %d Pods of run %s from an earlier orchestrator",
                         len(scope.found), run_id)
                scope.sweeper = asyncio.get_running_loop().create_task(self._sweep_unclaimed(scope))
            self._scopes[run_id] = scope
            return scope

    async def _sweep_unclaimed(self, scope: _RunScope) -> None:
        """After the adoption window, delete the found Pods no attempt claimed."""
        await asyncio.sleep(self.config.adopt_window_s)
        api = await self._connect()
        for name in list(scope.found):
            scope.found.pop(name, None)
            with contextlib.suppress(Exception):
                if await api.delete_pod(name):
                    self.stats["swept"] += 1

    # -- one attempt ---------------------------------------------------------------------------

    async def run(self, spec: RolloutSpec) -> RolloutResult:
        started = time.monotonic()

        def failed(status: str, error: str, **extra: Any) -> RolloutResult:
            return RolloutResult(rollout_id=spec.rollout_id, task_id=spec.task.id,
                                 attempt=spec.attempt, status=status,  # type: ignore[arg-type]
                                 error=error, duration_s=time.monotonic() - started, **extra)

        try:
            scope = await self._scope(spec.run_id)
        except Exception as exc:  # the API is down or refuses us: infrastructure, not a bug
            detail = message_of(exc) if isinstance(exc, ApiException) else \
                f"{type(exc).__name__}: {exc}"
            return failed("infra_error", f"Kubernetes API: {detail}")
        name = pod_name(spec)
        async with self._slots:
            queue = scope.watcher.expect(name)
            try:
                outcome = await self._create_or_adopt(scope, spec, name)
                if isinstance(outcome, _Refused):
                    return failed("infra_error", outcome.message,
                                  harness_output={"permanent": outcome.permanent})
                return await self._await_pod(spec, name, outcome, queue, started, failed)
            finally:
                scope.watcher.forget(name)
                # Shielded: a cancelled rollout must still take its Pod with it.
                await asyncio.shield(self._delete_quietly(name))

    async def _delete_quietly(self, name: str) -> None:
        api = await self._connect()
        try:
            if await api.delete_pod(name):
                self.stats["deleted"] += 1
        except Exception as exc:  # the sweep at close and the owner GC are the backstops
            log.warning("could not delete Pod %s: %s", name, exc)

    async def _create_or_adopt(self, scope: _RunScope, spec: RolloutSpec,
                               name: str) -> _Refused | dict[str, Any]:
        """The Pod to wait on (created or adopted) as a dict, or why there is none."""
        api = await self._connect()
        digest = spec_digest(spec)
        found = scope.found.pop(name, None)
        if found is not None and _digest_of(found) == digest:
            self.stats["adopted"] += 1
            return found
        try:
            pod = build_pod(spec, self.config, scope.owner)
        except ValueError as exc:
            return _Refused(str(exc))
        for _ in range(10):
            await self._limiter.acquire()
            try:
                created = await api.create_pod(pod)
                self.stats["created"] += 1
                return created
            except ApiException as exc:
                if exc.status == 409 and reason_of(exc) == "AlreadyExists":
                    try:
                        existing = await api.read_pod(name)
                        if existing is not None and _digest_of(existing) == digest:
                            self.stats["adopted"] += 1
                            return existing
                        # A Pod made from another spec under our name: replace it.
                        await api.delete_pod(name)
                    except Exception as err:
                        return _Refused(f"Pod {name} exists and cannot be replaced: "
                                        f"{type(err).__name__}: {err}", permanent=False)
                    await asyncio.sleep(self.config.backoff_s)
                    continue
                if exc.status in (400, 422):
                    return _Refused(f"Kubernetes rejected Pod {name}: {message_of(exc)}")
                if exc.status in (401, 403):
                    # A quota may free up; a missing RBAC verb will not, but the message says so.
                    return _Refused(f"Kubernetes refused to create Pod {name} ({exc.status}): "
                                    f"{message_of(exc)}; check the RBAC in "
                                    "deploy/kubernetes/rbac.yaml and the namespace's "
                                    "ResourceQuota", permanent=False)
                return _Refused(f"Kubernetes API error creating Pod {name} ({exc.status}): "
                                f"{message_of(exc)}", permanent=False)
            except Exception as exc:
                return _Refused(f"Kubernetes API unreachable creating Pod {name}: "
                                f"{type(exc).__name__}: {exc}", permanent=False)
        return _Refused(f"Pod {name} still exists after 10 attempts to replace it",
                        permanent=False)

    async def _await_pod(self, spec: RolloutSpec, name: str, pod: dict[str, Any],
                         queue: asyncio.Queue[tuple[str, dict[str, Any]]], started: float,
                         failed: Any) -> RolloutResult:
        """Follow the Pod to its end: finished, never able to start, or out of time."""
        c = self.config
        uid = pod["metadata"]["uid"]
        loop = asyncio.get_running_loop()
        pending_until = loop.time() + c.pending_timeout_s
        run_until: float | None = None
        last: dict[str, Any] = pod
        while True:
            # The create response is a state too: a watch event may never add to it.
            verdict = self._judge(last)
            if verdict is not None:
                return await self._collect(spec, name, last, started, failed) \
                    if verdict == "finished" else failed("infra_error", verdict,
                                                          harness_output={"permanent": True})
            if run_until is None and _started(last):
                run_until = loop.time() + spec.timeout_s + c.kill_margin_s
            until = run_until if run_until is not None else pending_until
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that lands as the queue delivers, and a cancelled rollout would run on.
                async with asyncio.timeout_at(until):
                    kind, update = await queue.get()
            except TimeoutError:
                if run_until is not None:
                    return failed("timeout", f"Pod {name} ran past the timeout of "
                                  f"{spec.timeout_s:g}s (+{c.kill_margin_s:g}s); deleted it")
                why = unschedulable(last)
                if why:
                    return failed("infra_error", f"Pod {name} unschedulable for "
                                  f"{c.pending_timeout_s:g}s: {why}")
                return failed("infra_error", f"Pod {name} did not start within "
                              f"{c.pending_timeout_s:g}s ({_waiting_reason(last)})")
            if update.get("metadata", {}).get("uid") != uid:
                continue  # an older Pod that had the same name
            if kind == "gone":
                return failed("infra_error", f"Pod {name} disappeared before it finished "
                              "(deleted, evicted, or its owner was garbage-collected)")
            last = update

    @staticmethod
    def _judge(pod: dict[str, Any]) -> str | None:
        """'finished', a one-line reason it can never run, or None while it may still run."""
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            return "finished"
        error = waiting_error(pod)
        if error is not None:
            reason, message = error
            return f"Pod {pod['metadata']['name']} cannot start: {reason}: {message}"
        return None

    async def _collect(self, spec: RolloutSpec, name: str, pod: dict[str, Any], started: float,
                       failed: Any) -> RolloutResult:
        """The finished Pod's result: termination message, else log tail, else its status."""
        status = pod.get("status") or {}
        if status.get("reason") == "DeadlineExceeded":
            return failed("timeout", f"Pod {name} exceeded activeDeadlineSeconds="
                          f"{deadline_seconds(spec, self.config)} and was killed by the kubelet")
        terminated = container_state(pod).get("terminated") or {}
        result = parse_result(terminated.get("message") or "")
        tail = ""
        if result is None:
            tail = await (await self._connect()).pod_log(name, self.config.log_tail_lines)
            result = parse_result(tail)
        # As from a local supervisor: only one that exited 0 reported (an agent that killed it
        # may have left a forged line behind), and only a result of this very attempt.
        if result is not None and terminated.get("exitCode") == 0:
            try:
                return check_result(result, spec)
            except ResultRefused:
                pass
        code = terminated.get("exitCode")
        detail = (tail or terminated.get("message") or "").strip()[-1500:]
        return failed("infra_error",
                      f"Pod {name} ended {status.get('phase')} (exit code {code}, "
                      f"{terminated.get('reason') or status.get('reason') or 'no reason'}) "
                      "without a result" + (f": {detail}" if detail else ""))

    # -- shutdown ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop the watches, sweep every run's Pods by label, delete the owner objects."""
        if self._api is None:
            return
        api = self._api
        for scope in list(self._scopes.values()):
            if scope.sweeper is not None:
                scope.sweeper.cancel()
            await scope.watcher.stop()
            try:
                self.stats["swept"] += await api.delete_pods(run_selector(scope.run_id))
                if scope.owner is not None:
                    await api.delete_configmap(scope.owner.name)
            except Exception as exc:
                log.warning("cleanup of run %s incomplete: %s", scope.run_id, exc)
        self._scopes.clear()
        await api.close()
        self._api = None


def _check_kubeconfig(path: Path | None) -> None:
    """Fail now, in one line, when there is no way to reach a cluster (not once per rollout)."""
    if path is not None:
        if not path.is_file():
            raise KubernetesExecutorError(
                f"kubernetes executor option kubeconfig: {path} does not exist")
        return
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return  # in-cluster: the service account
    candidates = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    candidates = candidates or [str(Path.home() / ".kube" / "config")]
    if not any(Path(p).expanduser().is_file() for p in candidates):
        raise KubernetesExecutorError(
            "kubernetes executor: no kubeconfig found (set executor_options.kubeconfig or "
            "$KUBECONFIG, or run the orchestrator in the cluster)")


def _digest_of(pod: dict[str, Any]) -> str | None:
    return (pod.get("metadata", {}).get("annotations") or {}).get(DIGEST_ANNOTATION)


def _started(pod: dict[str, Any]) -> bool:
    state = container_state(pod)
    return "running" in state or "terminated" in state or \
        (pod.get("status") or {}).get("phase") == "Running"


def _waiting_reason(pod: dict[str, Any]) -> str:
    waiting = container_state(pod).get("waiting") or {}
    return str(waiting.get("reason") or (pod.get("status") or {}).get("phase") or "Pending")
