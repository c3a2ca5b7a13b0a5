"""The stand-in's container runtimes: real processes, or a simulation with none.

`ProcessRuntime` runs a container's command as a local process. As root (CI and this
project's machines) each container gets what a container runtime gives it, so that the
isolation the executor's Pod design relies on is real here too:

- its own PID namespace, with `/proc` showing only its processes: it cannot see, signal or
  read the environment of anything outside, and when its first process ends the kernel
  ends every process it left (a setsid'd, marker-less orphan included);
- its own mount namespace: the file system is read-only; the temporary directory (where
  every Pod's volumes live) and the kubelet's HOME are replaced by empty ones, with only
  this container's volumes and the image's paths (the interpreter, PYTHONPATH) mapped
  back, so a volume another container mounts is not there at all; a `/dev` of its own,
  where `/dev/termination-log` is this container's own file;
- no capabilities (`setpriv`), and no way to gain them.

Without root (or without `unshare`/`setpriv`) it falls back to a plain process group and
a marker variable, and says so (`isolated` is False): the tests of isolation then skip.

`SimRuntime` runs nothing: a `behaviour` function says how long each container runs, its
exit code and its termination message (the scale benchmark runs thousands of Pods so).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from openforge.executors.process import die_with_parent, end_and_reap, exited
from openforge.sandbox.protocol import MARKER_ENV  # noqa: E402

# This process's stand-ins only: other test runs on the machine have stand-ins of their own.
MARKER_PREFIX = f"k8s-standin-{os.getpid()}-"
# The PID namespaces of the containers started here and not yet ended (`standin_processes`).
NAMESPACES: set[str] = set()


@dataclass
class Launch:
    """What the kubelet asks a runtime to run for one container."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log_path: Path
    marker: str
    writable: list[Path] = field(default_factory=list)  # this container's volumes and dir
    termination_log: tuple[str, Path] | None = None  # (its path inside, the file here)
    # Volumes over folders of the image: (the folder, the volume here, read-only).
    mounts: list[tuple[str, Path, bool]] = field(default_factory=list)


class Handle:
    """A started container."""

    async def wait(self) -> int:
        raise NotImplementedError

    async def stop(self, grace: float) -> None:
        """SIGTERM to the container's first process; SIGKILL to all of it after `grace`."""
        raise NotImplementedError

    def kill(self) -> None:
        """SIGKILL now (the OOM killer, a node that is gone)."""
        raise NotImplementedError


def _pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _in_namespace(namespace: str) -> bool:
    return any(_pid_namespace(p) == namespace for p in psutil.pids())


