"""The trusted half of an isolated rollout's network: one unix socket per allowed port.

An isolating sandbox has its own network namespace, so nothing the host listens on is
reachable from it. `Relay(targets)` opens, in a fresh private directory, a unix socket
`PORT.sock` for each allowed port (`openforge.sandbox.ports.allowed`) and joins every
connection made to it to a new TCP connection to that port's target on the host. The sandbox
sees the directory read-only; inside, its PID 1 (`nsinit.forward`) listens on 127.0.0.1:PORT
and [::1]:PORT and passes each connection to `PORT.sock`, so the harness keeps the URLs it was
given, and reaches those ports and no other.

`close()` (or leaving the `with` block) stops accepting, ends every open connection, joins
every thread and removes the directory: nothing of a rollout's relay outlives it. A
supervisor killed with SIGKILL cannot; the directory is named for it (`sandbox.leftovers`), and
the next local executor made on the machine removes it.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from types import TracebackType

from openforge.sandbox.leftovers import make_folder
from openforge.sandbox.nsinit import pump

IN_SANDBOX = "/run/openforge-relay"  # where the sandbox sees the directory (read-only)
THREAD_NAME = "openforge-relay"


def relay_parent() -> Path:
    """Where relays make their folders: /tmp, whatever TMPDIR says (a unix socket's path
    holds 108 bytes, which a long TMPDIR would not leave), else the temporary folder."""
    tmp = Path("/tmp")
    return tmp if tmp.is_dir() and os.access(tmp, os.W_OK | os.X_OK) else Path(tempfile.gettempdir())


def socket_name(port: int) -> str:
    """The unix socket of `port` in a relay's directory (the sandbox side uses the same)."""
    return f"{port}.sock"


class Relay:
    """Unix sockets in `directory` (see the module docstring), serving until `close`."""

    def __init__(self, targets: dict[int, tuple[str, int]]) -> None:
        self.directory = make_folder("relay", relay_parent())
        self.ports = sorted(targets)
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._listeners: list[socket.socket] = []
        try:
            for port, target in targets.items():
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listener.bind(str(self.directory / socket_name(port)))
                listener.listen(64)
                self._listeners.append(listener)
                self._start(self._accept, listener, target)
        except BaseException:
            self.close()
            raise

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True,  # type: ignore[arg-type]
                                  name=THREAD_NAME)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._open.add(sock)
            return True

    def _accept(self, listener: socket.socket, target: tuple[str, int]) -> None:
        while True:
            try:
                inside, _ = listener.accept()
            except OSError:
                return  # closed
            if not self._track(inside):
                inside.close()
                return
            self._start(self._connect, inside, target)

    def _connect(self, inside: socket.socket, target: tuple[str, int]) -> None:
        try:
            outside = socket.create_connection(target)
        except OSError:
            self._forget(inside)  # the sandbox sees its connection closed, like a refusal
            return
        if not self._track(outside):
            outside.close()
            self._forget(inside)
            return
        answer = threading.Thread(target=pump, args=(outside, inside), daemon=True,
                                  name=THREAD_NAME)
        answer.start()
        pump(inside, outside)
        answer.join()
        self._forget(inside)
        self._forget(outside)

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)
        sock.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            listeners, self._listeners = self._listeners, []
            sockets = list(self._open)
        for listener in listeners:
            # shutdown wakes a thread blocked in accept(); close alone may not.
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        while True:
            with self._lock:
                pending = [t for t in self._threads if t.is_alive()]
                self._threads = pending
            if not pending:
                break
            for thread in pending:
                thread.join()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

