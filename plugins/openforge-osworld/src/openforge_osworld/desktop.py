"""`DesktopClient`: openforge's handle on one `DesktopEnv`, living in a worker process.

The worker (`worker.py`) runs under the interpreter that has `desktop-env` installed; this
side starts it, sends one JSON request a line and reads one reply a line. Calls are
serialized by the caller (the computer API's episode lock); every reply has a deadline, so a
VM that hangs ends in a one-line `DesktopError`, never a hang.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("worker.py")


class DesktopError(RuntimeError):
    """The DesktopEnv worker failed, answered an error, or did not answer in time."""


class DesktopClient:
    """Starts `python worker.py` and talks to the DesktopEnv inside it."""

    def __init__(self, python: str, env: dict[str, str] | None = None,
                 stderr_path: Path | None = None, cwd: Path | None = None) -> None:
        self._stderr = open(stderr_path, "ab") if stderr_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                [python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=self._stderr, text=True, bufsize=1, env={**os.environ, **(env or {})},
                # DesktopEnv's VM managers keep registry and lock files in the working dir.
                cwd=cwd)
        except OSError as exc:
            raise DesktopError(f"cannot start the DesktopEnv worker with {python!r}: {exc}; "
                               "set the osworld `python` option to an interpreter that has "
                               "desktop-env installed") from None
        # Replies arrive on a reader thread so that a deadline can be kept without select().
        self._replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="desktop-env-reader").start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._replies.put(line)
        self._replies.put(None)

    def call(self, op: str, timeout_s: float = 600.0, **args: Any) -> dict[str, Any]:
        """Send one request and wait for its reply; `DesktopError` on failure."""
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise DesktopError(f"the DesktopEnv worker is gone (exit {self._proc.poll()}); "
                               "see desktop-env.log in the rollout") from None
        try:
            line = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            self.kill()
            raise DesktopError(f"DesktopEnv {op} did not answer within {timeout_s:.0f}s") from None
        if line is None:
            raise DesktopError(f"the DesktopEnv worker exited (code {self._proc.wait()}) during "
                               f"{op}; is desktop-env installed for that interpreter? "
                               "see desktop-env.log in the rollout")
        reply: dict[str, Any] = json.loads(line)
        if not reply.pop("ok", False):
            raise DesktopError(f"DesktopEnv {op} failed: {reply.get('error')}")
        return reply

    def close(self, timeout_s: float = 120.0) -> None:
        """Close the DesktopEnv (which stops its VM) and end the worker."""
        if self._proc.poll() is None:
            try:
                self.call("close", timeout_s=timeout_s)
            except DesktopError:
                pass
        self.kill()

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        if self._proc.stdin is not None:
            self._proc.stdin.close()  # stdout is the reader thread's; it ends at EOF
        if not isinstance(self._stderr, int):
            self._stderr.close()