def isolation_available() -> bool:
    """Root, `unshare`, `setpriv` and `mount` present, and namespaces allowed here."""
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "setpriv", "mount")):
        return False
    try:
        done = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--mount-proc",
                               "--kill-child", "--", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def image_paths(extra: list[str]) -> list[Path]:
    """What a container needs from this machine's file system: the interpreter, openforge,
    and `extra` (PYTHONPATH entries): the stand-in's idea of the image's contents."""
    import openforge

    paths = {Path(sys.base_prefix), Path(sys.prefix), Path(sys.exec_prefix),
             Path(openforge.__file__).resolve().parent.parent}
    paths.update(Path(p).resolve() for p in extra if p)
    # Keep the outermost of nested paths only.
    kept: list[Path] = []
    for path in sorted(paths, key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


class ProcessHandle(Handle):
    def __init__(self, proc: subprocess.Popen[bytes], launch: Launch,
                 init_pid: int | None) -> None:
        self.proc = proc
        self.launch = launch
        self.init_pid = init_pid  # the container's first process (PID 1 inside), isolated
        self.namespace = _pid_namespace(init_pid) if init_pid is not None else None
        if self.namespace:
            NAMESPACES.add(self.namespace)
        self.killed = False
        self._code: int | None = None
        self._waiter: asyncio.Future[int] | None = None

    async def wait(self) -> int:
        # One wait for every caller (the container's watcher, the Pod's deletion): the
        # process is ended and reaped once.
        if self._waiter is None:
            self._waiter = asyncio.ensure_future(self._wait())
        return await asyncio.shield(self._waiter)

    async def _wait(self) -> int:
        if self._code is None:
            # Not reaped before its stragglers are ended (`end_and_reap`): until then its
            # pid and group are its own, and no other process is ended by them.
            await exited(self.proc)
            code = await asyncio.to_thread(
                end_and_reap, self.proc,
                # The container's cgroup goes with its main process: so do stragglers.
                self.launch.marker if self.init_pid is None else None, 0.5)
            assert code is not None
            if self.killed:
                code = 137  # unshare cannot re-raise SIGKILL: say what happened
            self._code = 128 - code if code < 0 else code  # signal N -> 128 + N
            if self.namespace and not _in_namespace(self.namespace):
                NAMESPACES.discard(self.namespace)  # ended: its number may be reused
        return self._code

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.init_pid is not None:
                os.kill(self.init_pid, sig)  # PID 1 inside: SIGKILL takes the namespace
            else:
                os.killpg(self.proc.pid, sig)

    async def stop(self, grace: float) -> None:
        if self.proc.returncode is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(exited(self.proc)), max(grace, 0.1))
        except TimeoutError:
            self.kill()
            await exited(self.proc)

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.killed = True
            self._signal(signal.SIGKILL)


