"""A benchmark task's own grader, run in a process of its own.

Both benchmarks' graders run this way: Claw-Eval's `grader.py` (`claweval/grade_main.py`,
with the checkout's `claw_eval` importable) and QwenClawBench's automated checks
(`formats/qwenclawbench_runner.py`, under bubblewrap). Their code never loads into
openforge's process, and a grader that hangs, crashes or spawns children cannot outlive
its time.

- This side, `run`: starts the grader's module (`command`) in a session of its own (killed
  with its whole process tree when it ends, when its time is up, or when this process
  dies), writes the job on its stdin as one JSON object, and reads the result back from
  the last stdout line that starts with the job's `nonce`.
- The grader's side, `serve`: reads the job, points `sys.stdout` at stderr while the
  grader runs (a grader's own prints cannot pass for the result, nor can a program it
  starts: neither knows the nonce), then writes `<nonce> <result JSON>`. While it runs,
  `note(text)` tells this side something at once (`<nonce>:note <JSON string>`, kept in
  `Outcome.notes`), so that it is known even when the process dies before any result.

The interpreter starts isolated (`command`): `-I` keeps the folder it runs in off
`sys.path` (for QwenClawBench that folder is the agent's workspace, where a `json.py` or
`traceback.py` would otherwise run inside the grader process before the grader, read the
nonce from stdin and write a result of its own), and ignores the PYTHON* variables and the
user site-packages; the trusted side's PYTHONPATH entries are put back by a bootstrap,
absolute, and none inside a folder the agent wrote (`untrusted`).

The limit: agent code that a grader itself loads into its process (a QwenClawBench grader
that imports or execs the agent's module, as the benchmark's graders do) runs with the
grader's rights, and can find the nonce in the process's memory and write any result.
Isolation keeps the agent's files from running where the grader did not ask for them; it
cannot make a grader that runs agent code in-process trustworthy.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from openforge.errors import OpenforgeError
from openforge.executors.process import (
    die_with_parent,
    end_and_reap,
    make_undumpable,
    wait_exited,
)

_OUTPUT_TAIL = 1500
# Puts the trusted import paths (argv[2:]) first, as PYTHONPATH would, then runs the module
# (argv[1]) as `-m` would. Under -I nothing of the cwd is importable, before or after this.
_BOOTSTRAP = ("import sys; sys.path[:0] = sys.argv[2:]; import runpy; "
              "runpy.run_module(sys.argv[1], run_name='__main__', alter_sys=True)")
_NOTE_LIMIT = 1000  # a note line stays well under PIPE_BUF: it reaches the pipe whole


class GraderError(OpenforgeError):
    """The task's grader could not score the rollout here, through no doing of the agent:
    it needs a module this Python lacks, or its process failed before it touched anything
    of the agent's; or its result cannot be taken as a score (agent code ran in its process,
    `qwenclawbench_grading.automated`). The attempt is a `plugin_error`: neither scored nor
    retried."""


@dataclass
class Outcome:
    """How a grader process ended: its `result`, or None when it wrote none (it crashed,
    or `timed_out`); `output` is the end of what it printed, for the error message; `notes`
    what it told on the way (`note`), in order."""

    result: dict[str, Any] | None
    timed_out: bool
    returncode: int | None
    output: str
    notes: list[str] = field(default_factory=list)


def inside(path: str, folder: str | Path) -> bool:
    """True when `path` (symlinks resolved) is `folder` or lies under it."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))


def import_paths(pythonpath: str | None, *, untrusted: Path | None = None) -> list[str]:
    """The PYTHONPATH entries the grader's interpreter gets: an empty entry (which Python
    reads as its cwd) dropped, a relative one made absolute against this process's cwd
    (not the grader's), one inside `untrusted` dropped."""
    out: list[str] = []
    for entry in (pythonpath or "").split(os.pathsep):
        if not entry:
            continue
        path = os.path.abspath(entry)
        if untrusted is not None and inside(path, untrusted):
            continue
        out.append(path)
    return out


def command(module: str, python: str = sys.executable,
            paths: Sequence[str] = ()) -> list[str]:
    """The argv that runs `module` as `python -m module` would, but isolated (-I: no cwd on
    sys.path, no PYTHON* variables, no user site-packages) with `paths` first on sys.path;
    -B: no bytecode written; -X utf8: the result's encoding does not follow the locale."""
    return [python, "-I", "-B", "-X", "utf8", "-c", _BOOTSTRAP, module, *paths]


def _read(stdout: str, stderr: str, nonce: str, timed_out: bool,
          returncode: int | None) -> Outcome:
    """The result (the last line that starts with `nonce `) and the notes in `stdout`; the
    output tail is stderr's, else the rest of stdout's."""
    lines = stdout.splitlines()
    mark = nonce + ":note "
    notes = [str(json.loads(line[len(mark):])) for line in lines if line.startswith(mark)]
    rest = "\n".join(line for line in lines if not line.startswith(nonce))
    output = (stderr or rest).strip()[-_OUTPUT_TAIL:]
    for line in reversed(lines):
        if line.startswith(nonce + " "):
            return Outcome(dict(json.loads(line[len(nonce) + 1:])), False, returncode, output,
                           notes)
    return Outcome(None, timed_out, returncode, output, notes)


