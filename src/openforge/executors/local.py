"""The `local` executor: one rollout = one supervisor process on this machine.

Per rollout: a fresh directory (mode 0700) holding the spec and the supervisor's output, and
its `agent/` part; the supervisor (`python -m openforge.rollout`) started as a plain process
with an environment cut down to an allowlist (`openforge.sandbox.protocol.scrub_env`: no API
keys, tokens or cloud credentials of the user reach a rollout) and its own session; a hard
timeout that ends the whole tree; PR_SET_PDEATHSIG so nothing outlives a crashed runner.
The supervisor runs the harness in the agent's sandbox (option `sandbox`), ends it, scores it
and prints the result as its last line, signed with a per-attempt key it got on its stdin.
This executor accepts the result only from a supervisor that exited 0, only on that last
line, only with a valid signature, and only for this attempt; anything else is
`infra_error` ("rollout supervisor died: ..."), never a pass. A result line before the
supervisor's (the agent wrote it there, through /proc, without isolation) makes the attempt a
`violation` ("forged result line in the supervisor's stdout": `sandbox.forgery`).

`sandbox` (`auto` by default): `bwrap` when bubblewrap is installed, else `namespaces` when
the kernel lets this user create user, mount and PID namespaces, else `none`, which warns
loudly. docs/sandboxing.md says what each guarantees. `pass_env` names extra variables a
rollout may see (never a credential-like name).

`max_processes` (1024 by default) and `memory_max` (none by default) limit each rollout's
agent through a cgroup of its own (`openforge.sandbox.cgroups`): the executor makes it
before the supervisor starts, the supervisor starts every sandbox of the attempt in it, and
the executor ends what is left in it and removes it afterwards. Where this user cannot make
cgroups, the default process limit is left out (the run's header says so) and an explicit
one is refused. Where it can make one in the `cpu` hierarchy, all of a rollout's processes
weigh as one against the runner's and the other rollouts' on the CPU, and `cpu_max` (none
by default) caps their CPU time.

`disk_max` (10 GiB) and `files_max` (1,000,000) bound what each rollout's folder (the
agent's HOME and workspace) takes of the runner's disk: the executor measures it every
`disk_check_s` seconds while the rollout runs and ends the rollout once it is past either
(`openforge.sandbox.disk`); judged as a Pod evicted for its volume's size limit is
(`_ended_for_disk`).

The runner process is made a child subreaper: if an agent kills its supervisor (possible only
without isolation), the agent's orphans are re-parented to the runner, and the executor ends
every child the runner adopted since that supervisor started (other than supervisors).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Literal

import psutil
from pydantic import ByteSize, Field, field_validator

from openforge.errors import OpenforgeError
from openforge.executor import Executor
from openforge.executors.process import (
    become_subreaper,
    die_with_parent,
    end_and_reap,
    exited,
    kill_tree,
    make_undumpable,
    reap_adopted,
    started_here,
)
from openforge.options import PluginOptions
from openforge.rollout import agents_own_crash
from openforge.sandbox import bounded, disk, forgery
from openforge.sandbox.cgroups import CgroupError, Hits, RolloutCgroup, sweep, unavailable
from openforge.sandbox.leftovers import KEPT, make_folder, sweep_folders
from openforge.sandbox.modes import (
    SandboxUnavailable,
    bwrap_path,
    none_mode_warning,
    resolve,
)
from openforge.sandbox.protocol import (
    MARKER_ENV,
    ResultRefused,
    check_result,
    looks_like_credential,
    new_result_key,
    output_file,
    parse_result,
    scrub_env,
)
from openforge.sandbox.relay import relay_parent
from openforge.types import RewardResult, RolloutResult, RolloutSpec

__all__ = ["LocalExecutor", "LocalExecutorError", "LocalOptions"]

log = logging.getLogger("openforge.executors.local")


class LocalExecutorError(OpenforgeError):
    """The local executor was configured in a way it cannot honour."""


class LocalOptions(PluginOptions):
    """Options of the `local` executor (`executor_options` in the run config)."""

    sandbox: Literal["auto", "bwrap", "namespaces", "none"] = "auto"
    """How the agent is isolated: bwrap (bubblewrap or refuse), namespaces (unprivileged
    user/mount/PID namespaces or refuse), auto (bwrap, else namespaces, else none), none
    (process groups only: no isolation, see docs/sandboxing.md)."""
    grace_s: float = 2.0
    """Seconds between SIGTERM and SIGKILL."""
    kill_margin_s: float = 15.0
    """Extra seconds past the rollout timeout before the executor kills the rollout itself
    (the rollout enforces the harness timeout and needs a moment to report)."""
    keep_dirs: bool = False
    """Keep each rollout's folder (HOME, workspace) after it ends, for debugging."""
    base_dir: Path | None = None
    """Where rollout folders are made (default: the system temp dir)."""
    python: str = sys.executable
    """The interpreter that runs `python -m openforge.rollout`."""
    pass_env: list[str] = Field(default_factory=list)
    """Extra environment variables rollouts may see (never credentials)."""
    max_processes: int | None = Field(default=1024, ge=1)
    """Processes (threads count) each rollout's agent may have at once, its checks while
    scoring included; a fork past it fails. None: no limit. Needs a cgroup this user can
    make; without one the default is left out and an explicit value is refused."""
    memory_max: ByteSize | None = None
    """Memory (bytes, or e.g. "2GiB") each rollout's agent may use, swap included; past it
    the kernel's OOM killer ends one of its processes. None: no limit. Needs a cgroup."""
    cpu_max: float | None = Field(default=None, ge=0.01)
    """CPU time each rollout's agent may use per second, all its processes together (1.5:
    one and a half cores' worth); past it they wait for the next period (100 ms). None: no
    cap, but a cgroup of its own still makes its processes weigh as one on the CPU, however
    many it starts. Needs a cgroup."""
    tmp_max: ByteSize | None = ByteSize(2 * 2**30)
    """The size of the agent sandbox's private /tmp and of its /dev/shm, each (bytes, or
    e.g. "2GiB"): they are memory (tmpfs), and without a size each may take half of the
    machine's; past it a write fails with "No space left on device". None: the kernel's
    default. Applies to the isolating modes (bwrap, namespaces)."""
    disk_max: ByteSize | None = ByteSize(10 * 2**30)
    """Disk space (bytes, or e.g. "10GiB") each rollout's folder (the agent's HOME and
    workspace) may take; past it the rollout is ended (`openforge.sandbox.disk`). None: no
    limit."""
    files_max: int | None = Field(default=1_000_000, ge=1)
    """Files each rollout's folder may hold; past it the rollout is ended. None: no limit."""
    disk_check_s: float = Field(default=2.0, gt=0)
    """Seconds between two measurements of a rollout's folder (`disk_max`, `files_max`)."""

    @field_validator("pass_env")
    @classmethod
    def _no_credentials(cls, names: list[str]) -> list[str]:
        bad = [n for n in names if looks_like_credential(n)]
        if bad:
            raise ValueError(f"{', '.join(bad)} look like credentials; rollouts never get "
                             "credentials (the harness talks to the gateway only)")
        return names


