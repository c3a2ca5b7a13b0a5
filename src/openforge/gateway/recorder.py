"""Group commit: the calls recorded in one turn of the event loop share one transaction.

Each SQLite commit has a fixed cost in system calls (a WAL frame header and page per
changed page, file locks), and with several worker processes on one store every commit
also makes the others re-read the pages it changed. Under load many calls finish together;
`CallRecorder.record` queues a call and, for the first one of a turn, schedules a flush
with `call_soon`: the flush runs once the callbacks already due have run, and writes every
call queued by then in one transaction. Nothing waits for a timer, so a lone call is
committed as soon as before, and no call is committed later than the next turn of the loop.

A call's handler awaits its flush before it ends (`CallResponse.__call__`): whoever learns
from the handler that the call is over (a graceful shutdown, an in-process client) finds
it in the store. If the shared transaction fails, each call is written alone, and a call
that cannot be written alone goes to its `on_failure` (the pipeline writes a failed row
that says why), so one bad row never costs the others theirs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from openforge.store import NewCall, Store

log = logging.getLogger("openforge.gateway")

OnFailure = Callable[[Exception], None]


class CallRecorder:
    """Writes the calls recorded in one turn of the event loop in one transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pending: list[tuple[NewCall, OnFailure]] = []
        self._flushed: asyncio.Future[None] | None = None

    def record(self, call: NewCall, on_failure: OnFailure) -> asyncio.Future[None]:
        """Queue `call`; the future is done once it is committed (or handed to
        `on_failure`). Call from the event loop."""
        if self._flushed is None:
            loop = asyncio.get_running_loop()
            self._flushed = loop.create_future()
            loop.call_soon(self.flush)
        self._pending.append((call, on_failure))
        return self._flushed

    def flush(self) -> None:
        """Write every queued call now (also at shutdown, before the store closes)."""
        pending, flushed = self._pending, self._flushed
        self._pending, self._flushed = [], None
        try:
            if pending:
                self._write(pending)
        finally:
            if flushed is not None and not flushed.done():
                flushed.set_result(None)

    def _write(self, pending: list[tuple[NewCall, OnFailure]]) -> None:
        try:
            self.store.add_calls([call for call, _ in pending])
            return
        except Exception as exc:
            if len(pending) == 1:
                _failed(pending[0], exc)
                return
            log.warning("recording %d calls in one transaction failed (%s); recording each "
                        "alone", len(pending), exc)
        for item in pending:
            try:
                self.store.add_calls([item[0]])
            except Exception as exc:
                _failed(item, exc)


def _failed(item: tuple[NewCall, OnFailure], exc: Exception) -> None:
    call, on_failure = item
    try:
        on_failure(exc)
    except Exception:
        log.exception("call %s: not recorded", call.call.id)
