"""`serve(server, handle)`: a listening socket's accept loop in a thread, one thread per
connection; it ends when the socket is shut down. For tests that stand up a real service."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def serve(server: socket.socket, handle: Callable[[socket.socket], None]) -> None:
    def loop() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
