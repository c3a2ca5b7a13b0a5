"""The bubblewrap sandbox a benchmark's checks run in when they may run what the agent wrote.

Claw-Eval's `env_snapshot_commands` run the agent's files (its scripts, the database it
repaired) and QwenClawBench's `grade()` may import or execute them. Both run after the
agent has ended, on the trusted side, so they get a sandbox of their own with no more reach
than the agent had (docs/sandboxing.md): openforge's allowlisted view
(`openforge.sandbox.view.build_view`: system folders and this Python read-only, never the
real HOME) as the harness's bubblewrap mounts it (`openforge.sandbox.bwrap.view_options`),
the workspace writable (at /workspace for Claw-Eval), a private /tmp, no network, every capability dropped
(bubblewrap run by root keeps them otherwise, and with CAP_SYS_ADMIN a check could remount
a read-only folder read-write).
"""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from openforge.sandbox.bwrap import ISOLATE, view_options
from openforge.sandbox.modes import bwrap_path
from openforge.sandbox.view import Bind, build_view


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
    view with `workspace` as its agent folder, mounted read-write at `mount_at` (default:
    its own path) and the working folder, and `writable` folders read-write at their own
    paths; the network unshared (`openforge.sandbox.bwrap.ISOLATE`). The caller appends its
    own options (`--clearenv`, `--setenv`) and then the command."""
    workspace = workspace.resolve()
    at = mount_at or str(workspace)
    view = build_view(workspace, workspace=workspace, programs=[Path(python).parent],
                      protected=[Path.home()])
    binds = [b for b in view.binds if not b.rw]  # the view's agent folder moves to `at`
    binds += [Bind(str(f), str(f), rw=True) for f in writable]
    binds.append(Bind(str(workspace), at, rw=True))
    return [*ISOLATE, *view_options(dataclasses.replace(view, binds=binds, cwd=at),
                                    proc=with_proc)]
