"""A cgroup of each rollout's own: how many processes its agent may have, how much memory,
and its share of the CPU.

A sandbox's namespaces hide the host, but do not bound what the agent uses of it: a command
that forks without end takes the host's PIDs (`kernel.pid_max` is the whole machine's), and
with them the runner's, the gateway's and every other rollout's forks. `RLIMIT_NPROC` cannot
bound one sandbox (the kernel counts it per user across user namespaces, and not for root);
a cgroup can. The local executor makes one per rollout (`RolloutCgroup.create`), in each
hierarchy that has the controller it needs (`pids` for `max_processes`, `memory` for
`memory_max`, `cpu` for `cpu_max` and the rollout's share of the CPU), under the runner's
own cgroup; the supervisor starts the agent (and every check that runs the agent's code
while scoring) inside it (`joiner`: the child joins before it runs the command, so nothing
it starts is outside); once the rollout has ended the executor ends whatever is still in
it and removes it (`close`), and says when a limit was reached (`Hits`). A runner killed
with SIGKILL cannot remove its rollouts' cgroups; the next executor made on the machine
does (`sweep`): each cgroup's name says which runner made it (`sandbox.leftovers`).

The CPU is the host's too: the kernel's scheduler weighs each process alike, so an agent
that starts a hundred busy processes takes a hundred shares from the gateway, the runner
and the other rollouts, whose checks may then run out of time, which is scored against
them. In a `cpu` cgroup of its own, all of a rollout's processes weigh as one
(`cpu_share`), and `cpu_max` caps what they use together.

cgroup v1 (a hierarchy per controller) and v2 (one hierarchy, where the runner's cgroup has
the controllers enabled for its children, as a delegated systemd scope has) are both used.
Where neither lets the runner make a cgroup (not root, nothing delegated), `unavailable`
says why, and the executor runs without the limits (its header says so) unless they were
asked for explicitly.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from openforge.errors import OpenforgeError
from openforge.executors.process import processes, reap_adopted, signal_members
from openforge.sandbox.leftovers import left_behind, name_prefix

# Each controller's limit file in v1 and v2.
_LIMIT_FILE = {("pids", 1): "pids.max", ("pids", 2): "pids.max",
               ("memory", 1): "memory.limit_in_bytes", ("memory", 2): "memory.max",
               ("cpu", 1): "cpu.cfs_quota_us", ("cpu", 2): "cpu.max"}
# Swap would let a process past its memory limit: counted with it (v1), or none at all (v2).
_SWAP_FILE = {1: "memory.memsw.limit_in_bytes", 2: "memory.swap.max"}

# The CFS period the CPU quota is a share of (the kernel's default), in microseconds.
CPU_PERIOD_US = 100_000
_KILL_ROUNDS = 200  # of SIGKILL to every member, 10 ms apart: a fork loop is outpaced at once
_REMOVE_TRIES = 100  # rmdir waits for the kernel to finish taking the killed processes out


class CgroupError(OpenforgeError):
    """A rollout's cgroup could not be made, joined or removed; the message says why."""


@dataclass(frozen=True)
class Hierarchy:
    """Where a controller is mounted, and this process's cgroup in it (`own`)."""

    controller: str
    version: int  # 1 or 2
    own: Path


def _mounts() -> list[tuple[str, Path, str, set[str]]]:
    """(root inside the hierarchy, mount point, fstype, super options) of each cgroup mount."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            found.append((fields[3], Path(fields[4]), rest[0], set(rest[2].split(","))))
    return found


def hierarchies() -> dict[str, Hierarchy]:
    """Each controller this process's cgroups can use, by name (v1 first, as the kernel
    gives a controller to one version only)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return {}
    mounts = _mounts()
    found: dict[str, Hierarchy] = {}
    for line in lines:
        number, controllers, path = line.split(":", 2)
        for root, point, fstype, options in mounts:
            if number == "0" and fstype == "cgroup2":
                own = point / os.path.relpath(path, root)
                enabled = (own / "cgroup.subtree_control")
                names = enabled.read_text().split() if enabled.exists() else []
                for name in names:
                    found.setdefault(name, Hierarchy(name, 2, own))
            elif fstype == "cgroup" and controllers:
                for name in controllers.split(","):
                    if name in options:
                        found[name] = Hierarchy(name, 1, point / os.path.relpath(path, root))
    return found


def unavailable(limits: Iterable[str], cpu_max: float | None = None) -> str | None:
    """Why a rollout cgroup with these limits ("processes", "memory", "cpu": a `cpu` cgroup,
    with the quota `cpu_max` when given) cannot be made here, or None when it can (one is
    made, limited and removed to find out: a quota past the runner's own cgroup's is
    refused by the kernel)."""
    asked = set(limits)
    try:
        RolloutCgroup.create("probe",
                             max_processes=1 << 20 if "processes" in asked else None,
                             memory_max=1 << 40 if "memory" in asked else None,
                             cpu_max=cpu_max if "cpu" in asked else None,
                             cpu_share="cpu" in asked).close()
    except CgroupError as exc:
        return str(exc)
    return None


@dataclass
class Hits:
    """How often a rollout's limits were reached: forks refused, processes the OOM killer
    took, CPU periods in which its processes were held back at their quota."""

    processes: int = 0
    memory: int = 0
    cpu: int = 0

    def as_dict(self) -> dict[str, int]:
        return {name: n for name, n in (("processes", self.processes),
                                        ("memory", self.memory), ("cpu", self.cpu)) if n}


