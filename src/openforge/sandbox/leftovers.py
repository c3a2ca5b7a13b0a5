"""What a killed runner leaves on the host, named so that the next runner can remove it.

Each rollout on the local executor has a folder (its `root`: spec, outputs, the agent's
home and workspace) and, when isolated, its supervisor's relay folder (`sandbox.relay`),
and may have cgroups (`sandbox.cgroups`); all are removed when the rollout ends. A runner
killed with SIGKILL (the OOM killer, a preempted node, `kill -9`) removes nothing, and its
supervisors die with it. So each of these is named `openforge-<maker>-<label>-<random>`,
where <maker> (`maker_tag`) is <PID namespace inode>.<pid>.<start time> of the process
that made it, and the next local executor made on the machine removes those whose maker is
gone (`sweep_folders` here, `cgroups.sweep`); the start time tells a process that is gone
from a new one with its pid. Things made in another PID namespace (a container sharing
the folder), whose pids cannot be checked from here, are left alone.

A rollout folder kept on purpose (`keep_dirs`) holds a `KEPT` file, and is never swept.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

# openforge-<PID namespace inode>.<pid>.<start time>-...
_NAME = re.compile(r"openforge-(\d+)\.(\d+)\.(\d+)-")

KEPT = "KEPT"  # in a rollout folder the executor kept (keep_dirs): not a leftover


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, tag) of a process seen from this PID namespace, None when there is none with
    that pid."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    # Fields 3 and 22, counted after the command name, which may itself hold spaces and
    # parentheses.
    fields = stat_line.rpartition(")")[2].split()
    return fields[0], f"{namespace}.{pid}.{fields[19]}"


def maker_tag(pid: int) -> str:
    """<PID namespace inode>.<pid>.<start time> of a process seen from this PID namespace
    ("" when there is none with that pid)."""
    found = _stat(pid)
    return found[1] if found else ""


@functools.cache
def own_tag(pid: int) -> str:
    """This process's `maker_tag`, read once (keyed by pid: a forked child is another)."""
    return maker_tag(pid)


def left_behind(name: str) -> bool:
    """Whether `name` is a thing made (see the module docstring) by a process of this PID
    namespace that is gone."""
    made_by = _NAME.match(name)
    if made_by is None or made_by[1] != own_tag(os.getpid()).split(".")[0]:
        return False
    found = _stat(int(made_by[2]))
    # A zombie has ended: it only waits for its parent to read its exit status.
    return found is None or found[0] in "ZX" or found[1] != ".".join(made_by.groups())


def name_prefix(label: str) -> str:
    """`openforge-<this process's tag>-<label>-`: what a thing this process makes is named
    (a random part follows), so that a sweep can tell when its maker is gone."""
    return f"openforge-{own_tag(os.getpid())}-{label}-"


def make_folder(label: str, parent: str | os.PathLike[str] | None = None) -> Path:
    """A new private folder `name_prefix(label)` + random in `parent` (default: the
    temporary folder), which a later sweep removes if this process is killed before it
    does."""
    return Path(tempfile.mkdtemp(prefix=name_prefix(label), dir=parent))


def sweep_folders(parents: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Remove the folders in `parents` that processes which are gone made with
    `make_folder` (those holding `KEPT` aside); the ones removed."""
    removed = []
    uid = os.getuid()
    for parent in {Path(p) for p in parents}:
        try:
            entries = list(parent.iterdir())
        except OSError:
            continue
        for path in entries:
            if not left_behind(path.name):
                continue
            try:
                info = path.lstat()
            except OSError:
                continue
            # Only a real folder of this user: never a link (to somewhere else), never
            # another user's.
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or (path / KEPT).exists():
                continue
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.lexists(path):
                removed.append(path)
    return removed
