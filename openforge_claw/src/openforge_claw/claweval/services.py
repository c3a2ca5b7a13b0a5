"""A Claw-Eval task's mock services, started from the checkout for one rollout.

Each service runs its own `command` from `task.yaml` (`python mock_services/<x>/server.py`)
in the checkout's root, as Claw-Eval's batch runner does, with the task's `env` (its
`*_FIXTURES` seeds, relative to that root) and `PORT` set to a free port of this machine
instead of the fixed one the task names, so rollouts run side by side. `python` is the
interpreter openforge-claw runs on (the one with the `claw-eval` extra: FastAPI, uvicorn),
through `loopback.py`, which binds the server to 127.0.0.1.

Readiness is the task's own health check: its full URL (moved to the new port), its method
(`POST` by default), the `X-Health-Check: 1` header Claw-Eval sends (its services skip
error injection for it), ready below status 500, within `ready_timeout` (at least
`MIN_READY_S`: this machine may be loaded). After the agent, `audit()` reads the service's
`/audit` route next to its `reset_endpoint`, as Claw-Eval's runner does.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from openforge.executors.process import die_with_parent, end_and_reap, has_exited

from openforge_claw.claweval.spec import ServiceDef
from openforge_claw.services.command import free_port

MIN_READY_S = 30.0
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                    "ALL_PROXY")


class ServiceStartError(RuntimeError):
    """A service exited or did not answer its health check in time."""


def moved(url: str, old_port: int, new_port: int) -> str:
    """`url` on the new port: `http://localhost:9100/x` -> `http://127.0.0.1:<new>/x`."""
    return re.sub(rf"^(https?://)(localhost|127\.0\.0\.1|0\.0\.0\.0):{old_port}(?=/|$)",
                  rf"\g<1>127.0.0.1:{new_port}", url)


class ClawEvalService:
    """One running service of one rollout."""

    def __init__(self, spec: ServiceDef, root: Path, python: str = sys.executable) -> None:
        self.spec = spec
        self.root = root
        self.python = python
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None

    @property
    def name(self) -> str:
        return self.spec.name

    def url(self, task_url: str) -> str:
        """A URL of this service as the task names it, moved to where it runs now."""
        return moved(task_url, self.spec.port, self.port)

    def argv(self) -> list[str]:
        argv = shlex.split(self.spec.command)
        if argv and argv[0] in ("python", "python3"):
            return [self.python, "-m", "openforge_claw.claweval.loopback", *argv[1:]]
        return argv

    def start(self) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in _PROXY_VARIABLES}
        env.update(self.spec.env)
        env["PORT"] = str(self.port)
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.argv(), cwd=self.root, env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._stderr, start_new_session=True,
                                     preexec_fn=die_with_parent())
        ready_s = max(self.spec.ready_timeout, MIN_READY_S)
        deadline = time.monotonic() + ready_s
        while time.monotonic() < deadline:
            if has_exited(self.proc.pid):
                code = end_and_reap(self.proc, grace_s=3.0)  # its group may live on
                self.proc = None
                tail = self.stderr_tail()
                self.stop()
                raise ServiceStartError(f"service {self.name!r} ({self.spec.command}) exited with "
                                        f"code {code} before it was ready: {tail}")
            if self.healthy():
                return
            time.sleep(0.2)
        self.stop()
        raise ServiceStartError(f"service {self.name!r} ({self.spec.command}) did not answer "
                                f"{self.url(self.spec.health_check)} within {ready_s:g}s")

    def healthy(self) -> bool:
        method = self.spec.health_check_method.upper()
        try:
            with httpx.Client(trust_env=False, timeout=2.0) as client:
                response = client.request("GET" if method == "GET" else "POST",
                                          self.url(self.spec.health_check),
                                          headers={"X-Health-Check": "1"})
            return response.status_code < 500
        except httpx.HTTPError:
            return False

    def audit(self) -> dict[str, Any] | None:
        """The service's audit record (`GET .../audit`), when it declares a reset endpoint."""
        if not self.spec.reset_endpoint or self.proc is None:
            return None
        audit_url = self.url(self.spec.reset_endpoint.rsplit("/reset", 1)[0] + "/audit")
        try:
            with httpx.Client(trust_env=False, timeout=10.0) as client:
                data = client.get(audit_url).json()
        except (httpx.HTTPError, ValueError):
            return None  # Claw-Eval's runner reads it best-effort too
        return data if isinstance(data, dict) else None

    def stderr_tail(self, limit: int = 1500) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace").strip()
        return text[-limit:]

    def stop(self) -> None:
        if self.proc is not None:
            end_and_reap(self.proc, grace_s=3.0)
            self.proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def start_all(specs: list[ServiceDef], root: Path, python: str) -> list[ClawEvalService]:
    """Start every service of a task; on a failure stop those already started."""
    started: list[ClawEvalService] = []
    try:
        for spec in specs:
            service = ClawEvalService(spec, root, python)
            service.start()
            started.append(service)
    except BaseException:
        for service in reversed(started):
            service.stop()
        raise
    return started
