"""Process-tree hygiene for sandboxed rollouts: die with the parent, kill everything on the way out.

A rollout's processes are found three ways, because each alone misses something: the
process group (what `killpg` reaches), the descendants of the leader (a child that called
`setsid` left the group but not the tree), and a marker variable in the environment
(a daemon that double-forked left the tree too, but it still carries the marker).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable

import psutil

MARKER_ENV = "OPENFORGE_SANDBOX_ID"
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None]:
    """A `preexec_fn` that asks the kernel to SIGKILL the child when its parent dies.

    This is what keeps a rollout from outliving a runner that crashed or was SIGKILLed.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:  # not Linux/glibc: nothing to arm
        return lambda: None

    def arm() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return arm


def _marked(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid():
                continue
            if proc.environ().get(MARKER_ENV) == marker:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def tree_of(pid: int, pgid: int | None = None, marker: str | None = None) -> list[psutil.Process]:
    """Every live process that belongs to the rollout led by `pid`."""
    procs: dict[int, psutil.Process] = {}
    try:
        leader = psutil.Process(pid)
        procs[pid] = leader
        for child in leader.children(recursive=True):
            procs[child.pid] = child
    except psutil.Error:
        pass
    if pgid is not None:
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) == pgid:
                    procs[proc.pid] = proc
            except (psutil.Error, OSError):
                continue
    if marker:
        for proc in _marked(marker):
            procs[proc.pid] = proc
    procs.pop(os.getpid(), None)
    return list(procs.values())


def _signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def kill_tree(pid: int, pgid: int | None = None, marker: str | None = None,
              grace_s: float = 2.0) -> int:
    """SIGTERM the rollout's group and tree, SIGKILL what is left after `grace_s`.

    Returns how many processes had to be SIGKILLed. Safe to call on a finished rollout:
    it then sweeps stragglers (background daemons the harness left) and returns.
    """
    procs = tree_of(pid, pgid, marker)
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    _signal_all(procs, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    # The tree may have grown while it was dying: look again before the final blow.
    alive_pids = {p.pid for p in alive}
    for proc in tree_of(pid, pgid, marker):
        if proc.pid not in alive_pids:
            alive.append(proc)
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _signal_all(alive, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=grace_s)
    return len(alive)


def wait_gone(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    """The pids among `pids` still alive (not zombies) after up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.Error:
                continue
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)
