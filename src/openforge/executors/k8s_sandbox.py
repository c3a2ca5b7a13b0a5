"""The three containers of a rollout Pod: `python -m openforge.executors.k8s_sandbox ROLE`.

The Pod `k8s_pods.build_pod` makes runs one role per container, in the order the kubelet
guarantees (init containers one after the other, a native sidecar started first and kept
running, the main container last):

- `supervisor`, a native sidecar (an init container with `restartPolicy: Always`), trusted:
  the rollout supervisor (`openforge.rollout.Supervisor`, the same code as on a local
  machine) with a launch hook. It reads the spec from the attempt's Secret, builds the
  plugins, prepares the workspace and the environment's services (they stay up beside the
  agent: the Pod's containers share its network), writes the harness's command for the
  agent container and then says it is ready (its startup probe lets the next container
  start). When the verifier connects, the agent container has ended, and every process it
  started with it (its PID namespace died with it): only then does the supervisor seal the
  session, read what the harness left (links out of the agent's view removed first),
  capture the final state and score it, and it answers the verifier with the result line
  signed with the attempt's key (`protocol.scoring_result_key`: derived from the scoring
  credential, which only this container holds). Checks that run the agent's code while
  scoring run in a sandbox of this container (the best mode it can build: `auto`).
- `agent`, an init container: runs the harness command and nothing else. It holds the
  session token (good for model calls only) and no other credential: it mounts neither the
  Secret nor the volume the supervisor and the verifier share. Its launcher is the
  container's first process, which nothing inside can kill, and exits 0 whatever the harness
  did; an agent container ended otherwise (the OOM killer took all of it) fails the Pod,
  and the executor decides whose end that was from the session's recorded calls
  (`openforge.attribution`).
- `verifier`, the Pod's main container, trusted: the only container whose termination
  message (and log) the executor reads. It asks the supervisor over a socket in their
  shared volume and writes the answer as its termination message and last log line.

Paths come from the environment (`OPENFORGE_*_DIR`, `OPENFORGE_SPEC_FILE`,
`OPENFORGE_TERMINATION_LOG`: names from `openforge.sandbox.protocol`), never from
constants, so a stand-in kubelet can map them. This module imports only the standard
library and the protocol's names at the top: the verifier is a few lines of socket code and
starts fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openforge.sandbox.protocol import (
    AGENT_DIR_ENV,
    HIDDEN_ENV,
    SANDBOX_ENV,
    SPEC_FILE_ENV,
    TERMINATION_LOG_ENV,
    TRUSTED_DIR_ENV,
    WORKSPACE_ENV,
    output_file,
)

if TYPE_CHECKING:
    from openforge.harness import Command
    from openforge.sandbox.agent import AgentExit
    from openforge.sandbox.view import View
    from openforge.types import RolloutResult

SUPERVISOR, AGENT, VERIFIER = "supervisor", "agent", "verifier"
# In the trusted volume (relative: a Unix socket path must stay under 108 bytes).
SOCKET = "supervisor.sock"
READY = "ready"  # the supervisor's startup probe waits for this file
STARTED = "supervisor-started"  # a sidecar that finds it was restarted after a crash
# In the agent's volume.
COMMAND = "command.json"
EXIT = "exit.json"
# How much of the harness's stdout / stderr the supervisor reads back (as a local supervisor).
_OUTPUT_TAIL = {"harness.stdout": 200_000, "harness.stderr": 20_000}
_CONNECT_S = 120.0  # how long the verifier waits for the supervisor's socket


def _dir(env: str) -> Path:
    return Path(os.environ[env])


# -- supervisor ----------------------------------------------------------------------------------


def supervise() -> int:
    """Prepare, hand the harness to the agent container, score after it ended, answer."""
    from openforge import rollout
    from openforge.sandbox.agent import AgentExit
    from openforge.sandbox.modes import SandboxUnavailable, resolve
    from openforge.sandbox.protocol import scoring_result_key
    from openforge.types import RolloutResult, RolloutSpec

    trusted, agent_dir = _dir(TRUSTED_DIR_ENV), _dir(AGENT_DIR_ENV)
    signal.signal(signal.SIGTERM, rollout._on_sigterm)
    os.chdir(trusted)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    restarted = (trusted / STARTED).exists()
    (trusted / STARTED).touch()
    try:
        spec = RolloutSpec.model_validate_json(Path(os.environ[SPEC_FILE_ENV]).read_text())
    except (OSError, ValueError) as exc:
        _skip_agent(agent_dir, trusted)
        _listen(server)
        _serve(server, None, error=f"cannot read the rollout spec: {exc}")
        return 0
    key = scoring_result_key(spec)
    base: dict[str, Any] = {"rollout_id": spec.rollout_id, "task_id": spec.task.id,
                            "attempt": spec.attempt, "session_id": spec.session_id,
                            "sandbox": "pod"}
    if restarted:
        # The kubelet restarted this sidecar: its first instance died mid-rollout, so the
        # environment it prepared is gone. Whatever the agent did cannot be scored.
        _listen(server)
        _serve(server, RolloutResult(
            **base, status="infra_error", error="the Pod's supervisor container restarted (its "
            "first instance died): the environment it prepared is gone"), key=key)
        return 0
    _listen(server)
    handed_over = False
    pending: list[socket.socket] = []  # the verifier's call, answered once scored

    def launch(command: Command, env: dict[str, str], stdout: Path, stderr: Path,
               timeout_s: float, view: View) -> AgentExit:
        nonlocal handed_over
        shown = shown_hidden(view.hidden)
        if shown:
            return AgentExit(returncode=None, timed_out=False, duration_s=0.0, setup_error=(
                "the agent's container would show the environment's hidden folder(s) "
                f"{', '.join(shown)}: the Pod empties the folders the runner found, so the "
                "image must install the environment at the same paths as the runner "
                "(docs/sandboxing.md)"))
        _write_json(agent_dir / COMMAND, {
            "argv": command.argv, "env": env, "cwd": str(command.cwd or agent_dir),
            "stdin": command.stdin, "deadline": time.time() + max(timeout_s, 0.1)})
        handed_over = True
        (trusted / READY).touch()
        # The verifier starts only after the agent container ended: its call is the signal.
        conn, _ = server.accept()
        pending.append(conn)
        # What the agent left is read without following links and only from plain files.
        record = _read_json(agent_dir / EXIT) or {}
        for target, name in ((stdout, "harness.stdout"), (stderr, "harness.stderr")):
            target.write_bytes(_tail_of(agent_dir / name, _OUTPUT_TAIL[name]))
        returncode = record.get("returncode")
        return AgentExit(returncode=returncode if isinstance(returncode, int) else None,
                         timed_out=bool(record.get("timed_out")),
                         duration_s=float(record.get("duration_s") or 0.0))

    root = trusted / "supervisor"
    root.mkdir(exist_ok=True)
    try:
        # The mode of the sandboxes that run the agent's code while scoring (the agent's
        # own sandbox is its container).
        mode = resolve(os.environ.get(SANDBOX_ENV) or "auto")
    except SandboxUnavailable as exc:
        result = RolloutResult(**base, status="infra_error", error=str(exc))
    else:
        result = rollout.execute(spec, root, mode, launch=launch, sandbox="pod",
                                 agent_dir=agent_dir, workspace=_dir(WORKSPACE_ENV))
    if not handed_over:  # setup failed: the agent has nothing to run
        _skip_agent(agent_dir, trusted)
    _serve(server, result, key=key, pending=pending)
    return 0


def shown_hidden(hidden: list[str]) -> list[str]:
    """The hidden folders (as this container, of the same image as the agent's, finds them)
    that the Pod does not empty in the agent's container: the executor found the hidden
    folders on the runner's machine, and mounts an empty folder at each."""
    emptied = {os.path.realpath(p) for p in json.loads(os.environ.get(HIDDEN_ENV) or "[]")}
    return [h for h in hidden if os.path.realpath(h) not in emptied]


def _listen(server: socket.socket) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SOCKET)
    server.bind(SOCKET)
    server.listen(4)


