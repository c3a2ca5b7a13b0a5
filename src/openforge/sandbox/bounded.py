"""Reading what the agent wrote without letting its size take the trusted side's memory.

The agent decides how large the files it leaves are (up to its folder's `disk_max`, 10 GiB
by default), and how much its code prints when a check runs it. A supervisor that reads
such a file or such output whole can be made to hold gigabytes: the OOM killer then ends
the largest process, the supervisor or a neighbour, and an attempt whose supervisor died is
the infrastructure's failure, retried. A policy would have a way to make its 0s disappear
and to take the machine's memory from its neighbours. So the trusted side reads
agent-controlled bytes through here: at most a fixed number of them, and it says what it
left out, so that nothing it judges can look complete when it was not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

# What a check's run keeps of its standard output: its head and its tail, this much each.
# A result line a grader prints last is in the tail; what a check compares is in the head.
OUTPUT_KEEP = 4 << 20


@dataclasses.dataclass(frozen=True)
class Captured:
    """A command's end (`returncode` None when it ran past its time) and the files its
    standard output and error went to, for the caller to read bounded."""

    returncode: int | None
    stdout: Path
    stderr: Path


@contextlib.contextmanager
def run_to_files(argv: Sequence[str], *, timeout_s: float, cwd: Path | str | None = None,
                 stdin: str | None = None) -> Iterator[Captured]:
    """Run `argv` with its output going into files of a temporary folder, which is removed
    when the block ends: output that the agent's code controls never passes through this
    process's memory whole (a pipe would gather all of it)."""
    with tempfile.TemporaryDirectory(prefix="openforge-output-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        with open(out, "wb") as out_file, open(err, "wb") as err_file:
            try:
                returncode: int | None = subprocess.run(
                    list(argv), cwd=cwd, input=None if stdin is None else stdin.encode(),
                    stdin=subprocess.DEVNULL if stdin is None else None,
                    stdout=out_file, stderr=err_file, timeout=timeout_s).returncode
            except subprocess.TimeoutExpired:
                returncode = None
        yield Captured(returncode, out, err)


def omitted_note(n: int, where: str) -> str:
    """The line that stands where `n` bytes were left out."""
    return f"\n[openforge: {n:,} bytes of {where} not read: past what the trusted side reads]\n"


def read_text(path: Path, limit: int) -> str:
    """The text of `path` when it is at most `limit` bytes; else its first `limit` bytes
    and a line saying how many more it has (so no comparison with it can succeed by
    accident). Decoding errors are replaced."""
    with open(path, "rb") as f:
        head = f.read(limit)
        rest = f.seek(0, 2) - len(head)
    text = head.decode(errors="replace")
    return text + omitted_note(rest, path.name) if rest > 0 else text


def tail(path: Path, limit: int) -> str:
    """The last `limit` bytes of `path` as text ("" when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(f.seek(0, 2) - limit, 0))
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def head_and_tail(path: Path, keep: int = OUTPUT_KEEP) -> tuple[str, int]:
    """The text of `path`, or, when it is longer than twice `keep` bytes, its first and
    last `keep` bytes with a line between them saying how many were left out; and that
    number (0 when nothing was)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            if size <= 2 * keep:
                return f.read().decode(errors="replace"), 0
            head = f.read(keep)
            f.seek(size - keep)
            end = f.read(keep)
    except FileNotFoundError:
        return "", 0
    left_out = size - 2 * keep
    return (head.decode(errors="replace") + omitted_note(left_out, path.name)
            + end.decode(errors="replace")), left_out
