"""The `kubernetes` executor: one bare Pod per rollout attempt.

Per attempt, two objects (see `k8s_pods`): a Secret holding the spec (session token
included), owned by the run's ConfigMap, and the Pod, owned by the Secret: a trusted
supervisor sidecar, the agent container that runs only the harness, and the trusted
verifier whose termination message is the only result the executor reads (`k8s_result`).
That result is taken only when signed with the attempt's key (`protocol.scoring_result_key`)
and naming the spec's rollout, task, attempt and session (`protocol.check_result`). A result
line in the agent container's own termination message is the agent's attempt to forge one:
the attempt becomes a `violation` (`sandbox.forgery`).

Following a Pod: one shared watch per run, on the run's Pods (label-selected, `k8s_watch`),
fans updates out to the waiting rollouts; one Node watch per executor sees a lost node.
The executor tells apart what a real cluster does to Pods, and labels each: a permanent
image-pull failure ends the attempt for good (no retry), a transient one is waited out up
to `image_pull_timeout_s`; a ResourceQuota or an admission policy that refuses the Pod is
waited out with back-off up to `admission_wait_s` (shown in the run's progress line, never
burning tries); a node that is NotReady, gone, or a Pod in phase Unknown fails the attempt
after `node_lost_s`, saying so; an eviction, a deadline, an OOM kill or a preemption is
reported as such, not as the exit code it caused. What the agent's own container brought
about (an OOM kill of it, an eviction for writing past its volumes' size limits) is judged
on the session's recorded calls, as a crashed harness is (`openforge.attribution`).

Deletion is graceful first, always: a finished attempt's Secret is deleted (batched: one
deletecollection for many attempts) and the garbage collector deletes its Pod; a Pod still
running, or one found under an attempt's name that something else made, gets a graceful
delete and is waited for; only a Pod still there `termination_grace_s +
force_delete_after_s` later (a node that does not answer) is force-deleted, and that is
logged: its containers may still run.

Cleanup layers: the above in `finally` (also on cancellation); a label sweep of the run's
Pods and Secrets at start (after the adoption window) and at close;
`activeDeadlineSeconds` stops a Pod nobody deletes; deleting the run's ConfigMap lets the
garbage collector remove everything a dead orchestrator left.

Restart: a new executor lists the run's Pods. A `run(spec)` whose Pod exists and was made
from the same spec adopts it (follows it to its end, or collects the result it already
has) instead of creating another (`adoptable` tells the runner beforehand); Pods no attempt
claims within `adopt_window_s` are deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openforge.environment import Environment
from openforge.errors import OpenforgeError
from openforge.executor import Executor
from openforge.rollout import agents_own_crash, build_plugin
from openforge.types import RewardResult, RolloutResult, RolloutSpec


class KubernetesExecutorError(OpenforgeError):
    """The kubernetes executor is misconfigured or its client is missing."""


if importlib.util.find_spec("kubernetes_asyncio") is None:
    raise KubernetesExecutorError(
        "the kubernetes executor needs the Kubernetes client: pip install 'openforge[kubernetes]'")

from kubernetes_asyncio.client import V1OwnerReference  # noqa: E402
from kubernetes_asyncio.client.exceptions import ApiException  # noqa: E402

from openforge.executors.k8s_api import KubeApi, RateLimiter, message_of, reason_of  # noqa: E402
from openforge.executors.k8s_pods import (  # noqa: E402
    ATTEMPT_LABEL,
    DIGEST_ANNOTATION,
    MANAGED_BY,
    ROLLOUT_LABEL,
    RUN_LABEL,
    KubernetesOptions,
    build_pod,
    build_secret,
    label_value,
    owner_name,
    pod_name,
    run_selector,
    spec_digest,
)
from openforge.executors.k8s_result import (  # noqa: E402
    agents_storage_eviction,
    disruption,
    node_lost,
    parse_result,
    pod_level_cause,
    start_problem,
    started,
    terminated,
    unschedulable,
    waiting_reason,
)
from openforge.executors.k8s_sandbox import AGENT, VERIFIER  # noqa: E402
from openforge.executors.k8s_watch import NodeWatcher, PodWatcher, wall_clock  # noqa: E402
from openforge.sandbox import forgery  # noqa: E402
from openforge.sandbox.protocol import (  # noqa: E402
    ResultRefused,
    check_result,
    scoring_result_key,
)

log = logging.getLogger("openforge.executors.kubernetes")
Obj = dict[str, Any]
_SYNC_TIMEOUT_S = 60.0
_REAP_EVERY_S = 0.05  # Secrets of finished attempts are deleted in batches this often
_REAP_BATCH = 100


@dataclass
class _Refused:
    """No Pod for this attempt: why, and whether trying again could help."""

    message: str
    permanent: bool = True


@dataclass
class _RunScope:
    """What the executor holds for one run id: its owner, its watch, Pods found at start."""

    run_id: str
    pods: PodWatcher
    owner: V1OwnerReference | None
    found: dict[str, Obj] = field(default_factory=dict)
    sweeper: asyncio.Task[None] | None = None


def refusal(exc: ApiException) -> tuple[str, str]:
    """How to take a refused create: ("wait", why) for a quota or an admission policy
    (capacity may come back), ("permanent", why) for a spec or a permission that is wrong."""
    message = message_of(exc)
    if exc.status == 403 and "exceeded quota" in message:
        return "wait", "quota"
    if exc.status in (400, 403, 422) and any(s in message for s in (
            "admission webhook", "denied the request", "ValidatingAdmissionPolicy",
            "denied request")):
        return "wait", "admission"
    if exc.status in (401, 403):
        return "permanent", (f"{message}; check the RBAC in deploy/kubernetes/rbac.yaml")
    if exc.status in (400, 422):
        return "permanent", message
    return "error", message


class _SecretReaper:
    """Deletes the Secrets of finished attempts, one deletecollection per batch of them; the
    garbage collector then deletes the Pods they own."""

    def __init__(self, api: Callable[[], Awaitable[KubeApi]]) -> None:
        self._api = api
        self._queue: dict[str, set[str]] = {}  # run label -> rollout labels
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def add(self, run_id: str, rollout_id: str) -> None:
        self._queue.setdefault(label_value(run_id), set()).add(label_value(rollout_id))
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(_REAP_EVERY_S)  # let a batch gather
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        api = await self._api()
        for run, rollouts in list(self._queue.items()):
            while rollouts:
                batch = sorted(rollouts)[:_REAP_BATCH]
                rollouts.difference_update(batch)
                selector = f"{MANAGED_BY}=openforge,{RUN_LABEL}={run}," \
                           f"{ROLLOUT_LABEL} in ({','.join(batch)})"
                try:
                    await api.delete_secrets(selector)
                except Exception as exc:  # the sweep at close and the owner GC are backstops
                    log.warning("could not delete %d Secrets: %s", len(batch), exc)
            self._queue.pop(run, None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()


class KubernetesExecutor(Executor):
    """One bare Pod per attempt on a Kubernetes cluster; the result in its status."""

    options_model = KubernetesOptions
    options: KubernetesOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        _check_kubeconfig(self.options.kubeconfig)
        self._api: KubeApi | None = None
        self._scopes: dict[str, _RunScope] = {}
        self._nodes: NodeWatcher | None = None
        self._lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(self.options.max_concurrency)
        self._limiter = RateLimiter(self.options.create_qps, self.options.create_burst)
        self._reaper = _SecretReaper(self._connect)
        self._waiting: dict[str, str] = {}  # Pod name -> what it waits for (progress line)
        self.stats: Counter[str] = Counter()
        self._calls: Counter[str] = Counter()
        # The environments whose hidden folders the Pods empty, by name and options.
        self._environments: dict[str, Environment] = {}
        # Now, on the clock of the API server's timestamps (node loss is timed on it); the
        # event loop's clock times the rest. A seam: tests run both on a virtual clock.
        self.clock: Callable[[], float] = wall_clock

    def describe_sandbox(self) -> str:
        """One line for the run's header saying where rollouts run."""
        c = self.options
        runtime = f", runtimeClass {c.runtime_class}" if c.runtime_class else ""
        return (f"sandbox: Kubernetes Pods in namespace {c.namespace} (image {c.image}{runtime}, "
                f"at most {c.max_concurrency} at a time; the agent's container holds no "
                "credential but its model-call token, results come from a verifier container)")

    def progress(self) -> str:
        """What rollouts are waiting for right now, for the run's progress line ('' if none)."""
        counts = Counter(self._waiting.values())
        return ", ".join(f"{n} waiting for {what}" for what, n in sorted(counts.items()))

    @property
    def api_calls(self) -> Counter[str]:
        """Requests made so far, by verb (create, delete, list, watch, log, ...)."""
        return self._calls

    # -- per-run state -------------------------------------------------------------------------

    async def _connect(self) -> KubeApi:
        if self._api is None:
            c = self.options
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

    def _watch_nodes(self, api: KubeApi) -> None:
        if self._nodes is not None or not self.options.watch_nodes:
            return
        self._nodes = NodeWatcher(api, self.options.resync_s)

        def nudge(node: str) -> None:
            for scope in self._scopes.values():
                scope.pods.nudge_node(node)

        self._nodes.listeners.append(nudge)
        self._nodes.start()

    async def _scope(self, run_id: str) -> _RunScope:
        # Every attempt asks: once the run's scope exists, without queueing on the lock.
        if (scope := self._scopes.get(run_id)) is not None:
            return scope
        async with self._lock:
            if run_id in self._scopes:
                return self._scopes[run_id]
            api = await self._connect()
            self._watch_nodes(api)
            owner = None
            if self.options.owner_reference:
                labels = {MANAGED_BY: "openforge", RUN_LABEL: label_value(run_id)}
                cm = await api.ensure_configmap(owner_name(run_id), labels, {"run-id": run_id})
                owner = V1OwnerReference(api_version="v1", kind="ConfigMap",
                                         name=cm["metadata"]["name"], uid=cm["metadata"]["uid"],
                                         block_owner_deletion=False, controller=False)
            watcher = PodWatcher(api, run_selector(run_id), self.options.resync_s)
            watcher.start()
            try:
                async with asyncio.timeout(_SYNC_TIMEOUT_S):
                    await watcher.synced.wait()
            except TimeoutError:
                await watcher.stop()
                raise KubernetesExecutorError(
                    f"cannot list Pods in namespace {self.options.namespace} "
                    f"within {_SYNC_TIMEOUT_S:g}s") from None
            if watcher.forbidden is not None:
                await watcher.stop()
                raise watcher.forbidden
            scope = _RunScope(run_id, watcher, owner, found=dict(watcher.objects))
            if scope.found:
                log.info("found %d Pods of run %s from an earlier orchestrator",
                         len(scope.found), run_id)
                scope.sweeper = asyncio.get_running_loop().create_task(self._sweep_unclaimed(scope))
            self._scopes[run_id] = scope
            return scope

    async def _sweep_unclaimed(self, scope: _RunScope) -> None:
        """After the adoption window, delete the found Pods no attempt claimed."""
        await asyncio.sleep(self.options.adopt_window_s)
        api = await self._connect()
        for name, pod in list(scope.found.items()):
            scope.found.pop(name, None)
            with contextlib.suppress(Exception):
                if await api.delete_pod(name):
                    self.stats["swept"] += 1
            # Its Secret after it: had the garbage collector taken the Pod first, no delete
            # would have found it, and the sweep would not count it.
            rollout = (pod["metadata"].get("annotations") or {}).get("openforge.io/rollout-id-full")
            if rollout:
                self._reaper.add(scope.run_id, rollout)

    async def find_attempt(self, run_id: str, task_id: str, attempt: int) -> str | None:
        """The rollout id of the newest Pod an earlier orchestrator left for this attempt."""
        try:
            scope = await self._scope(run_id)
        except Exception:
            return None
        mine = [p for p in scope.found.values()
                if (p["metadata"].get("annotations") or {}).get("openforge.io/task-id-full")
                == task_id and (p["metadata"].get("labels") or {}).get(ATTEMPT_LABEL)
                == str(attempt)]
        if not mine:
            return None
        newest = max(mine, key=lambda p: p["metadata"].get("creationTimestamp") or "")
        return (newest["metadata"].get("annotations") or {}).get("openforge.io/rollout-id-full")

    async def adoptable(self, spec: RolloutSpec) -> bool:
        """Whether `run(spec)` would adopt a Pod an earlier orchestrator made for this very
        attempt (alive, or finished with its result still in its status)."""
        try:
            scope = await self._scope(spec.run_id)
        except Exception:
            return False
        found = scope.found.get(pod_name(spec))
        return found is not None and _digest_of(found) == spec_digest(spec, self.options)

    # -- one attempt ---------------------------------------------------------------------------

    async def run(self, spec: RolloutSpec) -> RolloutResult:
        started_at = time.monotonic()

        def failed(status: str, error: str, permanent: bool = False) -> RolloutResult:
            return RolloutResult(rollout_id=spec.rollout_id, task_id=spec.task.id,
                                 attempt=spec.attempt, session_id=spec.session_id,
                                 status=status,  # type: ignore[arg-type]
                                 error=error, permanent=permanent, sandbox="pod",
                                 duration_s=time.monotonic() - started_at)

        try:
            scope = await self._scope(spec.run_id)
        except Exception as exc:  # the API is down or refuses us: infrastructure, not a bug
            detail = message_of(exc) if isinstance(exc, ApiException) else \
                f"{type(exc).__name__}: {exc}"
            return failed("infra_error", f"Kubernetes API: {detail}")
        name = pod_name(spec)
        async with self._slots:
            queue = scope.pods.expect(name)
            pod: Obj | None = None
            try:
                outcome = await self._create_or_adopt(scope, spec, name)
                if isinstance(outcome, _Refused):
                    return failed("infra_error", outcome.message, outcome.permanent)
                pod = outcome
                return await self._follow(spec, name, pod, queue, failed)
            finally:
                self._waiting.pop(name, None)
                # Shielded: a cancelled rollout must still take its Pod with it.
                await asyncio.shield(self._remove(scope, spec, name, pod, queue))
                scope.pods.forget(name)

    async def _create_or_adopt(self, scope: _RunScope, spec: RolloutSpec,
                               name: str) -> _Refused | Obj:
        """The Pod to follow (created or adopted), or why there is none."""
        api = await self._connect()
        found = scope.found.pop(name, None)
        if found is not None:
            if _digest_of(found) == spec_digest(spec, self.options):
                self.stats["adopted"] += 1
                return found
            # Made from another spec under our name.
            await self._replace(api, name, node=(found.get("spec") or {}).get("nodeName"))
        if not spec.session_token:
            # A resumed try whose Pod went away after `adoptable` said yes: the store keeps
            # no token in clear, so a new Pod could make no model call. Another try can.
            return _Refused(f"Pod {name} of a resumed try is gone, and its session token "
                            "with it")
        try:
            secret = build_secret(spec, self.options, scope.owner)
        except ValueError as exc:
            return _Refused(str(exc))
        await self._limiter.acquire()
        created = await self._create_fresh(api, name, "Secret", lambda: api.create_secret(secret))
        if isinstance(created, _Refused):
            return created
        owner = V1OwnerReference(api_version="v1", kind="Secret", name=name,
                                 uid=created["metadata"]["uid"], block_owner_deletion=False)
        # Off the event loop: the first call builds the environment (a benchmark's loader
        # reads its whole task set), and every Pod's watch runs on this loop.
        hidden = await asyncio.to_thread(self._hidden_paths, spec)
        pod = build_pod(spec, self.options, owner, hidden=hidden)
        made = await self._create_fresh(api, name, "Pod", lambda: api.create_pod(pod))
        if not isinstance(made, _Refused):
            self.stats["created"] += 1
        return made

    def _hidden_paths(self, spec: RolloutSpec) -> list[str]:
        """The environment's hidden folders for the spec's task (`Environment.hidden_paths`),
        as found on this machine: the Pod empties them in the agent's container, which
        assumes the image installs the environment at the same paths as the runner (the
        supervisor, in the Pod, checks it). An environment whose `hidden_paths` raises is
        left to the supervisor, which reports it as a plugin error, as on a local machine."""
        key = json.dumps([spec.environment, spec.environment_options], sort_keys=True,
                         default=str)
        try:
            if key not in self._environments:
                self._environments[key] = build_plugin("environment", spec.environment,
                                                       spec.environment_options)
            hidden = self._environments[key].hidden_paths(spec.task)
        except Exception:  # noqa: BLE001 - the supervisor makes the same call, and says so
            log.warning("could not list the hidden folders of environment %s", spec.environment,
                        exc_info=True)
            return []
        return sorted({os.path.abspath(p) for p in hidden})

    async def _create_fresh(self, api: KubeApi, name: str, what: str,
                            create: Callable[[], Awaitable[Obj]]) -> Obj | _Refused:
        """`_create`, replacing what a crash or a stranger left under our name (409)."""
        for _ in range(5):
            made = await self._create(name, what, create)
            if not isinstance(made, str):
                return made
            await self._replace(api, name, keep_secret=what == "Pod")
        return _Refused(f"{what} {name} keeps coming back after being deleted", permanent=False)

    async def _create(self, name: str, what: str,
                      create: Callable[[], Awaitable[Obj]]) -> Obj | _Refused | str:
        """Create, waiting with back-off while a quota or an admission policy refuses (up to
        `admission_wait_s`); "exists" on 409 AlreadyExists."""
        c = self.options
        loop = asyncio.get_running_loop()
        since: float | None = None
        backoff = c.backoff_s
        try:
            while True:
                try:
                    return await create()
                except ApiException as exc:
                    if exc.status == 409 and reason_of(exc) == "AlreadyExists":
                        return "exists"
                    kind, why = refusal(exc)
                    if kind == "permanent":
                        return _Refused(f"Kubernetes rejected {what} {name} ({exc.status}): {why}")
                    if kind == "error":
                        return _Refused(f"Kubernetes API error creating {what} {name} "
                                        f"({exc.status}): {why}", permanent=False)
                    since = loop.time() if since is None else since
                    if loop.time() - since >= c.admission_wait_s:
                        return _Refused(f"Kubernetes refused {what} {name} for "
                                        f"{c.admission_wait_s:g}s ({exc.status}, {why}): "
                                        f"{message_of(exc)}", permanent=False)
                    self._waiting[name] = why
                    self.stats[f"waited for {why}"] += 1
                    await asyncio.sleep(backoff * (0.5 + random.random() / 2))
                    backoff = min(backoff * 2, c.backoff_max_s)
                except Exception as exc:
                    return _Refused(f"Kubernetes API unreachable creating {what} {name}: "
                                    f"{type(exc).__name__}: {exc}", permanent=False)
        finally:
            self._waiting.pop(name, None)

    async def _replace(self, api: KubeApi, name: str, keep_secret: bool = False,
                       node: str | None = None) -> None:
        """Remove a Pod (and Secret) left under our name by something else: the Pod graceful
        first like any other (`_delete_pod`), waited for till it is gone; then the Secret."""
        async def gone_within(seconds: float) -> bool:
            return await self._read_gone_within(api, name, seconds)

        await self._delete_pod(api, name, node, gone_within)
        await gone_within(self.options.force_delete_after_s)  # a forced one goes at once
        if not keep_secret:
            with contextlib.suppress(Exception):
                await api.delete_secret(name)

    async def _read_gone_within(self, api: KubeApi, name: str, seconds: float) -> bool:
        """Whether the Pod `name` is gone within `seconds`, reading it every `backoff_s`
        (a Pod not of this run's watch: found under our name on a create)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        while True:
            with contextlib.suppress(Exception):
                if await api.read_pod(name) is None:
                    return True
            if (left := until - loop.time()) <= 0:
                return False
            await asyncio.sleep(min(self.options.backoff_s, left))

    async def _delete_pod(self, api: KubeApi, name: str, node: str | None,
                          gone_within: Callable[[float], Awaitable[bool]]) -> None:
        """Delete the Pod gracefully (its own grace period); force-delete it only when it is
        still there `termination_grace_s + force_delete_after_s` later, and say so: on a node
        that does not answer, the object goes while its containers may keep running."""
        c = self.options
        with contextlib.suppress(Exception):
            await api.delete_pod(name)
        wait_s = c.termination_grace_s + c.force_delete_after_s
        if await gone_within(wait_s):
            return
        log.warning("Pod %s still there %gs after its graceful delete: force-deleting it; its "
                    "containers may still run on node %s until it reconnects", name, wait_s,
                    node or "(unknown)")
        with contextlib.suppress(Exception):
            if await api.delete_pod(name, grace_s=0):
                self.stats["force_deleted"] += 1

    async def _follow(self, spec: RolloutSpec, name: str, pod: Obj,
                      queue: asyncio.Queue[tuple[str, Obj]], failed: Any) -> RolloutResult:
        """Follow the Pod to its end: finished, never able to start, lost, or out of time."""
        c = self.options
        uid = pod["metadata"]["uid"]
        loop = asyncio.get_running_loop()
        pending_until = loop.time() + c.pending_timeout_s
        run_until: float | None = None
        pull_since: float | None = None
        unknown_since: float | None = None
        last = pod
        while True:
            # The create response is a state too: a watch event may never add to it.
            phase = (last.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                return await self._collect(spec, name, last, failed)
            if last["metadata"].get("deletionTimestamp") and (why := disruption(last)):
                return failed("infra_error", f"Pod {name} {why}")
            problem = start_problem(last)
            if problem is not None and not problem[1]:
                return failed(problem[0].status, f"Pod {name} {problem[0].message}",
                              permanent=True)
            pull_since = (pull_since or loop.time()) if problem else None
            if problem:
                self._waiting[name] = "image pull"
            else:
                self._waiting.pop(name, None)
            now = self.clock()
            lost: tuple[float, str] | None = None
            if why := node_lost(last):
                unknown_since = unknown_since or now
                lost = (unknown_since, why)
            elif self._nodes is not None:
                lost = self._nodes.problem((last.get("spec") or {}).get("nodeName", ""), now)
            lost_at = loop.time() + lost[0] + c.node_lost_s - now if lost else None
            if lost is not None and lost_at is not None and lost_at <= loop.time():
                return failed("infra_error", f"Pod {name} lost with its node: {lost[1]}, for "
                              f"{c.node_lost_s:g}s or more (node_lost_s)")
            if run_until is None and started(last):
                run_until = loop.time() + spec.timeout_s + c.kill_margin_s
            wakes = [(run_until if run_until is not None else pending_until, "time")]
            if pull_since is not None:
                wakes.append((pull_since + c.image_pull_timeout_s, "pull"))
            if lost_at is not None:
                wakes.append((lost_at, "node"))
            wake, which = min(wakes)
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that lands as the queue delivers, and a cancelled rollout would run on.
                async with asyncio.timeout_at(wake):
                    kind, update = await queue.get()
            except TimeoutError:
                if which == "node":
                    continue  # judged at the top, with the time that has passed
                if which == "pull" and problem is not None:
                    return failed("infra_error", f"Pod {name} {problem[0].message} "
                                  f"(for {c.image_pull_timeout_s:g}s, image_pull_timeout_s)")
                if run_until is not None:
                    return failed("timeout", f"Pod {name} ran past the timeout of "
                                  f"{spec.timeout_s:g}s (+{c.kill_margin_s:g}s); deleted it")
                # Judged on the Pod as the API server has it now, not as the watch last
                # brought it: the scheduler's reason may still be on its way.
                with contextlib.suppress(Exception):
                    now_pod = await (await self._connect()).read_pod(name)
                    if now_pod is not None and now_pod["metadata"].get("uid") == uid:
                        last = now_pod
                if started(last):
                    continue  # it started just now: followed like any other
                why = unschedulable(last)
                if why:
                    return failed("infra_error", f"Pod {name} unschedulable for "
                                  f"{c.pending_timeout_s:g}s: {why}")
                return failed("infra_error", f"Pod {name} did not start within "
                              f"{c.pending_timeout_s:g}s ({waiting_reason(last)})")
            if update.get("metadata", {}).get("uid") != uid:
                continue  # an older Pod that had the same name
            if kind == "gone":
                node = (last.get("spec") or {}).get("nodeName", "")
                gone = self._nodes.problem(node, self.clock()) if self._nodes else None
                why = disruption(update) or disruption(last) or (gone[1] if gone else "") or \
                    "deleted by someone else, or its owner was garbage-collected"
                return failed("infra_error", f"Pod {name} disappeared before it finished: {why}")
            last = update

    async def _collect(self, spec: RolloutSpec, name: str, pod: Obj,
                       failed: Any) -> RolloutResult:
        """The finished Pod's result, from its verifier container only; else why it has none
        (the Pod-level reason first)."""
        if over := agents_storage_eviction(pod):
            return await self._agent_container_ended(spec, name, over, failed)
        cause = pod_level_cause(pod)
        if cause is not None:
            return failed(cause.status, f"Pod {name} {cause.message}")
        verifier = terminated(pod, VERIFIER)
        key = scoring_result_key(spec)
        result = parse_result(verifier.get("message") or "", key)
        tail = ""
        if result is None and verifier:
            tail = await (await self._connect()).pod_log(name, VERIFIER,
                                                         self.options.log_tail_lines)
            result = parse_result(tail, key)
        agent = terminated(pod, AGENT)
        if result is not None and verifier.get("exitCode") == 0:
            try:
                result = check_result(result, spec)
            except ResultRefused as exc:
                return failed("infra_error", f"Pod {name}: its verifier's result refused: {exc}")
            # Never read as a result, but writing one there is an attempt to forge it.
            forged = forgery.result_lines(agent.get("message") or "")
            return forgery.mark(result, "the agent container's termination message", forged) \
                if forged else result
        if agent and agent.get("exitCode") != 0:
            return await self._agent_container_ended(
                spec, name, f"the agent container was killed (exit code {agent.get('exitCode')}, "
                f"{agent.get('reason') or 'no reason'})", failed)
        phase = (pod.get("status") or {}).get("phase")
        detail = (tail or verifier.get("message") or "").strip()[-1500:]
        return failed("infra_error", f"Pod {name} ended {phase} without a result (verifier "
                      f"exit code {verifier.get('exitCode')})" + (f": {detail}" if detail else ""))

    async def _agent_container_ended(self, spec: RolloutSpec, name: str, how: str,
                                     failed: Any) -> RolloutResult:
        """The Pod failed, before anything was scored, for what the agent's container did
        (`how`): it was killed (its launcher, the container's first process, exits 0
        whatever the agent does: only something like the OOM killer ends all of it), or the
        kubelet evicted the Pod because the agent wrote past a storage limit of its own.

        Whose end it was is decided as for a harness that crashed on a local machine
        (`openforge.attribution`, on the calls read with the scoring credential): the
        infrastructure's stays `infra_error`, retried. The agent's own cannot be scored (its
        final state and the supervisor went with the Pod), and were it retried, a policy
        would drop its 0s this way: `harness_error`, reward 0, labelled `unscored`.
        """
        own = await asyncio.to_thread(agents_own_crash, spec)
        if own is None:
            return failed("infra_error", f"Pod {name}: {how}; no result")
        unscored = "the Pod failed with the agent's container: its final state was not scored"
        return failed("harness_error", f"Pod {name}: {how}; {own}; {unscored}, reward 0") \
            .model_copy(update={"reward": RewardResult(score=0.0, passed=False,
                                                       details={"unscored": unscored})})

    async def _remove(self, scope: _RunScope, spec: RolloutSpec, name: str, pod: Obj | None,
                      queue: asyncio.Queue[tuple[str, Obj]]) -> None:
        """Delete the attempt's objects gracefully; force the Pod only past its grace period.

        A finished Pod holds no node resources and counts against no quota: its Secret is
        queued for deletion (the garbage collector then takes the Pod) and the slot is free at
        once. A Pod still running is deleted gracefully now, and waited for.
        """
        self._reaper.add(spec.run_id, spec.rollout_id)  # the Secret (the Pod goes with it)
        if pod is None:
            return
        uid = pod["metadata"]["uid"]

        def gone() -> bool:
            current = scope.pods.objects.get(name)
            return current is None or current["metadata"].get("uid") != uid

        current = scope.pods.objects.get(name) or pod
        if gone() or (current.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self.stats["deleted"] += 1
            return

        async def gone_within(seconds: float) -> bool:  # as the run's watch sees it
            until = asyncio.get_running_loop().time() + seconds
            while not gone():
                try:
                    async with asyncio.timeout_at(until):
                        await queue.get()
                except TimeoutError:
                    return gone()
            return True

        self.stats["deleted"] += 1
        node = (current.get("spec") or {}).get("nodeName")
        await self._delete_pod(await self._connect(), name, node, gone_within)

    # -- shutdown ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop the watches; sweep every run's Secrets and Pods by label; delete the owners."""
        if self._api is None:
            return
        api = self._api
        await self._reaper.close()
        for scope in list(self._scopes.values()):
            if scope.sweeper is not None:
                scope.sweeper.cancel()
            await scope.pods.stop()
            try:
                await api.delete_secrets(run_selector(scope.run_id))
                self.stats["swept"] += await api.delete_pods(run_selector(scope.run_id))
                if scope.owner is not None:
                    await api.delete_configmap(scope.owner.name)
            except Exception as exc:
                log.warning("cleanup of run %s incomplete: %s", scope.run_id, exc)
        self._scopes.clear()
        for environment in self._environments.values():
            with contextlib.suppress(Exception):
                environment.close()
        self._environments.clear()
        if self._nodes is not None:
            await self._nodes.stop()
            self._nodes = None
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


def _digest_of(pod: Obj) -> str | None:
    return (pod.get("metadata", {}).get("annotations") or {}).get(DIGEST_ANNOTATION)