def _skip_agent(agent_dir: Path, trusted: Path) -> None:
    _write_json(agent_dir / COMMAND, {"skip": True})
    (trusted / READY).touch()


def _tail_of(path: Path, limit: int) -> bytes:
    """The last `limit` bytes of the plain file `path` (b"" for a link, a FIFO, nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd)
        if not stat.S_ISREG(size.st_mode):
            return b""
        f.seek(max(size.st_size - limit, 0))
        return f.read(limit)


def _serve(server: socket.socket, result: RolloutResult | None, error: str = "",
           key: bytes | None = None, pending: list[socket.socket] | None = None) -> None:
    """Answer the verifier (now and on any later call), then idle until the Pod ends.

    A sidecar that exits is restarted by the kubelet, so it waits for its SIGTERM.
    """
    from openforge.executors.k8s_result import compact_message
    from openforge.sandbox.protocol import result_line

    if result is not None:
        answer = {"message": compact_message(result, key), "line": result_line(result, key)}
    else:
        answer = {"message": "", "line": "", "error": error}
    payload = (json.dumps(answer) + "\n").encode()
    conns = list(pending or [])
    try:
        while True:
            if not conns:
                conn, _ = server.accept()
                conns.append(conn)
            conn = conns.pop()
            with conn:
                with contextlib.suppress(OSError):
                    conn.sendall(payload)
    except Exception:  # SIGTERM (the Pod is ending) or a broken socket: nothing more to do
        return


# -- agent ---------------------------------------------------------------------------------------


def run_agent() -> int:
    """Run the command the supervisor wrote; record how it ended; exit 0 whatever the agent did.

    Standard library only (it starts in milliseconds). The Pod runs this as the container's
    first process (its `command`, not under the image's init): PID 1 of the container's PID
    namespace, to which the kernel delivers no SIGKILL or SIGSTOP from inside and no signal
    it does not handle, and undumpable (a process of the same user cannot trace it or reach
    its descriptors). So nothing the agent runs can end it early: an agent container that
    exits otherwise would fail the Pod, an attempt the executor could not score
    (docs/sandboxing.md, 'Kubernetes: the agent's own container'). When it exits, the
    kernel ends every process the harness left in the container.
    """
    from openforge.executors.process import make_undumpable

    make_undumpable()
    # Python's own SIGINT handler would raise in here: as PID 1, a signal with the default
    # action is never delivered from inside (and the harness inherits the default).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    agent_dir = _dir(AGENT_DIR_ENV)
    task = _read_json(agent_dir / COMMAND)
    if not task or task.get("skip"):
        return 0
    record = _run_harness(task, agent_dir)
    try:
        _write_json(agent_dir / EXIT, record)
    except OSError as exc:  # the agent filled its volume or put something in the way
        print(f"cannot record how the harness ended: {exc}", file=sys.stderr)
    return 0


def _run_harness(task: dict[str, Any], agent_dir: Path) -> dict[str, Any]:
    """Run the harness to its end, its deadline or the Pod's SIGTERM; how it ended."""
    env = dict(os.environ)
    env.update(task.get("env") or {})
    stdin = task.get("stdin")
    started = time.monotonic()
    # The names rollout.read_output reads.
    with output_file(agent_dir / "harness.stdout") as out, \
            output_file(agent_dir / "harness.stderr") as err:
        try:
            proc = subprocess.Popen(
                task["argv"], cwd=task.get("cwd") or None, env=env, stdout=out, stderr=err,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                start_new_session=True)
        except OSError as exc:  # the program cannot be started: the harness's own failure
            err.write(f"cannot start the harness: {exc}\n".encode())
            return {"returncode": 127, "timed_out": False}
        stopping: list[int] = []
        # The Pod is being deleted (or the agent sent it: then it ended its own harness).
        signal.signal(signal.SIGTERM, lambda signum, _: stopping.append(signum))
        if stdin is not None and proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(stdin.encode())
                proc.stdin.close()
        ended = _wait_reaping(proc, float(task["deadline"]), stopping)
        _end_group(proc)
    return {"returncode": proc.returncode, "timed_out": not ended and not stopping,
            "duration_s": time.monotonic() - started}


def _wait_reaping(proc: subprocess.Popen[bytes], deadline: float, stopping: list[int]) -> bool:
    """Wait for the harness until `deadline` (wall clock) or a SIGTERM; True if it ended.

    As the container's first process this is the init of every orphan the harness leaves:
    each is reaped as it ends, so none lingers as a zombie."""
    while not stopping and time.time() < deadline:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pid, status = 0, 0
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return True
        if pid == 0:
            time.sleep(0.05)
    return False


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the harness's process group, SIGKILL it a second later."""
    for sig, wait in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
            if sig == signal.SIGTERM:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # what the leader left in the group
                return


# -- verifier ------------------------------------------------------------------------------------


def verify() -> int:
    """Fetch the supervisor's answer; write it as this container's termination message."""
    os.chdir(_dir(TRUSTED_DIR_ENV))
    deadline = time.monotonic() + _CONNECT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(SOCKET)
            break
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                print("the supervisor never answered", file=sys.stderr)
                return 1
            time.sleep(0.2)
    with sock:
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    try:
        answer = json.loads(data)
    except ValueError:
        print("the supervisor's answer is not JSON", file=sys.stderr)
        return 1
    if not answer.get("line"):
        print(f"no result: {answer.get('error') or 'the supervisor had none'}", file=sys.stderr)
        return 1
    with contextlib.suppress(OSError):
        Path(os.environ[TERMINATION_LOG_ENV]).write_text(answer["message"])
    sys.stdout.write(answer["line"] + "\n")
    sys.stdout.flush()
    return 0


# -- helpers -------------------------------------------------------------------------------------


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(_tail_of(path, 1 << 20))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


ROLES = {SUPERVISOR: supervise, AGENT: run_agent, VERIFIER: verify}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ROLES:
        print(f"usage: python -m openforge.executors.k8s_sandbox {'|'.join(ROLES)}",
              file=sys.stderr)
        return 2
    return ROLES[args[0]]()


if __name__ == "__main__":
    sys.exit(main())