class ProcessRuntime:
    """Containers as local processes (isolated in namespaces when `isolate`)."""

    def __init__(self, isolate: bool | None = None, image_env: dict[str, str] | None = None) -> None:
        self.isolated = isolation_available() if isolate is None else isolate
        pythonpath = (image_env or {}).get("PYTHONPATH", "")
        self.keep = image_paths(pythonpath.split(os.pathsep))
        self.covers = [Path(tempfile.gettempdir()).resolve(), Path.home().resolve()]

    def _isolating_argv(self, launch: Launch) -> list[str]:
        """`unshare` + a shell prelude that builds the container's view, then the command."""
        keeps = [(p, True) for p in self.keep] + [(p.resolve(), False) for p in launch.writable]
        keeps = [(p, ro) for p, ro in keeps if any(p.is_relative_to(c) for c in self.covers)]
        q = shlex.quote
        # A /dev of its own (the usual devices, a private /dev/shm, its termination log),
        # which also holds the staging area: it is outside what gets covered below.
        lines = ["set -e", "mount -t tmpfs -o size=64m,mode=755 standin-dev /dev"]
        for dev, major, minor in (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7),
                                  ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0)):
            lines.append(f"mknod -m 666 /dev/{dev} c {major} {minor}")
        lines += ["ln -s /proc/self/fd /dev/fd", "ln -s /proc/self/fd/0 /dev/stdin",
                  "ln -s /proc/self/fd/1 /dev/stdout", "ln -s /proc/self/fd/2 /dev/stderr",
                  "mkdir /dev/shm /dev/.stage",
                  "mount -t tmpfs -o size=64m,mode=1777 standin-shm /dev/shm"]
        if launch.termination_log is not None:
            inside, here = launch.termination_log
            if inside.startswith("/dev/"):
                lines.append(f"touch {q(inside)} && mount --bind {q(str(here))} {q(inside)}")
        # Volumes over the image's folders first: the image's paths are staged below with
        # what is mounted in them.
        for inside, here, read_only in launch.mounts:
            lines.append(f"mount --bind {q(str(here))} {q(inside)}")
            if read_only:
                lines.append(f"mount -o remount,bind,ro {q(inside)}")
        for i, (path, read_only) in enumerate(keeps):
            lines.append(f"mkdir /dev/.stage/k{i} && mount --rbind {q(str(path))} /dev/.stage/k{i}")
            if read_only:
                lines.append(f"mount -o remount,bind,ro /dev/.stage/k{i}")
        for cover in self.covers:
            lines.append(f"mount -t tmpfs -o size=64m,mode=1777 standin-cover {q(str(cover))}")
        for i, (path, _) in enumerate(keeps):
            lines.append(f"mkdir -p {q(str(path))} && mount --move /dev/.stage/k{i} {q(str(path))}")
        lines.append("rmdir /dev/.stage/* /dev/.stage")
        for path in launch.writable:  # outside the covers: a mount of their own stays writable
            if not any(path.resolve().is_relative_to(c) for c in self.covers):
                lines.append(f"mount --bind {q(str(path))} {q(str(path))}")
        lines.append("mount -o remount,bind,ro /")
        lines.append('exec setpriv --bounding-set=-all --inh-caps=-all --no-new-privs -- "$@"')
        return ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child", "--",
                "sh", "-c", "\n".join(lines), "standin-container", *launch.argv]

    async def start(self, launch: Launch) -> Handle:
        argv = self._isolating_argv(launch) if self.isolated else launch.argv
        with open(launch.log_path, "ab") as log:
            # Popen, not asyncio's: its child watcher reaps at once, and a reaped
            # process's pid and group may be another's by the time stragglers are ended.
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=str(launch.cwd), env=launch.env, start_new_session=True,
                preexec_fn=die_with_parent())
        try:
            init_pid = await self._first_child(proc.pid) if self.isolated else None
        except asyncio.CancelledError:  # the Pod went while it started: so does this
            end_and_reap(proc, launch.marker, grace_s=0)
            raise
        return ProcessHandle(proc, launch, init_pid)

    @staticmethod
    async def _first_child(pid: int) -> int | None:
        for _ in range(200):
            with contextlib.suppress(psutil.Error):
                children = psutil.Process(pid).children()
                if children:
                    return children[0].pid
            await asyncio.sleep(0.01)
        return None

    async def probe(self, argv: list[str], env: dict[str, str]) -> bool:
        """An exec probe (run here: the kubelet has already mapped its paths)."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL, env=env)
            return await proc.wait() == 0
        except OSError:
            return False


def standin_processes() -> list[psutil.Process]:
    """Live (non-zombie) processes of any stand-in container: those in a container's PID
    namespace (isolated), or carrying the marker variable (plain)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            if NAMESPACES and _pid_namespace(proc.pid) in NAMESPACES:
                found.append(proc)
            elif proc.environ().get(MARKER_ENV, "").startswith(MARKER_PREFIX):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


# -- the simulation ------------------------------------------------------------------------------


@dataclass
class SimContainer:
    """How a simulated container behaves: runs `run_s` seconds (None: until stopped), then
    exits with `exit_code` leaving `message`; its startup probe passes after `ready_after_s`."""

    run_s: float | None = 0.0
    exit_code: int = 0
    message: str = ""
    ready_after_s: float = 0.0


# (pod (to read, not change), container name, volumes as {volume: {file: bytes}}) -> SimContainer
Behaviour = Callable[[dict[str, Any], str, dict[str, dict[str, bytes]]], SimContainer]


class SimHandle(Handle):
    def __init__(self, sim: SimContainer) -> None:
        loop = asyncio.get_running_loop()
        self.sim = sim
        self.started_at = loop.time()
        self.done: asyncio.Future[int] = loop.create_future()
        self._timer = loop.call_later(sim.run_s, self._exit, sim.exit_code) \
            if sim.run_s is not None else None

    def _exit(self, code: int) -> None:
        if not self.done.done():
            self.done.set_result(code)

    async def wait(self) -> int:
        return await self.done

    async def stop(self, grace: float) -> None:
        self._exit(143)

    def kill(self) -> None:
        self._exit(137)

    def ready(self) -> bool:
        return asyncio.get_running_loop().time() - self.started_at >= self.sim.ready_after_s
