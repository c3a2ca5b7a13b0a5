"""The agent's view of the file system in an isolating mode: an allowlist, nothing else.

The view is built from scratch (an empty root), never from `/` with holes punched in it:

- system directories read-only (`/usr`, `/bin`, `/sbin`, `/lib*`, `/etc`; the ones that are
  symlinks into /usr stay symlinks), with a few root-only secrets in /etc masked;
- the Python installation(s) the agent program runs on and the `sys.path` entries it
  imports from, read-only (a Python under the real HOME, like pyenv's, is mapped alone);
- the harness's program paths (`Harness.program_paths`) and the task's data
  (`Environment.data_paths`), read-only;
- the rollout's `agent/` directory (workspace, the agent's HOME, its tmp), read-write;
- the environment's hidden folders (`Environment.hidden_paths`: answer keys shipped inside
  its installed package, which the Python paths would map) overmounted with an empty
  read-only tmpfs;
- a private `/tmp`, `/dev/shm`, a minimal `/dev` and the `/proc` of its own PID namespace.

Never mapped: any path that would expose a protected one (the real HOME, the folder holding
the rollouts, the run directory with its store): a candidate that is one of them or holds
one is dropped, and the supervisor says so on its stderr.

`View` is plain JSON so that `nsinit` reads it without importing anything heavy.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
# Readable by root only on the host; a sandbox running as root would read them otherwise.
MASKED = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers",
          "/etc/ssh/ssh_host_rsa_key", "/etc/ssh/ssh_host_ecdsa_key",
          "/etc/ssh/ssh_host_ed25519_key")


@dataclass
class Bind:
    src: str
    dst: str
    rw: bool = False


@dataclass
class View:
    """What an isolating mode mounts, in order (parents before children)."""

    binds: list[Bind] = field(default_factory=list)
    symlinks: list[tuple[str, str]] = field(default_factory=list)  # (target, path)
    masks: list[str] = field(default_factory=list)  # files overmounted with /dev/null
    # Folders inside a mapped one, overmounted with an empty read-only tmpfs after the binds.
    hidden: list[str] = field(default_factory=list)
    tmpfs: list[str] = field(default_factory=lambda: ["/tmp", "/dev/shm"])
    # The size of each of those, in bytes: they are memory, and the kernel's default is half
    # of the machine's each. None: that default.
    tmpfs_size: int | None = None
    cwd: str = "/"
    dropped: list[str] = field(default_factory=list)  # candidates refused (for the log)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> View:
        return cls(binds=[Bind(**b) for b in data["binds"]],
                   symlinks=[(t, p) for t, p in data["symlinks"]], masks=list(data["masks"]),
                   hidden=list(data["hidden"]), tmpfs=list(data["tmpfs"]),
                   tmpfs_size=data.get("tmpfs_size"), cwd=data["cwd"],
                   dropped=list(data["dropped"]))

    def sources(self) -> list[str]:
        return [b.src for b in self.binds]


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def python_paths() -> list[str]:
    """What this interpreter needs to run `python -m <agent program>`: its prefixes and the
    `sys.path` entries that exist (not the supervisor's own working directory)."""
    found: list[str] = []
    cwd = os.getcwd()
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  os.path.dirname(os.path.realpath(sys.executable)),
                  *os.environ.get("PYTHONPATH", "").split(os.pathsep), *sys.path]
    for entry in candidates:
        if not entry or not os.path.isabs(entry):
            continue
        path = os.path.realpath(entry)
        if path == cwd or not os.path.exists(path):
            continue
        found.append(path)
    return found


def unmapped(view: View, paths: Iterable[str]) -> list[str]:
    """The paths whose folder no bind of `view` covers (the folder resolved, the name not:
    a link in an unmapped folder is unreachable even when its target is mapped)."""
    def folder(path: str) -> str:
        return os.path.realpath(os.path.dirname(os.path.abspath(path)))

    return [p for p in paths if not any(_inside(folder(p), b.src) for b in view.binds)]


def build_view(agent_dir: Path, *, workspace: Path, programs: Iterable[Path | str] = (),
               data: Iterable[Path | str] = (), protected: Iterable[Path | str] = (),
               hidden: Iterable[Path | str] = (), tmpfs_size: int | None = None) -> View:
    """The allowlisted view for one rollout (see the module docstring); `tmpfs_size`: the
    size of its private /tmp and /dev/shm, each (None: the kernel's default)."""
    view = View(cwd=str(workspace), tmpfs_size=tmpfs_size)
    guarded = [os.path.realpath(p) for p in protected]
    agent = os.path.realpath(agent_dir)

    def exposes(path: str) -> str | None:
        for secret in guarded:
            if _inside(secret, path):
                return secret
        return None

    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            view.symlinks.append((os.readlink(path), path))
        elif os.path.isdir(path):
            view.binds.append(Bind(path, path))
    system = [b.src for b in view.binds]
    wanted: list[str] = []
    for raw in [*python_paths(), *map(str, programs), *map(str, data)]:
        path = os.path.realpath(raw)
        if not os.path.exists(path) or any(_inside(path, s) for s in system):
            continue
        if _inside(path, agent):
            continue  # already there, read-write
        secret = exposes(path)
        if secret is not None:
            view.dropped.append(f"{path} (it holds {secret})")
            continue
        wanted.append(path)
    # Shortest first, and nothing under a path already mapped.
    for path in sorted(set(wanted), key=lambda p: (p.count("/"), p)):
        if not any(_inside(path, b.src) for b in view.binds):
            view.binds.append(Bind(path, path))
    view.binds.append(Bind(agent, agent, rw=True))
    # In a Pod the workspace is a volume of its own, not a folder of the agent's: the checks
    # that run the agent's code there (sandbox.verifier) need it in their view too.
    ws = os.path.realpath(workspace)
    if not _inside(ws, agent) and exposes(ws) is None:
        view.binds.append(Bind(ws, ws, rw=True))
    view.masks = [m for m in MASKED if os.path.exists(m)]
    # Only what a read-only bind would show needs hiding (a data path inside a hidden
    # folder stays hidden with it: the environment copies what the agent needs into the
    # workspace).
    hidden_real = {os.path.realpath(h) for h in hidden}
    view.hidden = sorted(h for h in hidden_real if os.path.isdir(h) and not _inside(h, agent)
                         and any(_inside(h, b.src) for b in view.binds if not b.rw))
    return view
