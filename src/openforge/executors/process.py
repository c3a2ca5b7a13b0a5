"""Process-tree hygiene for rollouts: die with the parent, find every process, end them all.

Where an agent's processes are found, from strongest to weakest:

- **a PID namespace** (`ns_members`): in the isolating modes the agent lives in its own; when
  its PID 1 ends the kernel kills every member, and a scan of /proc by namespace proves it;
- **a child subreaper** (`become_subreaper`, `end_untrusted`): without namespaces the rollout
  supervisor marks itself a subreaper, so a process that calls `setsid`, double-forks and
  drops every marker is still re-parented to it, never to PID 1: the supervisor's
  descendants, less the ones it started itself before the agent, are the agent's;
- the process group, the leader's descendants and a marker variable in the environment
  (`kill_tree`): hints, for a tree whose members are not all ours to find otherwise (the
  local executor's supervisor, a checker's process, the Kubernetes stand-in's containers).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

import psutil

from openforge.sandbox.protocol import MARKER_ENV

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    return bool(libc.prctl(option, value, 0, 0, 0) == 0)


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False if it cannot."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def make_undumpable() -> bool:
    """Hide this process's memory, environment and fds from other processes of the same
    (non-root) user: /proc/<pid>/environ, mem and fd become root-only."""
    return _prctl(_PR_SET_DUMPABLE, 0)


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
    return [proc for proc in procs.values() if _live(proc)]


def _live(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


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

    Call it *before* reaping the leader, when the leader is this process's child: until it
    is reaped neither its pid nor its group's can be taken by a new process, which this
    would otherwise end (a command of ours, another rollout's supervisor). The leader is
    therefore never reaped here: its exit status belongs to whoever started it. The other
    children of this process that end here (orphans adopted as a subreaper) are reaped.
    """
    procs = tree_of(pid, pgid, marker)
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    _signal_all(procs, signal.SIGTERM)
    alive = _still_running(procs, grace_s)
    # The tree may have grown while it was dying: look again before the final blow.
    alive_pids = {p.pid for p in alive}
    for proc in tree_of(pid, pgid, marker):
        if proc.pid not in alive_pids:
            alive.append(proc)
            procs.append(proc)
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _signal_all(alive, signal.SIGKILL)
    _still_running(alive, grace_s)
    reap_adopted([proc for proc in procs if proc.pid != pid])
    return len(alive)


def end_and_reap(proc: subprocess.Popen[Any], marker: str | None = None,
                 grace_s: float = 2.0) -> int | None:
    """End `proc` (started with `start_new_session`) with its group, its descendants and
    the processes carrying `marker` (`kill_tree`), then reap it: its exit status, or None
    when it outlives the kill by 5 s.

    Watch such a process with `has_exited`, not `Popen.poll`: once it is reaped, its pid and
    its group's can be taken by a new process, which a kill by them would end. So a process
    that was reaped already is not killed here, only its status returned."""
    if proc.returncode is None:
        kill_tree(proc.pid, proc.pid, marker, grace_s)
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def has_exited(pid: int) -> bool:
    """Whether child `pid` has exited, without reaping it (it stays a zombie, holding its
    pid, until its `Popen` is waited for)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already
        return True


async def exited(proc: subprocess.Popen[Any]) -> None:
    """Until `proc` has exited, without reaping it (a pidfd in the event loop, else polling
    `waitid` with WNOWAIT): a zombie keeps its pid, so nothing can take it over while the
    rollout's tree is ended by that pid. `end_and_reap` reaps it afterwards."""
    import asyncio  # here, not at the top: the rollout supervisor imports this module, never awaits

    if proc.returncode is not None or has_exited(proc.pid):
        return
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        while not has_exited(proc.pid):
            await asyncio.sleep(0.05)
        return
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        if not has_exited(proc.pid):
            await done
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def wait_exited(proc: subprocess.Popen[Any], timeout_s: float) -> bool:
    """Wait up to `timeout_s` for `proc` to exit, without reaping it (`has_exited`);
    whether it did."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # reaped already, or no pidfds here: poll
        deadline = time.monotonic() + timeout_s
        while not has_exited(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        return has_exited(proc.pid)
    try:
        return bool(select.select([pidfd], [], [], timeout_s)[0])
    finally:
        os.close(pidfd)


def _still_running(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of `procs` neither gone nor zombies after up to `timeout_s`. Unlike
    `psutil.wait_procs` this reaps nothing: a child's status stays its owner's."""
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        alive = []
        for proc in procs:
            try:
                if proc.is_running() and _live(proc):
                    alive.append(proc)
            except psutil.Error:
                continue
        if not alive or time.monotonic() >= deadline:
            return alive
        procs = alive
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.04)


def reap_adopted(procs: list[psutil.Process]) -> None:
    """Reap those of `procs` that are dead children this process adopted as a subreaper
    (not ones it started itself: `started_here`).

    Only each process as it was found: one reaped meanwhile by another thread gave its pid
    back, and the new owner (a command of ours that just exited, say) keeps its exit status
    (psutil's `ppid` raises for a pid taken over: its start time differs). So reap through
    these, never by a bare pid."""
    me = os.getpid()
    for proc in procs:
        try:
            if (proc.status() == psutil.STATUS_ZOMBIE and proc.ppid() == me
                    and not started_here(proc.pid)):
                os.waitpid(proc.pid, os.WNOHANG)
        except (psutil.Error, OSError):
            continue