@dataclass
class RolloutCgroup:
    """One rollout's cgroups, one per limited controller."""

    dirs: dict[str, tuple[Path, int]] = field(default_factory=dict)  # controller -> (dir, v)

    @classmethod
    def create(cls, label: str, max_processes: int | None = None,
               memory_max: int | None = None, cpu_max: float | None = None,
               cpu_share: bool = False) -> RolloutCgroup:
        """Make the cgroups (named for this runner and `label`) and set their limits; raise
        `CgroupError`.

        `cpu_max` is CPU time per second of wall time (1.5: one and a half cores' worth).
        `cpu_share` makes the `cpu` cgroup even without it: the kernel's scheduler then
        weighs all of the rollout's processes together as one of its neighbours (one
        process of the runner, one other rollout), however many the agent starts.
        """
        name = name_prefix(label[:40]) + uuid.uuid4().hex[:8]
        found = hierarchies()
        made = cls()
        try:
            for controller, value in (("pids", max_processes), ("memory", memory_max),
                                      ("cpu", cpu_max)):
                if value is None and not (controller == "cpu" and cpu_share):
                    continue
                if controller not in found:
                    raise CgroupError(
                        f"no cgroup hierarchy of this process has the {controller} controller "
                        "(cgroup v1 with it mounted, or v2 with it enabled for this process's "
                        "cgroup's children, as a delegated systemd scope has)")
                where = found[controller]
                path = where.own / name
                if (path, where.version) not in made.dirs.values():  # v2: one for both
                    path.mkdir()
                made.dirs[controller] = (path, where.version)
                if value is not None:
                    (path / _LIMIT_FILE[controller, where.version]).write_text(
                        _limit_text(controller, value, where.version))
                swap = path / _SWAP_FILE[where.version]
                if controller == "memory" and swap.exists():
                    swap.write_text(str(value) if where.version == 1 else "0")
        except OSError as exc:
            made.close()
            raise CgroupError(f"cannot make the rollout's cgroup {name}: "
                              f"{exc.strerror or exc} ({exc.filename})") from None
        except CgroupError:
            made.close()
            raise
        return made

    @property
    def procs_files(self) -> list[str]:
        """The `cgroup.procs` files a process writes itself into to join."""
        return [str(path / "cgroup.procs") for path, _ in self.dirs.values()]

    def members(self) -> set[int]:
        """The processes in the rollout's cgroups now."""
        pids: set[int] = set()
        for path, _ in self.dirs.values():
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        return pids

    def hits(self) -> Hits:
        """How often the limits were reached so far."""
        hits = Hits()
        for controller, (path, version) in self.dirs.items():
            if controller == "pids":
                hits.processes = _counts(path / "pids.events").get("max", 0)
            elif controller == "memory":
                events = "memory.oom_control" if version == 1 else "memory.events"
                hits.memory = _counts(path / events).get("oom_kill", 0)
            else:
                hits.cpu = _counts(path / "cpu.stat").get("nr_throttled", 0)
        return hits

    def close(self) -> tuple[Hits, int]:
        """End every process still in the cgroups, then remove them: (the hits, how many
        processes were ended). Raise `CgroupError` when one cannot be removed."""
        hits = self.hits() if self.dirs else Hits()
        ended: set[int] = set()
        for _ in range(_KILL_ROUNDS):
            members = self.members()
            if not members:
                break
            ended |= members
            found = processes(members)
            signal_members(members, self.members, signal.SIGKILL)
            time.sleep(0.01)
            reap_adopted(found)  # those that came to this process (a subreaper)
        stuck = []
        for controller, (path, _) in list(self.dirs.items()):
            for _ in range(_REMOVE_TRIES):
                try:
                    path.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    if exc.errno == errno.EBUSY:  # its last processes are still exiting
                        time.sleep(0.01)
                        continue
                    stuck.append(f"{path}: {exc.strerror}")
                    break
                del self.dirs[controller]
                break
            else:
                stuck.append(f"{path}: still has processes {sorted(self.members())}")
        if stuck:
            raise CgroupError("cannot remove the rollout's cgroup: " + "; ".join(stuck))
        return hits, len(ended)


def sweep() -> list[str]:
    """Remove the rollout cgroups that runners which are gone left behind (killed with
    SIGKILL, they could not), ending whatever still runs in them; the names of those removed.
    Cgroups of live runners, and of runners in another PID namespace, are left alone."""
    removed = []
    for where in {(h.own, h.version): h for h in hierarchies().values()}.values():
        try:
            children = [p for p in where.own.iterdir() if p.is_dir()]
        except OSError:
            continue
        for path in children:
            if not left_behind(path.name):
                continue  # not a rollout cgroup, or its runner lives, or is out of sight
            with contextlib.suppress(CgroupError):  # one it cannot empty waits for the next
                RolloutCgroup(dirs={where.controller: (path, where.version)}).close()
                removed.append(path.name)
    return removed


def _limit_text(controller: str, value: float, version: int) -> str:
    """What a controller's limit file takes for `value`."""
    if controller != "cpu":
        return str(int(value))
    quota = max(1000, round(value * CPU_PERIOD_US))  # the kernel refuses less than 1 ms
    # v1 keeps the period in cpu.cfs_period_us (the default); v2 takes both in cpu.max.
    return str(quota) if version == 1 else f"{quota} {CPU_PERIOD_US}"


def _counts(path: Path) -> dict[str, int]:
    """A cgroup's `key value` lines as numbers ({} when it has no such file)."""
    counts: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                counts[key] = int(value)
    return counts


def joiner(procs_files: Sequence[str], then: Callable[[], None] | None = None
           ) -> Callable[[], None]:
    """A `preexec_fn` that moves the new process into the rollout's cgroups (before it runs
    its command, so all it starts is inside them), then calls `then`. A cgroup it cannot
    join makes the start fail (the caller sees the error) rather than run without limit."""
    targets = [f.encode() for f in procs_files]

    def join() -> None:
        for target in targets:
            fd = os.open(target, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        if then is not None:
            then()

    return join

