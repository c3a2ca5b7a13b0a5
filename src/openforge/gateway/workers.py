"""Several gateway processes on one machine (`gateway.workers = N`).

The gateway's CPU work per call is Python, one core per process; N worker processes give
N cores. The parent binds N listening sockets (one port each) and starts one worker per
socket (`python -m openforge.gateway.server --worker I ...`), all on the same store. Each
session is served by exactly one worker, the one its id maps to (`sessions.worker_of`):
the runner hands a session that worker's URL, and a worker refuses (421) a session of
another. A worker that dies is started again on the same socket; the sessions it served
continue from the store (restart recovery replays their calls).

Admin routes work on any worker: the workers share the store, and pass to each other what
lives in memory (pause/resume, a closed session's cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from openforge.config import EngineConfig, GatewayConfig
from openforge.sandbox.protocol import GATEWAY_WORKER_SPEC_ENV

log = logging.getLogger("openforge.gateway")

START_TIMEOUT_S = 180.0
WORKER_SPEC_ENV = GATEWAY_WORKER_SPEC_ENV
"""The environment variable a worker reads its config and admin key from."""
FORWARDED = "x-openforge-forwarded"
"""Marks an admin request one worker passed to another (not to be passed on again)."""


def forwarded_headers(admin_key: str) -> dict[str, str]:
    """The headers of an admin request passed to a worker (by the pool or another worker)."""
    return {"authorization": f"Bearer {admin_key}", FORWARDED: "1"}


class WorkerPool:
    """N gateway worker processes, one per bound socket, all on one store."""

    def __init__(self, config: GatewayConfig, engine_config: EngineConfig, store_path: Path,
                 admin_key: str, sockets: list[socket.socket], urls: list[str]) -> None:
        self.config = config
        self.engine_config = engine_config
        self.store_path = store_path
        self.admin_key = admin_key
        self.sockets = sockets
        self.urls = urls
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * len(sockets)
        self._monitor: asyncio.Task[None] | None = None
        self._stopping = False

    def _spawn(self, index: int) -> subprocess.Popen[bytes]:
        sock = self.sockets[index]
        # The config (engine API keys included) and the admin key go through the
        # environment, which only this user can read, never the command line (`ps`).
        spec = json.dumps({"gateway": self.config.model_dump(mode="json"),
                           "engine": self.engine_config.model_dump(mode="json"),
                           "admin_key": self.admin_key})
        cmd = [sys.executable, "-m", "openforge.gateway.server", "--store", str(self.store_path),
               "--worker", str(index), "--peers", ",".join(self.urls),
               "--fd", str(sock.fileno())]
        return subprocess.Popen(cmd, pass_fds=[sock.fileno()], stdout=subprocess.DEVNULL,
                                env={**os.environ, WORKER_SPEC_ENV: spec})

    async def start(self) -> None:
        """Start every worker and wait until each answers its health route."""
        for i in range(len(self.sockets)):
            self.processes[i] = self._spawn(i)
        await asyncio.gather(*(self._wait_healthy(i) for i in range(len(self.sockets))))
        self._monitor = asyncio.ensure_future(self._watch())

    async def _wait_healthy(self, index: int) -> None:
        url = f"{self.urls[index]}/admin/health"
        headers = {"authorization": f"Bearer {self.admin_key}"}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        async with httpx.AsyncClient(timeout=5) as client:
            while loop.time() < deadline:
                process = self.processes[index]
                if process is not None and process.poll() is not None:
                    raise RuntimeError(f"gateway worker {index} exited with "
                                       f"{process.returncode} while starting")
                try:
                    if (await client.get(url, headers=headers)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError(f"gateway worker {index} did not start in {START_TIMEOUT_S:g} s")

    async def _watch(self) -> None:
        """Start again any worker that died (its sessions resume from the store)."""
        while not self._stopping:
            await asyncio.sleep(1.0)
            for i, process in enumerate(self.processes):
                if self._stopping or process is None or process.poll() is None:
                    continue
                log.error("gateway worker %d exited with %s; starting it again", i,
                          process.returncode)
                self.processes[i] = self._spawn(i)
                with contextlib.suppress(RuntimeError):
                    await self._wait_healthy(i)

    async def served(self) -> list[dict[str, Any]]:
        """Each worker's `served` counters (`gateway/stats.py`), from its health route; a
        worker that does not answer is left out (and logged)."""
        async def one(client: httpx.AsyncClient, index: int) -> dict[str, Any] | None:
            try:
                r = await client.get(f"{self.urls[index]}/admin/health",
                                     headers=forwarded_headers(self.admin_key))
                return dict(r.raise_for_status().json()["served"])
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                log.warning("gateway worker %d did not report what it served: %s", index, exc)
                return None

        async with httpx.AsyncClient(timeout=5) as client:
            answers = await asyncio.gather(*(one(client, i) for i in range(len(self.urls))))
        return [a for a in answers if a is not None]

    def post(self, index: int, path: str, body: dict[str, object] | None = None) -> None:
        """POST an admin route on worker `index` (from synchronous callers)."""
        try:
            httpx.post(self.urls[index] + path, json=body or {}, timeout=10,
                       headers=forwarded_headers(self.admin_key))
        except httpx.HTTPError as exc:
            log.warning("gateway worker %d did not take %s: %s", index, path, exc)

    async def stop(self) -> None:
        self._stopping = True
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        for process in self.processes:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            if process is None:
                continue
            try:
                await asyncio.to_thread(process.wait, 20)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)
        for sock in self.sockets:
            sock.close()

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p is not None]


def inherit_socket(fd: int) -> socket.socket:
    """The listening socket a parent passed to this worker process."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    os.set_inheritable(fd, False)
    return sock
