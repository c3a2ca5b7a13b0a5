"""Large request bodies are decoded in a helper process, not under the gateway's GIL.

`json.loads` holds the GIL for as long as it decodes: tens of milliseconds for a 10 MB
body (more when the machine is busy and the thread is preempted meanwhile), and the event
loop serves no other session until it returns, even when the decoding runs in a render
thread. Bodies over `PROCESS_BYTES` are decoded by `json.loads` in a helper process
instead; this process only writes the bytes to a pipe and unpickles the value (a UTF-8
decode of its strings), with the GIL released while it waits.

The helper is `python -I -S` running `_HELPER` (nothing but `json` and `pickle`: a few MB),
started on the first such body, at a lower CPU priority than the gateway (the sessions it
would otherwise slow down come first). It decodes one body at a time and answers the value
or the exception `json.loads` raised, which is raised here as it would have been. If the
helper cannot be used (it cannot start, it died), the body is decoded in this process, as
before. The helper ends when this process does (its stdin closes).

Smaller bodies are decoded here, by `parse`: pydantic-core's parser where it takes the
input (it refuses more than `json` does, never less), `json.loads` for the rest.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import IO, Any

import pydantic_core

log = logging.getLogger("openforge.gateway")

PROCESS_BYTES = 1 << 20
"""Bodies larger than this are decoded in the helper process."""
HELPER_NICENESS = 10

_HELPER = r"""
import json, os, pickle, struct, sys
try:
    os.nice(int(sys.argv[1]))
except OSError:
    pass
read, write = sys.stdin.buffer.read, sys.stdout.buffer
while True:
    head = read(8)
    if len(head) < 8:
        break
    raw = read(struct.unpack("<Q", head)[0])
    try:
        answer = pickle.dumps((True, json.loads(raw)), protocol=5)
    except BaseException as exc:
        answer = pickle.dumps((False, exc), protocol=5)
    write.write(struct.pack("<Q", len(answer)))
    write.write(answer)
    write.flush()
    del raw, answer  # large blocks go back to the system while it waits
"""

_lock = threading.Lock()  # one body at a time through the helper's pipes
_helper: tuple[int, subprocess.Popen[bytes]] | None = None  # (our pid, the helper)


def parse(raw: bytes | str) -> Any:
    """`json.loads(raw)`'s value, with about a third less CPU on the gateway's hot path.

    pydantic-core's parser takes what it can; anything it refuses (invalid JSON, but also
    what `json.loads` accepts and it does not: a BOM, UTF-16, lone surrogates) goes through
    `json.loads`, so the value and every error are json's own.
    """
    try:
        return pydantic_core.from_json(raw)
    except ValueError:
        return json.loads(raw)


def loads(raw: bytes) -> Any:
    """`json.loads(raw)`, in the helper process when `raw` is large."""
    if len(raw) <= PROCESS_BYTES:
        return parse(raw)
    with _lock:
        answer = _ask(raw)
    if answer is None:
        return parse(raw)
    ok, value = pickle.loads(answer)
    if not ok:
        raise value
    return value


def _ask(raw: bytes) -> bytes | None:
    """The helper's pickled answer for `raw`; None when it cannot give one."""
    global _helper
    helper = _running_helper()
    if helper is None:
        return None
    stdin, stdout = helper.stdin, helper.stdout
    assert stdin is not None and stdout is not None
    try:
        stdin.write(struct.pack("<Q", len(raw)))
        stdin.write(raw)
        stdin.flush()
        head = _read(stdout, 8)
        return _read(stdout, struct.unpack("<Q", head)[0])
    except (OSError, EOFError, struct.error) as exc:
        log.warning("the JSON helper process failed (%s); decoding in the gateway", exc)
        helper.kill()
        helper.wait()
        _helper = None
        return None


def _running_helper() -> subprocess.Popen[bytes] | None:
    global _helper
    if _helper is not None and (_helper[0] != os.getpid() or _helper[1].poll() is not None):
        _helper = None  # a forked copy's, or one that exited: start another
    if _helper is None:
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _HELPER, str(HELPER_NICENESS)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                close_fds=True)
        except OSError as exc:
            log.warning("cannot start the JSON helper process (%s); decoding in the gateway",
                        exc)
            return None
        _helper = (os.getpid(), process)
    return _helper[1]


def _read(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError("the JSON helper process closed its output")
    return data
