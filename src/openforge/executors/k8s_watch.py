"""One shared watch per run, fanned out to the rollouts waiting on their Pods.

A watch per Pod would cost the API server a connection per rollout; instead one
label-selector watch covers the run's Pods. It lists, watches from the list's
resourceVersion in windows (resuming from the last version seen), and lists again every
`resync_s`: a missed event is repaired at the next list; a 410 Gone (history too old) or a
broken stream starts the next list at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from openforge.executors.k8s_api import KubeApi

log = logging.getLogger("openforge.executors.kubernetes")
Pod = dict[str, Any]


class PodWatcher:
    """The latest state of a run's Pods, delivered to per-Pod queues."""

    def __init__(self, api: KubeApi, label_selector: str, resync_s: float) -> None:
        self.api = api
        self.selector = label_selector
        self.resync_s = resync_s
        self.pods: dict[str, Pod] = {}
        self.waiters: dict[str, asyncio.Queue[tuple[str, Pod]]] = {}
        self.synced = asyncio.Event()
        self.relists = 0
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

    def expect(self, name: str) -> asyncio.Queue[tuple[str, Pod]]:
        """A queue of ("pod", obj) / ("gone", obj) updates for the Pod `name`."""
        queue: asyncio.Queue[tuple[str, Pod]] = asyncio.Queue()
        self.waiters[name] = queue
        if name in self.pods:
            queue.put_nowait(("pod", self.pods[name]))
        return queue

    def forget(self, name: str) -> None:
        self.waiters.pop(name, None)

    def _deliver(self, kind: str, pod: Pod) -> None:
        name = pod.get("metadata", {}).get("name", "")
        if kind == "gone":
            self.pods.pop(name, None)
        else:
            self.pods[name] = pod
        queue = self.waiters.get(name)
        if queue is not None:
            queue.put_nowait((kind, pod))

    async def _relist(self) -> str:
        items, rv = await self.api.list_pods(self.selector)
        self.relists += 1
        seen = set()
        for pod in items:
            seen.add(pod["metadata"]["name"])
            self._deliver("pod", pod)
        for name in [n for n in self.pods if n not in seen]:
            self._deliver("gone", self.pods[name])
        self.synced.set()
        return rv

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        rv: str | None = None
        listed_at = 0.0
        # Two watch windows per resync: the second resumes from the last version seen.
        window = max(1.0, self.resync_s / 2)
        while True:
            try:
                if rv is None or loop.time() - listed_at >= self.resync_s:
                    rv = await self._relist()
                    listed_at = loop.time()
                async for event in self.api.watch_pods(self.selector, rv, window):
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":  # 410 Gone (history too old) and friends: list again
                        log.info("pod watch ended: %s", obj.get("message"))
                        rv = None
                        break
                    rv = obj.get("metadata", {}).get("resourceVersion") or rv
                    if kind in ("ADDED", "MODIFIED"):
                        self._deliver("pod", obj)
                    elif kind == "DELETED":
                        self._deliver("gone", obj)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                rv = None
                log.warning("pod watch failed (%s: %s); re-listing", type(exc).__name__, exc)
                await asyncio.sleep(min(10.0, 0.2 * 2 ** min(failures, 6)))
