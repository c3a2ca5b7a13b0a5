"""Run the harness command in the agent's sandbox, then make sure nothing of it is left.

`run_agent` starts the command (in bubblewrap, in `nsinit`'s namespaces, or as a plain
process group), feeds it its stdin, waits until it ends or its time is up, ends every process
of the sandbox, and proves that none is left before it returns: in the isolating modes no
process of the sandbox's PID namespace remains; without isolation no descendant of the
supervisor that the supervisor did not start itself (the supervisor is a child subreaper, so
every orphan comes back to it). When some process cannot be ended it raises `LeftoverError`:
the supervisor never scores while any process of the agent lives.

The harness writes its stdout and stderr into files the supervisor opened (in the
supervisor's own directory, outside the sandbox): the agent holds those two descriptors
and nothing else of the supervisor's. They are opened for appending, so a result line the
agent writes into them through /proc is not overwritten by the harness's next line
(`protocol.output_file`, `sandbox.forgery`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openforge.executors.process import (
    Identity,
    LeftoverError,
    die_with_parent,
    end_untrusted,
    ns_members,
    pid_namespace,
    signal_members,
)
from openforge.harness import Command
from openforge.sandbox import bounded
from openforge.sandbox.bwrap import bwrap_argv
from openforge.sandbox.cgroups import joiner
from openforge.sandbox.modes import SandboxMode, bwrap_path
from openforge.sandbox.protocol import output_file
from openforge.sandbox.relay import IN_SANDBOX, Relay
from openforge.sandbox.view import Bind, View

_INFO_TIMEOUT_S = 60.0  # building a sandbox takes milliseconds; this only guards a hang
_GONE_TIMEOUT_S = 10.0  # for the kernel to finish killing a namespace's processes


@dataclass
class AgentExit:
    """How the harness ended, as the sandbox saw it."""

    returncode: int | None
    timed_out: bool
    duration_s: float
    ended: int = 0  # processes still running after the harness ended, ended by us
    setup_error: str | None = None


def _feed(proc: subprocess.Popen[bytes], text: str | None) -> None:
    if text is None or proc.stdin is None:
        return
    try:
        proc.stdin.write(text.encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def _read_info(fd: int, until_eof: bool) -> dict[str, Any]:
    """The sandbox's info messages (JSON objects, one per line or concatenated), merged."""
    buffer = b""
    info: dict[str, Any] = {}
    deadline = time.monotonic() + _INFO_TIMEOUT_S
    decoder = json.JSONDecoder()
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buffer += chunk
        text = buffer.decode(errors="replace").strip()
        parsed: dict[str, Any] = {}
        while text:
            try:
                obj, end = decoder.raw_decode(text)
            except ValueError:
                break
            if isinstance(obj, dict):
                parsed.update(obj)
            text = text[end:].strip()
        info = parsed
        if not until_eof and "child-pid" in info:
            break
    return info


def run_agent(mode: SandboxMode, command: Command, *, env: dict[str, str], view: View,
              work_dir: Path, stdout: Path, stderr: Path, timeout_s: float,
              trusted: set[Identity], grace_s: float = 1.0,
              relay: Relay | None = None, cgroups: Sequence[str] = ()) -> AgentExit:
    """Run `command` in `mode` (see the module docstring): in the isolating modes inside
    `view`, in a network namespace of its own that reaches only `relay`'s ports on
    127.0.0.1 (none without one); without isolation (`none`) the view is not mounted, the
    network is the host's, and `trusted` are the caller's own descendants, which are not the
    agent's. The sandbox starts inside `cgroups` (`cgroup.procs` files: the rollout's
    limits, `sandbox.cgroups`)."""
    preexec = joiner(cgroups, then=die_with_parent()) if cgroups else die_with_parent()
    if mode == "none":
        return _run_plain(command, env=env, stdout=stdout, stderr=stderr, timeout_s=timeout_s,
                          trusted=trusted, grace_s=grace_s, preexec=preexec)
    return _run_isolated(mode, command, env=env, view=view, work_dir=work_dir, stdout=stdout,
                         stderr=stderr, timeout_s=timeout_s, grace_s=grace_s, relay=relay,
                         preexec=preexec)