# Bytes kept of each end of a supervisor's stdout (its result line is its last).
_SUPERVISOR_OUTPUT_KEEP = 16 << 20

# Supervisors started by any local executor of this process: never swept as orphans.
_SUPERVISORS: set[int] = set()


class LocalExecutor(Executor):
    """One supervisor per rollout on this machine; the agent in bubblewrap or namespaces."""

    shares_filesystem = True  # rollouts run here: harness programs are installed once, here
    options_model = LocalOptions
    options: LocalOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        try:
            self.mode = resolve(self.options.sandbox)
        except SandboxUnavailable as exc:
            raise LocalExecutorError(f"executor option {exc}") from None
        self.bwrap = bwrap_path() if self.mode == "bwrap" else None
        become_subreaper()
        if self.mode == "none":
            # A same-user agent must not read the runner's environment (/proc/<pid>/environ).
            make_undumpable()
        self.limits, self.no_limits = self._limits()
        # Its own `cpu` cgroup for every rollout, wherever one can be made: no option turns
        # it off, as nothing is lost by it (a cap is `cpu_max`).
        self.cpu_share = "cpu_max" in self.limits or unavailable(["cpu"]) is None
        self.disk_limits, self.no_disk_limits = self._disk_limits()
        # What killed runners left (their rollouts' folders and cgroups), removed before
        # this one makes its own.
        self.swept = sweep() if self.limits or self.cpu_share else []
        self.swept_folders = sweep_folders(
            [tempfile.gettempdir(), relay_parent(),
             *([self.options.base_dir] if self.options.base_dir else [])])

    def _limits(self) -> tuple[dict[str, float], str | None]:
        """The per-rollout cgroup limits to apply, and why the default ones are not, if so."""
        controllers = {"max_processes": "processes", "memory_max": "memory", "cpu_max": "cpu"}
        return self._applicable(
            {"max_processes": self.options.max_processes, "memory_max": self.options.memory_max,
             "cpu_max": self.options.cpu_max},
            lambda names: unavailable([controllers[name] for name in names],
                                      cpu_max=self.options.cpu_max),
            ". Run as root, or in a cgroup delegated to this user, or set {name} to null to run "
            "without the limit")

    def _disk_limits(self) -> tuple[dict[str, float], str | None]:
        """The limits on each rollout's folder, and why the default ones are not, if so."""
        return self._applicable(
            {"disk_max": self.options.disk_max, "files_max": self.options.files_max},
            lambda names: disk.unavailable(), "; install coreutils, or set {name} to null")

    def _applicable(self, asked: dict[str, float | None],
                    unavailable_why: Callable[[list[str]], str | None],
                    remedy: str) -> tuple[dict[str, float], str | None]:
        """The limits of `asked` that are set, or none and why where this machine cannot
        apply them (`unavailable_why`): a default is then left out, an option set
        explicitly refused with the `remedy` ("{name}": the option)."""
        limits = {name: value for name, value in asked.items() if value is not None}
        why = unavailable_why(list(limits)) if limits else None
        if why is None:
            return limits, None
        explicit = sorted(set(limits) & self.options.model_fields_set)
        if explicit:
            raise LocalExecutorError(f"executor option {explicit[0]}: {why}"
                                     + remedy.format(name=explicit[0]))
        return {}, why

    def describe_sandbox(self) -> str:
        """One line for the run's header saying how rollouts are isolated (and what of
        killed runners' rollouts this executor removed)."""
        mode, swept = self._describe_mode(), self._describe_swept()
        return f"{mode.removesuffix('.')}{swept}." if swept else mode

    def _describe_swept(self) -> str:
        parts = [f"{n} {what}{'' if n == 1 else 's'}" for n, what in
                 ((len(self.swept_folders), "folder"), (len(self.swept), "cgroup")) if n]
        return f"; removed {' and '.join(parts)} that killed runners' rollouts had left" \
            if parts else ""

    def _describe_mode(self) -> str:
        if self.mode == "bwrap":
            return (f"sandbox: bubblewrap ({self.bwrap}): allowlisted read-only view, "
                    f"{self._describe_tmp()}, own PID namespace, no capabilities"
                    + self._limits_suffix())
        if self.mode == "namespaces":
            why = "" if self.options.sandbox == "namespaces" else "; bubblewrap is not available"
            return (f"sandbox: namespaces (user, mount, PID{why}): allowlisted read-only view, "
                    f"{self._describe_tmp()}, own PID namespace, no capabilities"
                    + self._limits_suffix())
        why = "disabled by sandbox=none" if self.options.sandbox == "none" else \
            "neither bubblewrap nor unprivileged user namespaces are available"
        limits = self._all_limits()
        return "sandbox: none. " + none_mode_warning(why) + \
            (f" {limits[0].upper()}{limits[1:]}." if limits else "")

    def _describe_tmp(self) -> str:
        size = self.options.tmp_max
        return "private /tmp" if size is None else \
            f"private /tmp and /dev/shm of {_gib_or_mib(int(size))} each"

    def _limits_suffix(self) -> str:
        limits = self._all_limits()
        return f"; {limits}" if limits else ""

    def _all_limits(self) -> str:
        return "; ".join(part for part in (self._describe_limits(),
                                           self._describe_disk_limits()) if part)

    def _describe_disk_limits(self) -> str:
        """The limits on each rollout's folder, for the header ("" when none was asked for)."""
        if self.no_disk_limits:
            return f"no disk limit per rollout ({self.no_disk_limits})"
        parts = [_gib_or_mib(int(self.disk_limits["disk_max"]))
                 if "disk_max" in self.disk_limits else "",
                 f"{self.disk_limits['files_max']:,} files"
                 if "files_max" in self.disk_limits else ""]
        shown = " and ".join(p for p in parts if p)
        return (f"at most {shown} on disk per rollout (measured every "
                f"{self.options.disk_check_s:g} s)") if shown else ""

    def _describe_limits(self) -> str:
        """The limits per rollout, for the header ("" when none was asked for)."""
        if self.no_limits:
            return f"no process limit per rollout ({self.no_limits})"
        parts = [f"{self.limits['max_processes']:.0f} processes"
                 if "max_processes" in self.limits else "",
                 f"{self.limits['memory_max'] / 2**20:,.0f} MiB of memory"
                 if "memory_max" in self.limits else "",
                 f"{self.limits['cpu_max']:g} CPUs" if "cpu_max" in self.limits else ""]
        words = [p for p in parts if p]
        shown = " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)
        if not shown:
            return "each rollout's processes weigh as one on the CPU (cgroup)" \
                if self.cpu_share else ""
        return f"at most {shown} per rollout (cgroup)" + \
            (", each rollout's processes weighing as one on the CPU" if self.cpu_share else "")

    def _layout(self, spec: RolloutSpec) -> tuple[Path, dict[str, str]]:
        base = self.options.base_dir
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        root = make_folder(spec.rollout_id[:40], base).resolve()
        env = scrub_env(os.environ, self.options.pass_env)
        # The supervisor is trusted: it keeps the user's HOME (plugin caches); the agent
        # gets one of its own.
        env["HOME"] = str(Path.home())
        env[MARKER_ENV] = f"{spec.rollout_id}-{uuid.uuid4().hex[:8]}"
        env["PYTHONUNBUFFERED"] = "1"
        return root, env

    def _argv(self, root: Path, spec_path: Path, cgroup: RolloutCgroup | None) -> list[str]:
        argv = [self.options.python, "-m", "openforge.rollout", "--sandbox", self.mode,
                "--dir", str(root), "--key-on-stdin"]
        for path in self.protected:
            argv += ["--protect", str(path)]
        for name in self.options.pass_env:
            argv += ["--pass-env", name]
        for procs in cgroup.procs_files if cgroup else []:
            argv += ["--cgroup", procs]
        if self.options.tmp_max is not None and self.mode != "none":
            argv += ["--tmp-max", str(int(self.options.tmp_max))]
        return argv + [str(spec_path)]

    def _cgroup(self, spec: RolloutSpec) -> RolloutCgroup | None:
        """The rollout's cgroup with its limits, or None when there are none."""
        if not self.limits and not self.cpu_share:
            return None
        limits = self.limits
        return RolloutCgroup.create(
            spec.rollout_id,
            max_processes=int(limits["max_processes"]) if "max_processes" in limits else None,
            memory_max=int(limits["memory_max"]) if "memory_max" in limits else None,
            cpu_max=limits.get("cpu_max"), cpu_share=self.cpu_share)

    async def run(self, spec: RolloutSpec) -> RolloutResult:
        started = time.monotonic()
        started_at = time.time()
        root, env = self._layout(spec)
        spec_path = root / "spec.json"
        spec_path.write_text(spec.model_dump_json())
        stdout_path, stderr_path = root / "supervisor.stdout", root / "supervisor.stderr"
        key = new_result_key()
        proc: subprocess.Popen[bytes] | None = None
        timed_out = False
        try:
            cgroup = self._cgroup(spec)
        except CgroupError as exc:
            shutil.rmtree(root, ignore_errors=True)
            return RolloutResult(rollout_id=spec.rollout_id, task_id=spec.task.id,
                                 attempt=spec.attempt, session_id=spec.session_id,
                                 status="infra_error", error=str(exc), sandbox=self.mode)
        left_in_cgroup: str | None = None
        past_disk: str | None = None  # what the folder's watch found, when it ended the rollout
        hits = Hits()
        try:
            # Appended to: a line the agent writes through /proc/<supervisor>/fd/1 (possible
            # without isolation) stays before the supervisor's own, so `_collect` sees it.
            with output_file(stdout_path) as out, output_file(stderr_path) as err:
                # Popen, not asyncio's subprocess: the pid is registered as a supervisor with
                # no await between fork and registration, so a sweep never mistakes it for
                # an orphan. Files, not pipes: a grandchild holding a pipe cannot stall us.
                proc = subprocess.Popen(
                    self._argv(root, spec_path, cgroup), stdin=subprocess.PIPE, stdout=out,
                    stderr=err,
                    cwd=str(root), env=env, start_new_session=True, preexec_fn=die_with_parent())
            _SUPERVISORS.add(proc.pid)
            assert proc.stdin is not None
            try:
                proc.stdin.write(key.hex().encode() + b"\n")
                proc.stdin.close()
            except OSError:
                pass  # it died at once; its exit code says so
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that lands just as the wait completes, and then Ctrl-C would not stop the run.
            try:
                async with asyncio.timeout(spec.timeout_s + self.options.kill_margin_s):
                    past_disk = await _exited_or_past(proc, self._watch(root))
            except TimeoutError:
                timed_out = True
        finally:
            # Runs on normal exit, timeout and cancellation alike: nothing survives us.
            if proc is not None:
                # Not reaped until now (`exited` leaves it a zombie): the kill by its pid
                # and group cannot reach a process that took them over.
                await asyncio.shield(asyncio.to_thread(
                    end_and_reap, proc, env[MARKER_ENV], self.options.grace_s))
                _SUPERVISORS.discard(proc.pid)
                if proc.returncode != 0:
                    # It died (killed, maybe by the agent when there is no isolation): its
                    # orphans came to us. Found here, in the event loop, between spawns.
                    orphans = adopted_since(started_at)
                    if orphans:
                        await asyncio.shield(asyncio.to_thread(end_all, orphans, self.options.grace_s))
            if cgroup is not None:  # the agent's last processes, wherever they hid, go with it
                try:
                    hits, _ = await asyncio.shield(asyncio.to_thread(cgroup.close))
                except CgroupError as exc:
                    left_in_cgroup = str(exc)
        if past_disk is not None:
            result = await self._ended_for_disk(spec, past_disk, time.monotonic() - started)
        else:
            result = self._collect(spec, stdout_path, stderr_path, key,
                                   proc.returncode if proc else None, timed_out,
                                   time.monotonic() - started)
        if left_in_cgroup:
            result = result.model_copy(update={
                "status": "infra_error", "reward": None,
                "error": f"could not end the agent's processes: {left_in_cgroup}"})
        elif cgroup is not None:
            # Reaching a limit is the agent's own doing, scored as it ended; the count says so.
            result.limits_reached = hits.as_dict()
        if past_disk is not None:
            result.limits_reached["disk"] = 1
        if self.options.keep_dirs:
            (root / KEPT).touch()  # not a leftover: no later executor's sweep removes it
        else:
            shutil.rmtree(root, ignore_errors=True)
        return result

    def _watch(self, root: Path) -> Coroutine[Any, Any, str] | None:
        """The watch of the rollout's folder (None without disk limits)."""
        if not self.disk_limits:
            return None
        limits = self.disk_limits
        return disk.watch(root, int(limits["disk_max"]) if "disk_max" in limits else None,
                          int(limits["files_max"]) if "files_max" in limits else None,
                          self.options.disk_check_s)

    async def _ended_for_disk(self, spec: RolloutSpec, found: str,
                              duration: float) -> RolloutResult:
        """The result of a rollout ended because its folder went past a disk limit.

        Judged as on Kubernetes, where the kubelet evicts a Pod whose volume goes past its
        size limit (`openforge.rollout.agents_own_crash` on the recorded calls): once the
        model has answered, it is the agent's doing, and since it was ended before
        anything was scored, `harness_error` with reward 0, labelled `unscored` (retried,
        a policy would drop its 0s this way); before, `infra_error`, retried.
        """
        base = self._result_base(spec, duration)
        ended = f"rollout ended: {found} (executor options disk_max, files_max)"
        own = await asyncio.to_thread(agents_own_crash, spec)
        if own is None:
            return RolloutResult(**base, status="infra_error", error=f"{ended}; no result")
        unscored = "ended for what its agent wrote to disk: its final state was not scored"
        return RolloutResult(**base, status="harness_error",
                             error=f"{ended}; {own}; {unscored}, reward 0",
                             reward=RewardResult(score=0.0, passed=False,
                                                 details={"unscored": unscored}))

    def _result_base(self, spec: RolloutSpec, duration: float) -> dict[str, Any]:
        """The fields every result of this attempt has, whatever its status."""
        return {"rollout_id": spec.rollout_id, "task_id": spec.task.id,
                "attempt": spec.attempt, "session_id": spec.session_id,
                "duration_s": duration, "sandbox": self.mode}

    def _collect(self, spec: RolloutSpec, stdout_path: Path, stderr_path: Path, key: bytes,
                 returncode: int | None, timed_out: bool, duration: float) -> RolloutResult:
        base = self._result_base(spec, duration)
        if timed_out:
            return RolloutResult(**base, status="timeout",
                                 error=f"rollout killed after the hard timeout of {spec.timeout_s:g}s")
        # Without isolation the agent can write into the supervisor's stdout (/proc): read
        # bounded; the supervisor's own line, the last, is in the tail.
        stdout, _ = bounded.head_and_tail(stdout_path, _SUPERVISOR_OUTPUT_KEEP)
        why = ""
        if returncode == 0:
            try:
                result = check_result(parse_result(stdout, key), spec)
            except ResultRefused as exc:
                why = str(exc)
            else:
                # The supervisor's line is the last; a result line before it is someone
                # else's: the agent's attempt to forge one.
                forged = forgery.result_lines(stdout)[:-1]
                return forgery.mark(result, "the supervisor's stdout", forged) if forged \
                    else result
        elif returncode is not None and returncode < 0:
            why = f"killed by signal {signal.Signals(-returncode).name}"
        else:
            why = f"exit code {returncode}"
        tail = bounded.tail(stderr_path, 64 << 10).strip()[-1500:]
        return RolloutResult(**base, status="infra_error",
                             error=f"rollout supervisor died: {why}" + (f": {tail}" if tail else ""))