def signal_members(found: Iterable[int], scan: Callable[[], Collection[int]],
                   sig: int) -> set[int]:
    """Send `sig` to the processes `found` by a scan (the members of a namespace, of a
    cgroup) that `scan` still lists, and to no other: the pids signalled.

    A pid read from a scan may be freed and taken by another process before the signal
    goes. So each pid is first pinned with a pidfd, and `scan` asked again: a pid it still
    lists was a member while pinned (or the pinned process is gone, and the signal then
    reaches no one), so the signal goes through the pidfd, never by the number.
    """
    pinned: dict[int, int] = {}
    sent: set[int] = set()
    try:
        for pid in found:
            try:
                pinned[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            except OSError:  # no pidfds here (before Linux 5.3): by the number
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
                    sent.add(pid)
        for pid in set(scan()) & pinned.keys():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(pinned[pid], sig)
                sent.add(pid)
        return sent
    finally:
        for fd in pinned.values():
            os.close(fd)


def processes(pids: Iterable[int]) -> list[psutil.Process]:
    """The processes these pids are now. psutil keeps each one's start time, which tells
    it apart from a later owner of its pid (`reap_adopted`)."""
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
    return found


def wait_gone(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    """The pids among `pids` still alive (not zombies) after up to `timeout_s`."""
    return [proc.pid for proc in _still_running(processes(pids), timeout_s)]


# -- the agent's processes without a PID namespace (sandbox none) ------------------------------

Identity = tuple[int, float]


def identity(proc: psutil.Process) -> Identity | None:
    try:
        return proc.pid, proc.create_time()
    except psutil.Error:
        return None


def own_descendants() -> set[Identity]:
    """This process's live descendants, by (pid, start time): the trusted ones, taken before
    the agent starts (services an environment started, for example)."""
    found = set()
    for proc in psutil.Process().children(recursive=True):
        ident = identity(proc)
        if ident is not None:
            found.add(ident)
    return found


def untrusted_descendants(trusted: set[Identity]) -> list[psutil.Process]:
    """Descendants of this process that neither are trusted nor descend from a trusted one.

    As a subreaper this process adopts every orphan below it, so this is every process the
    agent started, wherever it moved in the tree. Zombies are left out (see `reap`).
    """
    me = os.getpid()
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            node: psutil.Process | None = proc
            mine = True
            while node is not None and node.pid != me:
                if identity(node) in trusted:
                    mine = False
                    break
                node = node.parent()
            if mine:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def started_here(pid: int) -> bool:
    """Whether child `pid` was started by this process for itself rather than adopted as a
    subreaper: it is then in our session.

    An agent runs in a session of its own (its harness starts one) and cannot join ours
    (`setsid` only makes new sessions), so this tells them apart whatever it forges. It
    matters because a child of ours is waited for elsewhere (asyncio's child watcher, a
    thread's `Popen.wait`): reaping it here would steal its exit status, and `subprocess`
    then reports a failed command as exit status 0."""
    try:
        return os.getsid(pid) == os.getsid(0)
    except OSError:  # already reaped
        return False


def reap_children() -> None:
    """Collect exit statuses of adopted children that died (zombies of this process); the
    children this process started itself are left to whoever waits for them."""
    reap_adopted(psutil.Process().children())


class LeftoverError(RuntimeError):
    """Agent processes that could not be ended: never score while they live."""


def end_untrusted(trusted: set[Identity], grace_s: float = 1.0, rounds: int = 50) -> int:
    """End every untrusted descendant: SIGTERM, `grace_s`, then stop-and-kill until none is
    left (stopped processes cannot fork, so a fork loop cannot outrun it). Returns how many
    were found; raises `LeftoverError` when some survive every round."""
    seen: set[int] = set()
    procs = untrusted_descendants(trusted)
    if procs and grace_s > 0:
        seen.update(p.pid for p in procs)
        _signal_all(procs, signal.SIGTERM)
        _still_running(procs, grace_s)
    for _ in range(rounds):
        procs = untrusted_descendants(trusted)
        if not procs:
            reap_children()
            return len(seen)
        seen.update(p.pid for p in procs)
        _signal_all(procs, signal.SIGSTOP)
        more = [p for p in untrusted_descendants(trusted) if p.pid not in {q.pid for q in procs}]
        _signal_all(procs + more, signal.SIGKILL)
        seen.update(p.pid for p in more)
        _still_running(procs + more, 1.0)
        reap_children()
    left = untrusted_descendants(trusted)
    if left:
        raise LeftoverError(f"{len(left)} agent processes survived every kill: "
                            + ", ".join(str(p.pid) for p in left[:10]))
    return len(seen)


# -- the agent's processes in a PID namespace (bwrap, namespaces) ------------------------------


def pid_namespace(pid: int) -> str | None:
    """The PID namespace `pid` lives in (`pid:[inode]`), or None when it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def ns_members(namespace: str) -> list[int]:
    """Every live (not zombie) process in `namespace`, by its pid in ours."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != namespace:
                continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            if state not in (b"Z", b"X"):
                found.append(int(entry))
        except (OSError, IndexError):
            continue
    return found