def _start_error(argv0: str, exc: Exception) -> str:
    """Why a sandbox did not start, in one line."""
    if isinstance(exc, OSError):
        return f"cannot run {argv0}: {exc.strerror or exc}"
    # subprocess reports only that the preexec_fn raised: the cgroups are all it does besides
    # arming the parent-death signal, which cannot fail.
    return f"cannot start {argv0} in the rollout's cgroup ({exc})"


def _run_plain(command: Command, *, env: dict[str, str], stdout: Path, stderr: Path,
               timeout_s: float, trusted: set[Identity], grace_s: float,
               preexec: Callable[[], None]) -> AgentExit:
    started = time.monotonic()
    timed_out = False
    try:
        with output_file(stdout) as out, output_file(stderr) as err:
            proc = subprocess.Popen(
                command.argv, cwd=str(command.cwd) if command.cwd else None, env=env,
                stdout=out, stderr=err,
                stdin=subprocess.PIPE if command.stdin is not None else subprocess.DEVNULL,
                start_new_session=True, preexec_fn=preexec)
    except (OSError, subprocess.SubprocessError) as exc:
        return AgentExit(None, False, 0.0, setup_error=_start_error(command.argv[0], exc))
    try:
        # A thread feeds stdin, so a harness that never reads it cannot block us.
        threading.Thread(target=_feed, args=(proc, command.stdin), daemon=True).start()
        try:
            proc.wait(timeout=max(timeout_s, 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        # The leader first, through its Popen (which must be the one to reap it).
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # Also after a clean exit: whatever the harness left running must go.
        ended = end_untrusted(trusted, grace_s=grace_s)
    return AgentExit(proc.returncode, timed_out, time.monotonic() - started, ended=ended)


def _run_isolated(mode: SandboxMode, command: Command, *, env: dict[str, str], view: View,
                  work_dir: Path, stdout: Path, stderr: Path, timeout_s: float,
                  grace_s: float, relay: Relay | None,
                  preexec: Callable[[], None]) -> AgentExit:
    started = time.monotonic()
    view = dataclasses.replace(view, cwd=str(command.cwd or view.cwd))
    relayed: list[str] = []
    if relay is not None and relay.ports:
        # The relay's unix sockets, read-only: PID 1 passes the harness's connections to them.
        view = dataclasses.replace(view, binds=[*view.binds, Bind(str(relay.directory),
                                                                  IN_SANDBOX)])
        relayed = ["--relay", IN_SANDBOX, ",".join(map(str, relay.ports))]
    info_r, info_w = os.pipe()
    status_r, status_w = os.pipe()
    nsinit = [sys.executable, "-m", "openforge.sandbox.nsinit"]
    if mode == "bwrap":
        bwrap = bwrap_path()
        if bwrap is None:
            return AgentExit(None, False, 0.0, setup_error="bubblewrap is no longer installed")
        argv = bwrap_argv(bwrap, view, [*nsinit, "--reap", str(status_w), *relayed, "--",
                                        *command.argv], info_w)
    else:
        plan = work_dir / "nsinit.json"
        base = work_dir / "nsroot"
        base.mkdir(exist_ok=True)
        plan.write_text(json.dumps({
            "view": view.to_json(), "base": str(base),
            "relay": {"dir": IN_SANDBOX, "ports": relay.ports} if relayed and relay else None}))
        argv = [*nsinit, str(plan), str(info_w), str(status_w), "--", *command.argv]
    try:
        with output_file(stdout) as out, output_file(stderr) as err:
            proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=err, pass_fds=(info_w, status_w),
                stdin=subprocess.PIPE if command.stdin is not None else subprocess.DEVNULL,
                start_new_session=True, preexec_fn=preexec)
    except (OSError, subprocess.SubprocessError) as exc:
        for fd in (info_r, status_r):
            os.close(fd)
        return AgentExit(None, False, 0.0, setup_error=_start_error(argv[0], exc))
    finally:
        os.close(info_w)
        os.close(status_w)
    held = None
    try:
        try:
            info = _read_info(info_r, until_eof=mode == "namespaces")
        finally:
            os.close(info_r)
        child = info.get("child-pid")
        namespace = (f"pid:[{info['pid-namespace']}]" if info.get("pid-namespace")
                     else pid_namespace(int(child)) if child else None)
        held = _hold(int(child), namespace) if child and namespace else None
        if held is None:  # it ended already: nothing of it to sweep, and its number is free
            namespace = None
        if info.get("error") or child is None:
            _kill(proc, child, namespace)  # PID 1 dies with its parent anyway
            tail = bounded.tail(stderr, 1500).strip()
            why = info.get("error") or f"{mode} did not start the sandbox" + \
                (f": {tail}" if tail else "")
            return AgentExit(None, False, time.monotonic() - started, setup_error=str(why))
        # A thread feeds stdin, so a harness that never reads it cannot block us.
        feeder = threading.Thread(target=_feed, args=(proc, command.stdin), daemon=True)
        feeder.start()
        timed_out = False
        try:
            proc.wait(timeout=max(timeout_s, 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _end_namespace(proc, int(child), namespace, grace_s if timed_out else 0.0)
        status = _read_status(status_r)
    finally:
        os.close(status_r)
        if held is not None:
            os.close(held)
    if status is None:  # PID 1 never reported: it was killed (the timeout) or died
        code = None if timed_out else proc.returncode
        return AgentExit(code, timed_out, time.monotonic() - started)
    if "exec_error" in status:
        return AgentExit(None, False, time.monotonic() - started,
                         setup_error=str(status["exec_error"]))
    return AgentExit(int(status["exit"]), timed_out, time.monotonic() - started,
                     ended=int(status.get("left", 0)))


def _read_status(fd: int) -> dict[str, Any] | None:
    """What the sandbox's PID 1 reported (`{"exit": CODE, "left": N}`), if it did."""
    os.set_blocking(fd, False)
    try:
        raw = os.read(fd, 4096)
    except BlockingIOError:
        return None
    try:
        status = json.loads(raw)
    except ValueError:
        return None
    ok = isinstance(status, dict) and ("exit" in status or "exec_error" in status)
    return status if ok else None


def _hold(child: int, namespace: str) -> int | None:
    """A descriptor of the sandbox's PID namespace, so that its number stays its own until
    we know its processes gone: the kernel reuses the numbers of freed namespaces, and a
    sweep by number would then kill a concurrent rollout's new sandbox (its agent, or a
    grader run in bubblewrap, which then ends with exit code 137). None when the namespace
    is gone already."""
    try:
        fd = os.open(f"/proc/{child}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    if f"pid:[{os.fstat(fd).st_ino}]" != namespace:  # the pid is another process's now
        os.close(fd)
        return None
    return fd


def _kill(proc: subprocess.Popen[bytes], child: Any, namespace: str | None = None) -> None:
    """SIGKILL the sandbox's PID 1 (only while it still is: a dead pid may be reused) and the
    process that started the sandbox, and reap the latter."""
    if child and namespace is not None:
        pid = int(child)
        signal_members([pid], lambda: [pid] if pid_namespace(pid) == namespace else [],
                       signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _end_namespace(proc: subprocess.Popen[bytes], child: int, namespace: str | None,
                   grace_s: float) -> None:
    """End the sandbox: its PID 1 goes, so the kernel kills every member; then prove it."""
    def members() -> list[int]:
        return ns_members(namespace) if namespace else []

    found = members()
    if grace_s > 0 and found:
        # PID 1 stays: it reports the harness's exit once the harness ends.
        signal_members([pid for pid in found if pid != child], members, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    _kill(proc, child, namespace)
    if namespace is None:
        return
    deadline = time.monotonic() + _GONE_TIMEOUT_S
    while True:
        left = members()
        if not left:
            return
        if time.monotonic() >= deadline:
            raise LeftoverError(f"{len(left)} processes of the sandbox's PID namespace "
                                f"{namespace} are still alive: {left[:10]}")
        signal_members(left, members, signal.SIGKILL)
        time.sleep(0.05)
