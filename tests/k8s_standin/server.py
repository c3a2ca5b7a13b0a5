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

import psutil
import yaml
from aiohttp import web

from .apiserver import ApiServer, Fault
from .kubelet import MARKER_ENV, MARKER_PREFIX, Kubelet, Node

T = TypeVar("T")


def standin_processes() -> list[psutil.Process]:
    """Live (non-zombie) processes started by any stand-in kubelet, found by their marker."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARKER_ENV, "").startswith(MARKER_PREFIX):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


class StandIn:
    """An API server + kubelet stand-in on 127.0.0.1, on its own thread and event loop.

    Usage: `with StandIn(image_env={...}) as k8s: k8s.kubeconfig` (a file path).
    """

    def __init__(self, image_env: dict[str, str] | None = None, node: Node | None = None,
                 history: int = 5000) -> None:
        self.token = secrets.token_hex(16)
        self.root = Path(tempfile.mkdtemp(prefix="k8s-standin-"))
        self.api = ApiServer(self.token, history=history)
        self._image_env = image_env or {}
        self._node = node
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
        self.kubelet = Kubelet(self.api, self.root / "pods", self._node, self._image_env)
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
               retry_after: int | None = None) -> None:
        """Fail the next `count` `verb` calls on `resource` (e.g. "create", "pods") with `status`."""
        self.call(lambda: self.api.inject(Fault(verb, resource, status, count, retry_after)))

    def compact(self) -> None:
        """Drop the watch history and end the open watches (as an API server restart does):
        a client resuming from the version it last saw now gets 410 Gone."""
        def compact() -> None:
            self.api.store.compact()
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
            assert self.kubelet is not None
            self.kubelet.max_live_pods = self.kubelet.live_pods
            self.kubelet.started = 0

        self.call(reset)

    @property
    def max_live_pods(self) -> int:
        assert self.kubelet is not None
        return self.call(lambda: self.kubelet.max_live_pods if self.kubelet else 0)
