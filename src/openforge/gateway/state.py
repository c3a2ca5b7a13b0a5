"""What one gateway process holds: config, store, engine, model, live sessions, threads."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx

from openforge.config import GatewayConfig
from openforge.gateway.engines.base import Engine
from openforge.gateway.images import ImagePolicy
from openforge.gateway.memory import map_large_blocks
from openforge.gateway.model import ModelBundle
from openforge.gateway.recorder import CallRecorder
from openforge.gateway.sessions import SessionRegistry, serving_url, session_url, worker_of
from openforge.gateway.stats import GatewayStats
from openforge.gateway.workers import forwarded_headers
from openforge.store import Store
from openforge.types import Session

log = logging.getLogger("openforge.gateway")

T = TypeVar("T")

RENDER_THREADS = 4
"""Threads that parse, render and decode. The GIL runs one at a time; more than one lets a
huge request's tokenizing (which releases the GIL) overlap everyone else's small calls."""


class GatewayState:
    """Everything the app needs, built once per gateway process."""

    def __init__(self, config: GatewayConfig, store: Store, engine: Engine, bundle: ModelBundle,
                 *, admin_key: str | None = None, base_url: str = "", worker: int = 0,
                 peers: list[str] | None = None) -> None:
        self.config = config
        map_large_blocks()  # large request buffers go back to the OS when freed
        # Where image URLs may be read from and how large images may be (see images.py).
        self.image_policy = ImagePolicy.for_gateway(config)
        self.store = store
        # Each call commits from the event loop: keep WAL checkpoints (file copies and
        # syncs) out of those commits.
        store.checkpoint_in_background()
        self.recorder = CallRecorder(store)
        self.engine = engine
        self.bundle = bundle
        self.admin_key = admin_key or config.admin_key or secrets.token_urlsafe(32)
        # Set by the server once the port is bound; admin answers build session URLs from it.
        self.base_url = base_url
        # With several workers: every worker's base URL, by worker index (this one included).
        self.peers = list(peers or [])
        self.sessions = SessionRegistry(store, bundle, model_name=config.served_model_name,
                                        weight_version=engine.weight_version,
                                        policy=config.render_policy, worker=worker,
                                        workers=max(1, len(self.peers)))
        self.paused = False
        # What this process has served (/admin/health), counted from here: the model and
        # engine are loaded by now, so their CPU is not a call's.
        self.stats = GatewayStats()
        self.retry_after_s = 5
        self.stop_token_ids = list(bundle.stop_token_ids)
        self._pool: ThreadPoolExecutor | None = None

    def session_url(self, session: Session) -> str:
        """The base URL (ending in /v1) for `session`, on the worker that serves it."""
        return session_url(serving_url(self.peers or [self.base_url], session.id), session)

    async def close_session(self, session_id: str) -> Session | None:
        """Close a session in the store and in the memory of the worker that serves it (its
        token stops working at once); None when there is no such session."""
        session = self.sessions.close(session_id)
        if session is not None:
            await self.tell_workers(f"/admin/sessions/{session_id}/forget",
                                    only=worker_of(session_id, self.sessions.workers))
        return session

    async def tell_workers(self, path: str, body: dict[str, Any] | None = None,
                           only: int | None = None) -> None:
        """POST an admin route to the other workers (or worker `only`): they share this
        worker's store but not its memory (paused state, cached sessions)."""
        if len(self.peers) <= 1:
            return
        targets = [i for i in range(len(self.peers)) if i != self.sessions.worker
                   and (only is None or i == only)]
        headers = forwarded_headers(self.admin_key)
        async with httpx.AsyncClient(timeout=10) as client:
            for i in targets:
                try:
                    await client.post(self.peers[i].rstrip("/") + path, json=body or {},
                                      headers=headers)
                except httpx.HTTPError as exc:
                    log.warning("gateway worker %d did not take %s: %s", i, path, exc)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a render thread: work proportional to a request never runs on
        the event loop, so one large request cannot stall every other session."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(RENDER_THREADS, thread_name_prefix="openforge-render")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self.recorder.flush()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
