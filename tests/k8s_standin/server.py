"""`StandIn`: the API server and kubelet on a background thread, plus test knobs."""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import yaml
from aiohttp import web

from .apiserver import ApiServer, Fault
from .kubelet import Image, Kubelet, Node
from .runtime import Behaviour

T = TypeVar("T")


class StandIn:
    """An API server + kubelet stand-in on 127.0.0.1, on its own thread and event loop.

    Usage: `with StandIn(image_env={...}) as k8s: k8s.kubeconfig` (a file path).
    `nodes`: the cluster's nodes (default: one); `images`: ENTRYPOINT / CMD / env per image;
    `isolate`: run containers in namespaces (default: when root allows it); `simulate`: run
    no processes, containers behave as the function says (see `runtime.SimContainer`).
    """

    def __init__(self, image_env: dict[str, str] | None = None, nodes: list[Node] | None = None,
                 history: int = 5000, images: dict[str, Image] | None = None,
                 isolate: bool | None = None, simulate: Behaviour | None = None) -> None:
        self.token = secrets.token_hex(16)
        self.root = Path(tempfile.mkdtemp(prefix="k8s-standin-"))
        self.api = ApiServer(self.token, history=history)
        self._kubelet_args: dict[str, Any] = {"image_env": image_env or {}, "nodes": nodes,
                                              "images": images, "isolate": isolate,
                                              "simulate": simulate}
        self.kubelet: Kubelet | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="k8s-standin",
                                        daemon=True)
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.kubeconfig = self.root / "kubeconfig.yaml"

    # -- lifecycle -----------------------------------------------------------------------------

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the stand-in's loop (where its state lives) and return its result."""
        async def wrapper() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result(30)

    def start(self) -> StandIn:
        self._thread.start()
        future: Future[None] = asyncio.run_coroutine_threadsafe(self._serve(), self.loop)
        future.result(30)
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin", "user": {"token": self.token}}],
            "contexts": [{"name": "standin", "context": {
                "cluster": "standin", "user": "standin", "namespace": "default"}}]}))
        return self

    async def _serve(self) -> None:
        self.kubelet = Kubelet(self.api, self.root, **self._kubelet_args)
        self.kubelet.register_nodes()
        self._runner = web.AppRunner(self.api.app(), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def _shutdown(self) -> None:
        if self.kubelet is not None:
            await self.kubelet.shutdown()
        for watcher in list(self.api.store.watchers):
            watcher.queue.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(60)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- knobs and readings for tests ----------------------------------------------------------

    def inject(self, verb: str, resource: str, status: int, count: int = 1,
               retry_after: int | None = None, message: str = "", reason: str = "") -> None:
        """Fail the next `count` `verb` calls on `resource` (e.g. "create", "pods") with `status`
        (and the Status `message` / `reason`: an admission webhook's refusal, say)."""
        fault = Fault(verb, resource, status, count, retry_after, message, reason)
        self.call(lambda: self.api.inject(fault))

    def set_pod_quota(self, pods: int | None) -> None:
        """A ResourceQuota of `pods` non-terminal Pods per namespace (None: no quota)."""
        def set_quota() -> None:
            self.api.pod_quota = pods

        self.call(set_quota)

    def pull_fault(self, image: str, messages: list[str]) -> None:
        """The next pulls of `image` fail with these registry errors, in order."""
        self.call(lambda: self._kube.pull_faults.setdefault(image, []).extend(messages))

    def evict(self, name: str, message: str, namespace: str = "default") -> None:
        self.call(lambda: self._kube.evict(namespace, name, message))

    def oom(self, name: str, container: str, namespace: str = "default") -> None:
        self.call(lambda: self._kube.oom(namespace, name, container))

    def preempt(self, name: str, namespace: str = "default") -> None:
        self.call(lambda: self._kube.preempt(namespace, name))

    def set_phase_unknown(self, name: str, namespace: str = "default") -> None:
        self.call(lambda: self._kube.set_phase_unknown(namespace, name))

    def partition(self, node: str, ready: str = "Unknown", since_s: float = 0.0) -> None:
        """Cut `node` off (see `Kubelet.partition`)."""
        self.call(lambda: self._kube.partition(node, ready, since_s))

    def reconnect(self, node: str) -> None:
        self.call(lambda: self._kube.reconnect(node))

    def remove_node(self, node: str) -> None:
        self.call(lambda: self._kube.remove_node(node))

    def restore_node(self, node: str) -> None:
        self.call(lambda: self._kube.restore_node(node))

    @property
    def _kube(self) -> Kubelet:
        assert self.kubelet is not None
        return self.kubelet

    @property
    def isolated(self) -> bool:
        """Containers run in their own PID and mount namespaces (see `runtime`)."""
        return self._kube.isolated

    def deletions(self) -> list[tuple[float, str, str, int | None]]:
        """Every delete the API server received: (loop time, kind, name, grace seconds)."""
        return self.call(lambda: list(self.api.deletions))

    def max_open_watches(self) -> dict[str, int]:
        """The most watches open at once, by "resource?labelSelector"."""
        return self.call(lambda: dict(self.api.max_open_watches))

    def reads(self, key: str) -> list[str]:
        """The lists and watches served for "resource?labelSelector", in order: "list",
        "watch", ..."""
        return self.call(lambda: list(self.api.reads.get(key, [])))

    def compact(self) -> None:
        """Drop the watch history and end the open watches (as an API server restart does):
        a client resuming from the version it last saw now gets 410 Gone. (Another object is
        written and deleted first, in the same step: no client has seen the newest version.)"""
        def compact() -> None:
            store = self.api.store
            store.put("ConfigMap", {"metadata": {"name": "standin-compaction",
                                                 "namespace": "kube-system", "uid": "-"}})
            store.remove("ConfigMap", "kube-system", "standin-compaction")
            store.compact()
            for watcher in list(self.api.store.watchers):
                watcher.queue.put_nowait(None)

        self.call(compact)

    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return self.call(lambda: [dict(p) for p in self.api.store.list("Pod", namespace)])

    def objects(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return self.call(lambda: [dict(p) for p in self.api.store.list(kind, namespace)])

    def calls(self) -> dict[str, int]:
        return self.call(lambda: dict(self.api.calls))

    def reset_counters(self) -> None:
        def reset() -> None:
            self.api.calls.clear()
            self.api.reads.clear()
            self.api.max_open_watches = self.api.open_watches.copy()
            assert self.kubelet is not None
            self.kubelet.max_live_pods = self.kubelet.live_pods
            self.kubelet.started = 0

        self.call(reset)

    @property
    def max_live_pods(self) -> int:
        assert self.kubelet is not None
        return self.call(lambda: self.kubelet.max_live_pods if self.kubelet else 0)