def run(module: str, job: dict[str, Any], *, cwd: Path, env: dict[str, str], timeout_s: float,
        python: str = sys.executable, wrap: Sequence[str] = (),
        untrusted: Path | None = None) -> Outcome:
    """`module` run isolated (`command`; behind `wrap`, e.g. a bubblewrap argv) on `job`,
    with `env`'s PYTHONPATH passed on as `import_paths` (none of it inside `untrusted`)."""
    nonce = secrets.token_hex(16)
    argv = command(module, python, import_paths(env.get("PYTHONPATH"), untrusted=untrusted))
    # Waited for without reaping it (not `communicate`, which reaps): until it is reaped its
    # pid and group cannot go to a new process, so the kill of what it left reaches nothing
    # else. Pipes, not files: a program the grader starts inherits them and could truncate
    # a file, notes and all.
    proc = subprocess.Popen([*wrap, *argv], cwd=str(cwd), env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=die_with_parent())
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    job_text = json.dumps({**job, "nonce": nonce}, ensure_ascii=False)
    threads = [_Pipe(proc.stdin, job_text.encode()), _Pipe(proc.stdout), _Pipe(proc.stderr)]
    timed_out = not wait_exited(proc, timeout_s)
    returncode = end_and_reap(proc, grace_s=1.0)
    for thread in threads:
        thread.join(timeout=5)  # a process that escaped the kill may hold a pipe open
    stdout, stderr = (thread.text() for thread in threads[1:])
    return _read(stdout, stderr, nonce, timed_out, returncode)


class _Pipe(threading.Thread):
    """Writes `data` into `pipe` and closes it, or reads `pipe` to its end (`text`)."""

    def __init__(self, pipe: IO[bytes], data: bytes | None = None) -> None:
        super().__init__(daemon=True)
        self.pipe, self.data, self.chunks = pipe, data, list[bytes]()
        self.start()

    def run(self) -> None:
        try:
            if self.data is not None:
                self.pipe.write(self.data)  # a grader that does not read it cannot hold us
            else:
                while chunk := self.pipe.read(65536):
                    self.chunks.append(chunk)
        except (OSError, ValueError):
            pass  # it ended without reading all of it: its outcome says so
        finally:
            with contextlib.suppress(OSError):
                self.pipe.close()

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", errors="replace")


def run_verified(module: str, job: dict[str, Any], *, cwd: Path, timeout_s: float,
                 python: str = sys.executable, untrusted: Path | None = None) -> Outcome:
    """`module` run isolated (`command`) on `job` through `openforge.sandbox.verifier.run`:
    in a fresh sandbox of the running attempt (a plain process outside a rollout
    supervisor). That sandbox has the attempt's environment, so the import paths are this
    process's PYTHONPATH (the one its view was built from), none inside `untrusted`."""
    from openforge.sandbox import verifier

    nonce = secrets.token_hex(16)
    paths = import_paths(os.environ.get("PYTHONPATH"), untrusted=untrusted)
    done = verifier.run(command(module, python, paths), cwd=cwd, timeout_s=timeout_s,
                        stdin=json.dumps({**job, "nonce": nonce}, ensure_ascii=False))
    return _read(done.stdout, done.stderr, nonce, done.timed_out, done.returncode)


_note_to: tuple[str, int] | None = None  # (nonce, stdout's fd) while `serve` runs a job


def note(text: str) -> None:
    """Tell the trusted side `text` now: written straight to the stdout pipe, so that it
    arrives even if the process is killed or `os._exit`s the next moment. Outside `serve`,
    it does nothing."""
    if _note_to is None:
        return
    nonce, fd = _note_to
    os.write(fd, f"{nonce}:note {json.dumps(text[:_NOTE_LIMIT])}\n".encode())


def serve(grade: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The grader process's main: the job from stdin, `grade(job)`'s result to stdout."""
    global _note_to
    # Before the nonce is in memory: a non-dumpable process's /proc/PID/mem and fd are
    # closed to the programs the grader starts (the agent's scripts, run by the same user),
    # so they can neither read the nonce nor write to its stdout pipe and then kill it.
    make_undumpable()
    job = json.loads(sys.stdin.read())
    sys.stdin.close()
    out = sys.stdout
    out.flush()  # nothing buffered may land after a note
    _note_to = (job["nonce"], out.fileno())
    sys.stdout = sys.stderr  # the grader's prints must not be taken for the result
    try:
        result = grade(job)
    finally:
        sys.stdout = out
        _note_to = None
    out.write(f"{job['nonce']} {json.dumps(result, ensure_ascii=False, default=str)}\n")
    out.flush()
