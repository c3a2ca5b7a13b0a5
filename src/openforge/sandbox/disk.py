"""How much of the disk a local rollout's folder takes, and the watch that ends it past its limit.

The agent writes its HOME and workspace into its rollout's folder, on the runner's disk. A
sandbox hides the host but does not bound that: an agent that writes without end fills the
disk the gateway records every call on, and every other rollout's, and the attempts that
fail for it are the infrastructure's (`infra_error`, retried), so a policy could make its 0s
disappear. Nothing in an unprivileged user's reach bounds one folder's size (project quotas
and loop-mounted filesystems need root; a tmpfs is memory and dies with the sandbox, before
scoring reads the workspace), so the local executor does what the kubelet does for a Pod's
`emptyDir.sizeLimit`: it measures the folder every few seconds (`du`, a C walk, outside the
runner's GIL) and ends the rollout once it is past its limit (`watch`).

Two limits, as a filesystem has two things to run out of: bytes on disk (`du -s -B1`, what
the files really take: a sparse file's holes cost nothing) and files (`du -s --inodes`, each
name once: an agent that makes millions of empty files runs the disk out of inodes without
using its bytes). Between two measurements the agent can write what the disk takes in that
time past the limit; a measurement waits at least ten times as long as the last one took, so
a folder made slow to walk cannot take the runner's CPU.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from openforge.executors.process import exited

# A measurement waits at least this many times as long as the last one took.
_SPACING = 10
# Measurements in a row that fail before the watch gives up on the folder (and ends it).
UNMEASURED_TIMES = 3
# What du says of a file that was there when it listed its folder and gone when it looked.
_VANISHED = ": No such file or directory"
# What is read of du's output (one number and the folder's name) and of each of its lines.
_OUT_KEEP = 1 << 16
_LINE_KEEP = 1 << 12


@dataclass(frozen=True)
class Usage:
    """What a folder takes: bytes on disk and files (names: directories and links count)."""

    bytes: int
    files: int


class Unmeasurable(Exception):
    """`du` could not measure the folder (a part of it cannot be read); the message says how."""


def unavailable() -> str | None:
    """Why folders cannot be measured here (no `du` on PATH), or None."""
    return None if shutil.which("du") else "no du (coreutils) on PATH"


async def usage(folder: Path) -> Usage:
    """Bytes on disk and files under `folder` (links not followed, one filesystem); raises
    `Unmeasurable` when `du` cannot read all of it."""
    size = await _du(folder, "-B1")
    files = await _du(folder, "--inodes")
    return Usage(size, files)


async def _du(folder: Path, unit: str) -> int:
    # A Popen watched through a pidfd (`exited`), not asyncio's subprocess: on Python 3.11
    # asyncio's child watcher reaps in a thread of its own, so a du cancelled as it starts
    # can be reaped twice ("Unknown child process", CPython #103847), and a du killed just
    # after it ended is killed by a pid another child may have taken by then (CPython
    # #127049: here, another rollout's supervisor). This du stays a zombie, holding its
    # pid, until it is reaped below. Its output goes to files: a folder the agent made full
    # of unreadable entries makes du's errors as long as it likes.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            ["du", "-s", "-x", unit, "--", str(folder)], stdin=subprocess.DEVNULL,
            stdout=out, stderr=err, env={**os.environ, "LC_ALL": "C"})
        try:
            await exited(proc)
        except BaseException:  # the rollout ended meanwhile: no du outlives the watch
            proc.kill()  # not reaped yet: the pid is still this du's
            proc.wait()  # at once: SIGKILL cannot be caught
            raise
        returncode = proc.wait()
        out.seek(0)
        measured = out.read(_OUT_KEEP).split()
        said: tuple[str | None, str | None] = (None, None)
        if returncode != 0:
            err.seek(0)
            # All of it, a line at a time and out of the event loop: one unreadable entry
            # anywhere hides what it holds.
            said = await asyncio.to_thread(_what_du_said, err)
    problem, first = said
    if returncode != 0 and (problem is not None or not measured):
        raise Unmeasurable(problem or first or f"du exited with {returncode}")
    return int(measured[0])


def _what_du_said(err: IO[bytes]) -> tuple[str | None, str | None]:
    """The first thing du said it could not read, and the first thing it said at all.

    A file removed while du walked (a harness's temporary files come and go) is simply not
    counted: "No such file or directory" is not a problem, anything else is. A line is
    held `_LINE_KEEP` bytes at a time (a path nested without end is as long as it likes):
    its head is what is said, its tail what it ends with."""
    first = None
    while head := err.readline(_LINE_KEEP):
        tail = head
        while not tail.endswith(b"\n") and (more := err.readline(_LINE_KEEP)):
            tail = (tail + more)[-_LINE_KEEP:]
        line = head.decode(errors="replace").rstrip("\n")
        if not line.strip():
            continue
        if not tail.rstrip(b"\n").endswith(_VANISHED.encode()):
            return line, first or line
        first = first or line
    return None, first


def over(used: Usage, max_bytes: int | None, max_files: int | None) -> str | None:
    """Which limit `used` is past, in words, or None."""
    if max_bytes is not None and used.bytes > max_bytes:
        return f"{_mib(used.bytes)} on disk, past its limit of {_mib(max_bytes)}"
    if max_files is not None and used.files > max_files:
        return f"{used.files:,} files, past its limit of {max_files:,}"
    return None


async def watch(folder: Path, max_bytes: int | None, max_files: int | None,
                interval_s: float) -> str:
    """Measure `folder` every `interval_s` (or longer, see the module) until it is past a
    limit; return what was found then: "its folder took 12.0 MiB on disk, past ...". Runs
    until cancelled while the folder stays within its limits."""
    unmeasured = 0
    while True:
        started = time.monotonic()
        try:
            found = over(await usage(folder), max_bytes, max_files)
        except Unmeasurable as exc:
            # A test suite may make a folder unreadable for a moment (its permission tests);
            # only one that stays so hides what it holds.
            unmeasured += 1
            if unmeasured == UNMEASURED_TIMES:
                return f"its folder could not be measured {UNMEASURED_TIMES} times in a " \
                    f"row ({exc})"
        else:
            unmeasured = 0
            if found is not None:
                return f"its folder took {found}"
        took = time.monotonic() - started
        await asyncio.sleep(max(interval_s, _SPACING * took))


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"
