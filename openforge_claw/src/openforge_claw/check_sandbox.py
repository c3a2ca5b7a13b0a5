"""The bubblewrap sandbox a benchmark's checks run in when they may run what the agent wrote.

Claw-Eval's `env_snapshot_commands` run the agent's files (its scripts, the database it
repaired) and QwenClawBench's `grade()` may import or execute them. Both run after the
agent has ended, on the trusted side, so they get a sandbox of their own with no more reach
than the agent had (docs/sandboxing.md): openforge's allowlisted view
(`openforge.sandbox.view.build_view`: system folders and this Python read-only, never the
real HOME), the workspace writable, a private /tmp, no network, every capability dropped
(bubblewrap run by root keeps them otherwise, and with CAP_SYS_ADMIN a check could remount
a read-only folder read-write).
"""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from openforge.sandbox.modes import bwrap_path
from openforge.sandbox.view import build_view

ISOLATE = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]


@functools.cache
def usable_bwrap(with_proc: bool = True) -> str | None:
    """bubblewrap, when it is installed and can build this sandbox here (inside another
    bubblewrap sandbox it cannot mount a /proc of its own: `with_proc=False`)."""
    bwrap = bwrap_path()
    if not bwrap:
        return None
    with tempfile.TemporaryDirectory(prefix="openforge-check-probe-") as folder:
        try:
            probe = subprocess.run([bwrap, *prefix(Path(folder), with_proc=with_proc), "true"],
                                   capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
    return bwrap if probe.returncode == 0 else None


def prefix(workspace: Path, *, mount_at: str | None = None,
           writable: Sequence[Path] = (), python: str = sys.executable,
           with_proc: bool = True) -> list[str]:
    """The bubblewrap options (after the program's name) for one check: the allowlisted
    view, `writable` folders read-write at their own paths, `workspace` read-write at
    `mount_at` (default: its own path) and the working folder. The caller appends its own
    options (`--clearenv`, `--setenv`) and then the command."""
    workspace = workspace.resolve()
    view = build_view(workspace, workspace=workspace, programs=[Path(python).parent],
                      protected=[Path.home()])
    argv = [*ISOLATE, "--dev", "/dev"]
    if with_proc:
        argv += ["--proc", "/proc"]
    for path in view.tmpfs:
        argv += ["--tmpfs", path]
    workspace_src = str(workspace)
    for bind in view.binds:
        if bind.rw:  # the view's agent folder: here the workspace, mounted below
            continue
        argv += ["--ro-bind", bind.src, bind.dst]
    for target, path in view.symlinks:
        argv += ["--symlink", target, path]
    for path in view.masks:
        argv += ["--ro-bind", "/dev/null", path]
    for folder in writable:
        argv += ["--bind", str(folder), str(folder)]
    at = mount_at or workspace_src
    argv += ["--bind", workspace_src, at, "--chdir", at]
    return argv
