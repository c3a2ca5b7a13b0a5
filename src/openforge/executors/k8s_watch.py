"""Shared watches: one on the run's Pods, fanned out to the waiting rollouts, one on Nodes.

A watch per Pod would cost the API server a connection per rollout; instead one
label-selector watch covers each run's Pods (and one watch per executor covers the
cluster's Nodes, to see a node that is lost). Each `Informer` lists, then watches from the
list's resourceVersion in at most two windows of `resync_s / 2` (the second resumes from
the last version seen), then lists again: so it opens at most two watches per list, however
slow the machine, and a missed event is repaired at the next list. A 410 Gone (history too
old) or a broken stream starts the next list at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from openforge.executors.k8s_api import KubeApi

log = logging.getLogger("openforge.executors.kubernetes")
Obj = dict[str, Any]
WINDOWS_PER_LIST = 2


class Informer:
    """The latest state of one kind of object ("pods" of the run, or "nodes"), by name."""

    def __init__(self, api: KubeApi, resource: str, label_selector: str, resync_s: float) -> None:
        self.api = api
        self.resource = resource
        self.selector = label_selector
        self.resync_s = resync_s
        self.objects: dict[str, Obj] = {}
        self.synced = asyncio.Event()
        self.forbidden: ApiException | None = None  # RBAC said no: the informer stopped
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def changed(self, kind: str, obj: Obj) -> None:
        """An object was added or modified ("put") or is gone ("gone")."""
        name = obj.get("metadata", {}).get("name", "")
        if kind == "gone":
            self.objects.pop(name, None)
        else:
            self.objects[name] = obj

    async def _relist(self) -> str:
        items, rv = await self.api.list_objects(self.resource, self.selector)
        seen = set()
        for obj in items:
            seen.add(obj["metadata"]["name"])
            self.changed("put", obj)
        for name in [n for n in self.objects if n not in seen]:
            self.changed("gone", self.objects[name])
        self.synced.set()
        return rv

    async def _run(self) -> None:
        failures = 0
        rv: str | None = None
        windows = 0
        while True:
            try:
                if rv is None or windows >= WINDOWS_PER_LIST:
                    rv, windows = await self._relist(), 0
                windows += 1
                async for event in self.api.watch_objects(self.resource, self.selector, rv,
                                                          self.resync_s / WINDOWS_PER_LIST):
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":  # 410 Gone (history too old) and friends: list again
                        log.info("%s watch ended: %s", self.resource, obj.get("message"))
                        rv = None
                        break
                    rv = obj.get("metadata", {}).get("resourceVersion") or rv
                    if kind in ("ADDED", "MODIFIED"):
                        self.changed("put", obj)
                    elif kind == "DELETED":
                        self.changed("gone", obj)
                failures = 0
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status in (401, 403):
                    self.forbidden = exc
                    self.synced.set()
                    return
                failures, rv = failures + 1, None
                log.warning("%s watch failed (%s); re-listing", self.resource, exc.status)
                await asyncio.sleep(min(10.0, 0.2 * 2 ** min(failures, 6)))
            except Exception as exc:
                failures, rv = failures + 1, None
                log.warning("%s watch failed (%s: %s); re-listing", self.resource,
                            type(exc).__name__, exc)
                await asyncio.sleep(min(10.0, 0.2 * 2 ** min(failures, 6)))


class PodWatcher(Informer):
    """The run's Pods, delivered to per-Pod queues of ("pod", obj) / ("gone", obj) updates
    (and ("node", obj) nudges when the Pod's node changes state)."""

    def __init__(self, api: KubeApi, label_selector: str, resync_s: float) -> None:
        super().__init__(api, "pods", label_selector, resync_s)
        self.waiters: dict[str, asyncio.Queue[tuple[str, Obj]]] = {}

    def expect(self, name: str) -> asyncio.Queue[tuple[str, Obj]]:
        queue: asyncio.Queue[tuple[str, Obj]] = asyncio.Queue()
        self.waiters[name] = queue
        if name in self.objects:
            queue.put_nowait(("pod", self.objects[name]))
        return queue

    def forget(self, name: str) -> None:
        self.waiters.pop(name, None)

    def changed(self, kind: str, obj: Obj) -> None:
        super().changed(kind, obj)
        queue = self.waiters.get(obj.get("metadata", {}).get("name", ""))
        if queue is not None:
            queue.put_nowait(("gone" if kind == "gone" else "pod", obj))

    def nudge_node(self, node: str) -> None:
        """The node `node` changed: the rollouts on it look again."""
        for name, queue in self.waiters.items():
            pod = self.objects.get(name)
            if pod is not None and (pod.get("spec") or {}).get("nodeName") == node:
                queue.put_nowait(("node", pod))


class NodeWatcher(Informer):
    """The cluster's Nodes: which are not Ready, and since when; which have vanished."""

    def __init__(self, api: KubeApi, resync_s: float) -> None:
        super().__init__(api, "nodes", "", resync_s)
        self.listeners: list[Callable[[str], None]] = []
        self._missing_since: dict[str, float] = {}

    def changed(self, kind: str, obj: Obj) -> None:
        before = self.objects.get(obj.get("metadata", {}).get("name", ""))
        super().changed(kind, obj)
        name = obj.get("metadata", {}).get("name", "")
        if before is None or kind == "gone" or _ready_status(before) != _ready_status(obj):
            for listener in self.listeners:
                listener(name)

    def problem(self, node: str, now: float) -> tuple[float, str] | None:
        """(since, why) when `node` is not Ready or no longer exists (wall-clock seconds)."""
        if not node or not self.synced.is_set() or self.forbidden is not None:
            return None
        obj = self.objects.get(node)
        if obj is None:
            since = self._missing_since.setdefault(node, now)
            return since, f"node {node} no longer exists"
        self._missing_since.pop(node, None)
        ready = _ready(obj)
        if ready is None or ready.get("status") == "True":
            return None
        since = _timestamp(ready.get("lastTransitionTime")) or now
        return since, (f"node {node} is NotReady ({ready.get('status')}: "
                       f"{ready.get('reason') or ''} {ready.get('message') or ''})").replace(
                           "  ", " ").replace(" )", ")")


def _ready(node: Obj) -> Obj | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return dict(cond)
    return None


def _ready_status(node: Obj) -> str | None:
    return (_ready(node) or {}).get("status")


def _timestamp(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def wall_clock() -> float:
    """Now, on the clock the API server's timestamps are on."""
    return time.time()