def _gib_or_mib(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


async def _exited_or_past(proc: subprocess.Popen[bytes],
                          watch: Coroutine[Any, Any, str] | None) -> str | None:
    """Until `proc` has exited (None), or `watch` returned first (what it found). A watch
    that fails (`du` cannot be started: the machine is out of processes) is the
    infrastructure's: the rollout goes on unwatched, with a warning, and is not ended."""
    if watch is None:
        await exited(proc)
        return None
    ended, watching = asyncio.ensure_future(exited(proc)), asyncio.ensure_future(watch)
    try:
        await asyncio.wait({ended, watching}, return_when=asyncio.FIRST_COMPLETED)
        if not ended.done() and watching.exception() is not None:
            log.warning("the watch of a rollout's folder failed (%s); the rollout goes on "
                        "without it", watching.exception())
            await ended
    finally:
        for task in (ended, watching):
            task.cancel()
        # Cancelled tasks end before we go on: no measurement runs past its rollout.
        await asyncio.gather(ended, watching, return_exceptions=True)
    if watching.done() and not watching.cancelled() and watching.exception() is None:
        return watching.result()
    return None


def adopted_since(since: float) -> list[psutil.Process]:
    """Children this process adopted since `since` (a dead supervisor's orphans), other than
    supervisors and the children it started for itself (`started_here`: a `du` of the disk
    watch, a plugin's command); children that already died are reaped on the way."""
    found = []
    for child in psutil.Process().children():
        try:
            if child.pid in _SUPERVISORS or started_here(child.pid):
                continue
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
            elif child.create_time() >= since - 1:
                found.append(child)
        except (psutil.Error, OSError):
            continue
    return found


def end_all(procs: list[psutil.Process], grace_s: float) -> None:
    """End each process with everything below it, and reap it."""
    for proc in procs:
        kill_tree(proc.pid, None, None, grace_s=grace_s)
    reap_adopted(procs)
