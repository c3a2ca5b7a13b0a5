"""Run what the agent wrote, for scoring, in a fresh sandbox: `run(argv, cwd)`.

A checker that executes the agent's artifacts (run its script, its tests, a command in its
workspace) runs code the policy wrote. On the trusted side that code could do whatever the
supervisor can: read the host, signal processes, write where the agent could not. So the
environment's `final_state` / `check` and the reward call `openforge.sandbox.verifier.run`
instead of `subprocess.run`: inside a rollout supervisor it runs the command in a fresh
sandbox of the attempt's mode (the same allowlisted view, no session token, its own PID
namespace ended with it), then removes what it left that the trusted side must not follow
(`scrub`), like after the agent. The supervisor also sealed the session before scoring, so
nothing run here can add a model call to the trajectory. What it printed is read bounded
(`bounded.head_and_tail`: the first and last 4 MiB of its stdout, the last 20,000 bytes of
its stderr), however much the agent's code printed.

Outside a supervisor (a test calling a checker directly, no agent involved) it is a plain
`subprocess.run` with the same arguments, its output read back the same way.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from openforge.harness import Command, ProcessOutput
from openforge.sandbox import bounded
from openforge.sandbox.modes import SandboxMode
from openforge.sandbox.relay import Relay
from openforge.sandbox.view import View


@dataclass
class _Sandbox:
    """The running attempt's sandbox, as the supervisor set it up for the agent."""

    mode: SandboxMode
    view: View
    agent_dir: Path
    work_dir: Path
    env: dict[str, str]
    relay: Relay | None = None
    cgroups: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    counter: Iterator[int] = field(default_factory=itertools.count)


_current: _Sandbox | None = None


@contextlib.contextmanager
def active(mode: SandboxMode, view: View, agent_dir: Path, work_dir: Path,
           env: dict[str, str], relay: Relay | None = None,
           cgroups: list[str] | None = None) -> Iterator[_Sandbox]:
    """While scoring: `run` uses this attempt's sandbox (the supervisor's business), whose
    network reaches `relay`'s ports and which starts in the rollout's `cgroups`, as the
    agent's did."""
    global _current
    previous, _current = _current, _Sandbox(mode, view, agent_dir, work_dir, env, relay,
                                            list(cgroups or []))
    try:
        yield _current
    finally:
        _current = previous


def run(argv: Sequence[str], cwd: Path | str, timeout_s: float = 60.0,
        stdin: str | None = None) -> ProcessOutput:
    """Run `argv` in `cwd` in a fresh sandbox of the attempt (see the module docstring)."""
    started = time.monotonic()
    sandbox = _current
    if sandbox is None:
        # Into files, read back as in a sandbox: a check reads the same either way.
        with bounded.run_to_files(argv, timeout_s=timeout_s, cwd=cwd, stdin=stdin) as ran:
            if ran.returncode is None:
                return ProcessOutput(returncode=None, timed_out=True,
                                     duration_s=time.monotonic() - started)
            return _read_output(ran.returncode, ran.stdout, ran.stderr, False, started)
    from openforge.executors.process import own_descendants
    from openforge.sandbox.agent import run_agent
    from openforge.sandbox.scrub import scrub_agent

    n = next(sandbox.counter)
    out, err = sandbox.work_dir / f"verifier-{n}.stdout", sandbox.work_dir / f"verifier-{n}.stderr"
    work = sandbox.work_dir / f"verifier-{n}"
    work.mkdir(exist_ok=True)
    exit_ = run_agent(sandbox.mode, Command(argv=list(argv), cwd=Path(cwd), stdin=stdin),
                      env=dict(sandbox.env), view=sandbox.view, work_dir=work, stdout=out,
                      stderr=err, timeout_s=timeout_s, trusted=own_descendants(),
                      relay=sandbox.relay, cgroups=sandbox.cgroups)
    sandbox.removed += scrub_agent(sandbox.agent_dir, sandbox.view)
    if exit_.setup_error:
        return ProcessOutput(returncode=127, stderr=exit_.setup_error,
                             duration_s=time.monotonic() - started)
    return _read_output(exit_.returncode, out, err, exit_.timed_out, started)


def _read_output(returncode: int | None, out: Path, err: Path, timed_out: bool,
                 started: float) -> ProcessOutput:
    stdout, omitted = bounded.head_and_tail(out)
    return ProcessOutput(returncode=returncode, stdout=stdout, stdout_omitted=omitted,
                         stderr=bounded.tail(err, 20_000), timed_out=timed_out,
                         duration_s=time.monotonic() - started)
