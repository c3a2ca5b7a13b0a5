"""A mock service that is a program of the task's own (an openforge claw task's `command`
kind; a Claw-Eval checkout's services start through `claweval/services.py`, which shares
`free_port` from here).

The command runs in its own process group with `{port}` in its arguments and the `PORT`
environment variable set to a free loopback port chosen here (never the fixed port the
task file names: concurrent rollouts would collide). It is ready when `health_check`
answers below 500. `stop()` kills the whole group; the kernel also kills it when the
rollout process dies first.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from openforge.executors.process import die_with_parent, end_and_reap, has_exited

_READY_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class CommandService:
    """A service started from a command line; the grader sees its `/state` answer if any."""

    def __init__(self, name: str, command: str, cwd: Path, env: dict[str, str] | None = None,
                 health_check: str = "/", state_path: str | None = None) -> None:
        self.name = name
        self.command = command
        self.cwd = cwd
        self.env = env or {}
        self.health_check = health_check
        self.state_path = state_path
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port = free_port()
        argv = [a.replace("{port}", str(self.port)) for a in shlex.split(self.command)]
        env = {**os.environ, **self.env, "PORT": str(self.port)}
        self.proc = subprocess.Popen(argv, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=die_with_parent())
        deadline = time.monotonic() + _READY_TIMEOUT_S
        # One client for every poll, and no certificates for a plain-HTTP local service: a
        # new default client each time cost 0.03-0.14 s of CPU per poll.
        with _local_client(timeout_s=1.0) as client:
            while time.monotonic() < deadline:
                if has_exited(self.proc.pid):
                    code = end_and_reap(self.proc, grace_s=3.0)  # its group may live on
                    self.proc = None
                    raise RuntimeError(f"service {self.name!r} exited with code {code} "
                                       f"before it was ready: {self.command}")
                try:
                    if client.get(self.url + self.health_check).status_code < 500:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"service {self.name!r} was not ready on port {self.port} "
                           f"within {_READY_TIMEOUT_S:g}s: {self.command}")

    def stop(self) -> None:
        if self.proc is None:
            return
        end_and_reap(self.proc, grace_s=3.0)
        self.proc = None

    def snapshot(self) -> dict[str, Any]:
        state: Any = None
        if self.state_path and self.proc is not None:
            try:
                with _local_client(timeout_s=5.0) as client:
                    state = client.get(self.url + self.state_path).json()
            except (httpx.HTTPError, ValueError):
                state = None
        return {"url": self.url, "state": state, "log": []}


def _local_client(timeout_s: float) -> httpx.Client:
    """A client for a service on this machine's loopback: plain HTTP (no certificates to
    load) and no proxy from the environment in the way."""
    return httpx.Client(trust_env=False, verify=False, timeout=timeout_s)
