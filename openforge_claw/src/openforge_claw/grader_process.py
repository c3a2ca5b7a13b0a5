"""A benchmark task's own grader, run in a process of its own.

Both benchmarks' graders run this way: Claw-Eval's `grader.py` (`claweval/grade_main.py`,
with the checkout's `claw_eval` importable) and QwenClawBench's automated checks
(`formats/qwenclawbench_runner.py`, under bubblewrap). Their code never loads into
openforge's process, and a grader that hangs, crashes or spawns children cannot outlive
its time.

- This side, `run`: starts `python -m MODULE` in a session of its own (killed with its
  whole process tree when it ends, when its time is up, or when this process dies),
  writes the job on its stdin as one JSON object, and reads the result back from the
  last stdout line that starts with the job's `nonce`.
- The grader's side, `serve`: reads the job, points `sys.stdout` at stderr while the
  grader runs (a grader's own prints cannot pass for the result, nor can agent code it
  runs: neither knows the nonce), then writes `<nonce> <result JSON>`.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openforge.errors import OpenforgeError
from openforge.executors.process import die_with_parent, kill_tree

_OUTPUT_TAIL = 1500


class GraderError(OpenforgeError):
    """The task's grader could not score the rollout here (it crashed, ran out of time, or
    needs what is not there): an infrastructure failure, never a 0."""


@dataclass
class Outcome:
    """How a grader process ended: its `result`, or None when it wrote none (it crashed,
    or `timed_out`); `output` is the end of what it printed, for the error message."""

    result: dict[str, Any] | None
    timed_out: bool
    returncode: int | None
    output: str


def run(module: str, job: dict[str, Any], *, cwd: Path, env: dict[str, str], timeout_s: float,
        python: str = sys.executable, wrap: Sequence[str] = ()) -> Outcome:
    """`python -m module` (behind `wrap`, e.g. a bubblewrap argv) on `job`."""
    nonce = secrets.token_hex(16)
    proc = subprocess.Popen([*wrap, python, "-m", module], cwd=str(cwd), env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=die_with_parent())
    timed_out = False
    stdout = stderr = ""
    try:
        stdout, stderr = proc.communicate(json.dumps({**job, "nonce": nonce}, ensure_ascii=False),
                                          timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        kill_tree(proc.pid, proc.pid, None, grace_s=1.0)
        proc.wait()
    output = (stderr or stdout).strip()[-_OUTPUT_TAIL:]
    for line in reversed(stdout.splitlines()):
        if line.startswith(nonce + " "):
            return Outcome(dict(json.loads(line[len(nonce) + 1:])), False, proc.returncode,
                           output)
    return Outcome(None, timed_out, proc.returncode, output)


def run_verified(module: str, job: dict[str, Any], *, cwd: Path, timeout_s: float,
                 python: str = sys.executable) -> Outcome:
    """`python -m module` on `job` through `openforge.sandbox.verifier.run`: in a fresh
    sandbox of the running attempt (a plain process outside a rollout supervisor)."""
    from openforge.sandbox import verifier

    nonce = secrets.token_hex(16)
    done = verifier.run([python, "-m", module], cwd=cwd, timeout_s=timeout_s,
                        stdin=json.dumps({**job, "nonce": nonce}, ensure_ascii=False))
    output = (done.stderr or done.stdout).strip()[-_OUTPUT_TAIL:]
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(nonce + " "):
            return Outcome(dict(json.loads(line[len(nonce) + 1:])), False, done.returncode,
                           output)
    return Outcome(None, done.timed_out, done.returncode, output)


def serve(grade: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The grader process's main: the job from stdin, `grade(job)`'s result to stdout."""
    job = json.loads(sys.stdin.read())
    sys.stdin.close()
    out = sys.stdout
    sys.stdout = sys.stderr  # the grader's prints must not be taken for the result
    try:
        result = grade(job)
    finally:
        sys.stdout = out
    out.write(f"{job['nonce']} {json.dumps(result, ensure_ascii=False, default=str)}\n")
    out.flush()
