"""The agent's sandbox from the inside: what an isolating mode lets a harness see and do."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sandbox_modes import ALL_MODES, ISOLATING_MODES

from openforge.builtin.tasks import TasksEnvironment
from openforge.executors.local import LocalExecutor
from openforge.executors.process import LeftoverError
from openforge.rollout import execute
from openforge.sandbox.modes import bwrap_path
from openforge.sandbox.scrub import scrub, scrub_agent, tally
from openforge.sandbox.view import build_view, python_paths
from openforge.types import RolloutSpec, Task

TESTS_DIR = str(Path(__file__).parent)


@pytest.fixture(autouse=True)
def _plugins_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", TESTS_DIR)


async def probe(tmp_path: Path, mode: str, plan: dict[str, list[str]],
                protect: list[Path] = ()) -> dict[str, object]:
    """Run ProbeHarness with `plan` in `mode`; what it saw."""
    base = tmp_path / "rollouts"
    executor = LocalExecutor(sandbox=mode, base_dir=base, keep_dirs=True)
    executor.protect(*protect)
    spec = RolloutSpec(run_id="run", rollout_id="probe", task=Task(id="only", prompt=json.dumps(plan)),
                       harness="executor_plugins:ProbeHarness",
                       environment="executor_plugins:OneTaskEnv", reward="checker",
                       gateway_url="http://127.0.0.1:9", session_token="tok", session_id="sid")
    result = await executor.run(spec)
    assert result.status == "ok", result.error
    return dict(json.loads(next(base.glob("*/agent/workspace/probe.json")).read_text()))


@pytest.mark.parametrize("mode", ISOLATING_MODES)
async def test_the_agent_sees_only_its_allowlist(tmp_path: Path, mode: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "real-home"
    home.mkdir()
    (home / "secret.txt").write_text("home secret")
    monkeypatch.setenv("HOME", str(home))
    run_dir = tmp_path / "runs" / "run-1"
    run_dir.mkdir(parents=True)
    (run_dir / "store.sqlite").write_text("sessions")
    neighbour = tmp_path / "rollouts" / "openforge-neighbour-x"
    (neighbour / "agent" / "workspace").mkdir(parents=True)
    (neighbour / "spec.json").write_text("neighbour spec")
    seen = await probe(tmp_path, mode, {
        "read": [str(home / "secret.txt"), str(run_dir / "store.sqlite"),
                 str(neighbour / "spec.json"), "/etc/shadow"],
        "write": ["/usr/openforge-probe", "/etc/openforge-probe", sys.executable],
        "list": ["/", "/proc", str(tmp_path / "rollouts")],
    }, protect=[run_dir])
    for path in (home / "secret.txt", run_dir / "store.sqlite", neighbour / "spec.json"):
        assert str(seen[str(path)]).startswith("error: FileNotFoundError"), path
    assert seen["/etc/shadow"] in ("", "error: PermissionError")  # masked with /dev/null
    for path in ("/usr/openforge-probe", "/etc/openforge-probe", sys.executable):
        assert seen[path] == "error: OSError", path  # EROFS
    assert not os.path.exists("/usr/openforge-probe")
    top = set(seen["/"])  # type: ignore[arg-type]
    # Beyond the system directories, only the first component of a path the view maps on
    # purpose (the Python it runs on, the rollout's own directory): where the checkout lives
    # differs from machine to machine.
    mapped = {Path(p).parts[1] for p in [*python_paths(), str(tmp_path)]}
    assert top <= {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "proc",
                   "tmp"} | mapped, top
    assert "sys" not in top and "boot" not in top
    # Its own PID namespace: a handful of processes, PID 1 being openforge's reaper.
    pids = [p for p in seen["/proc"] if p.isdigit()]  # type: ignore[union-attr]
    assert "1" in pids and len(pids) <= 5, pids
    # Only its own rollout directory exists under the rollouts' folder.
    assert len(seen[str(tmp_path / "rollouts")]) == 1  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ISOLATING_MODES)
async def test_no_capability_and_no_way_to_remount(tmp_path: Path, mode: str) -> None:
    base = tmp_path / "rollouts"
    data = tmp_path / "data"
    data.mkdir()
    (data / "expected.txt").write_text("right")
    executor = LocalExecutor(sandbox=mode, base_dir=base, keep_dirs=True)
    script = ("grep CapEff /proc/self/status > caps.txt; "
              f"mount -o remount,bind,rw {data} 2> remount.txt; echo $? >> remount.txt; "
              f"echo forged > {data}/expected.txt 2> write.txt; echo $? >> write.txt")
    spec = RolloutSpec(run_id="run", rollout_id="caps", task=Task(id="only", prompt=script),
                       harness="executor_plugins:ShellHarness",
                       environment="executor_plugins:DataEnv",
                       environment_options={"data": str(data)}, reward="checker",
                       gateway_url="http://127.0.0.1:9", session_token="tok", session_id="sid")
    result = await executor.run(spec)
    assert result.status == "ok", result.error
    workspace = next(base.glob("*/agent/workspace"))
    assert (workspace / "caps.txt").read_text().split() == ["CapEff:", "0000000000000000"]
    assert (workspace / "remount.txt").read_text().strip().splitlines()[-1] != "0"
    assert (workspace / "write.txt").read_text().strip().splitlines()[-1] != "0"
    assert (data / "expected.txt").read_text() == "right"


@pytest.mark.parametrize("mode", ALL_MODES)
async def test_a_tasks_command_check_runs_in_the_attempts_sandbox(tmp_path: Path, mode: str) -> None:
    # The `tasks` environment's command check runs what the agent left: never on the trusted
    # side, where it could read the host. Without isolation it sees the host's file (the
    # contrast that shows the check can tell).
    host_file = tmp_path / "host-only.txt"
    host_file.write_text("not for the agent")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "look", "prompt": "true",
                                 "check": {"command": f"test ! -e {host_file}"}}) + "\n")
    [task] = TasksEnvironment(path=str(tasks)).tasks()
    executor = LocalExecutor(sandbox=mode, base_dir=tmp_path / "rollouts")
    spec = RolloutSpec(run_id="run", rollout_id="look", task=task,
                       harness="executor_plugins:ShellHarness", environment="tasks",
                       environment_options={"path": str(tasks)}, reward="checker",
                       gateway_url="http://127.0.0.1:9", session_token="tok", session_id="sid")
    result = await executor.run(spec)
    assert result.status == "ok", result.error
    assert result.reward is not None and result.reward.passed == (mode != "none")


def test_the_view_never_maps_a_protected_path(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # A sys.path entry that holds the run directory (say, the folder openforge runs from).
    project = tmp_path / "project"
    (project / "runs" / "r1").mkdir(parents=True)
    agent = tmp_path / "rollouts" / "x" / "agent"
    (agent / "workspace").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [*sys.path, str(project)])
    view = build_view(agent, workspace=agent / "workspace", programs=[tmp_path / "rollouts"],
                      data=[project / "runs" / "r1"],
                      protected=[project / "runs" / "r1", tmp_path / "rollouts"])
    sources = view.sources()
    assert str(project) not in sources and str(project / "runs" / "r1") not in sources
    assert str(tmp_path / "rollouts") not in sources
    assert str(agent.resolve()) in sources and view.binds[-1].rw
    assert [b for b in view.binds if b.rw] == [view.binds[-1]]  # only the agent's folder
    assert any(str(project) in d for d in view.dropped)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run two processes as another user")
@pytest.mark.parametrize("undumpable", [False, True])
def test_an_undumpable_process_hides_its_environment_from_the_same_user(undumpable: bool) -> None:
    # Without isolation the runner and the supervisor make themselves undumpable, so another
    # process of the same (non-root) user cannot read their environment; the control shows
    # that, dumpable, it could.
    def as_nobody() -> None:
        os.setgid(65534)
        os.setuid(65534)

    code = ("import ctypes, os, time\n"
            "from openforge.executors.process import make_undumpable\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable again after the uid change\n"
            + ("make_undumpable()\n" if undumpable else "")
            + "print('ready', flush=True); time.sleep(60)\n")
    target = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              env={**os.environ, "HIDDEN_SECRET": "s3cr3t"})
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == b"ready"
        reader = subprocess.run(["cat", f"/proc/{target.pid}/environ"], preexec_fn=as_nobody,
                                capture_output=True, timeout=60)
    finally:
        target.kill()
        target.wait()
    if undumpable:
        assert reader.returncode != 0 and b"s3cr3t" not in reader.stdout
        assert b"Permission denied" in reader.stderr
    else:
        assert b"HIDDEN_SECRET=s3cr3t" in reader.stdout


@pytest.mark.skipif(os.getuid() != 0 or bwrap_path() is None,
                    reason="shows what bubblewrap run by root does without --cap-drop ALL")
def test_bubblewrap_run_by_root_needs_cap_drop() -> None:
    # Why bwrap_argv passes --cap-drop ALL: without it, root's sandbox keeps every capability
    # (and could remount its read-only binds read-write).
    base = [bwrap_path(), "--unshare-all", "--share-net", "--ro-bind", "/", "/", "--proc",
            "/proc", "--dev", "/dev"]
    probe = ["grep", "CapEff", "/proc/self/status"]
    kept = subprocess.run([*base, *probe], capture_output=True, text=True, timeout=60)
    dropped = subprocess.run([*base, "--cap-drop", "ALL", *probe], capture_output=True,
                             text=True, timeout=60)
    assert kept.stdout.split()[1] != "0000000000000000"
    assert dropped.stdout.split()[1] == "0000000000000000"


def test_the_supervisor_never_scores_while_an_agent_process_lives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unkillable(*args: object, **kwargs: object) -> object:
        raise LeftoverError("1 processes of the sandbox's PID namespace are still alive: [42]")

    monkeypatch.setattr("openforge.rollout.run_agent", unkillable)
    spec = RolloutSpec(run_id="run", rollout_id="r", task=Task(id="only", prompt="p"),
                       harness="executor_plugins:OkHarness",
                       environment="executor_plugins:OneTaskEnv", reward="checker",
                       gateway_url="http://127.0.0.1:9", session_token="tok", session_id="sid")
    result = execute(spec, tmp_path, "none")
    assert result.status == "infra_error" and result.reward is None
    assert (result.error or "").startswith("could not end the agent's processes: 1 processes")


def test_scrub_removes_links_out_of_the_view_and_special_files(tmp_path: Path) -> None:
    agent, visible, outside = tmp_path / "agent", tmp_path / "visible", tmp_path / "outside"
    for folder in (agent / "workspace" / "sub", visible, outside):
        folder.mkdir(parents=True)
    (visible / "data.txt").write_text("data")
    (visible / "masked").write_text("root only")
    (outside / "secret.txt").write_text("secret")
    ws = agent / "workspace"
    (ws / "own.txt").write_text("mine")
    kept = {"inside": ws / "sub" / "own-link", "visible": ws / "data-link"}
    kept["inside"].symlink_to("../own.txt")
    kept["visible"].symlink_to(visible / "data.txt")
    gone = {"secret": ws / "secret-link", "dir": ws / "sub" / "outside-dir",
            "proc": ws / "environ", "masked": ws / "masked-link", "dangling": ws / "nowhere",
            "fifo": ws / "stall.fifo"}
    gone["secret"].symlink_to(outside / "secret.txt")
    gone["dir"].symlink_to(outside)
    gone["proc"].symlink_to("/proc/self/environ")
    gone["masked"].symlink_to(visible / "masked")
    gone["dangling"].symlink_to(outside / "later.txt")
    os.mkfifo(gone["fifo"])
    removed = scrub(agent, [str(visible)], [str(visible / "masked")])
    assert all(p.is_symlink() for p in kept.values())
    assert not [name for name, p in gone.items() if os.path.lexists(p)]
    assert len(removed) == len(gone) and (outside / "secret.txt").exists()
    # Counted for the result: five links out of the view, one FIFO.
    assert tally(removed) == {"scrubbed_links": 5, "scrubbed_special_files": 1}
    assert tally([]) == {}


def test_scrub_reaches_a_workspace_beside_the_agents_folder(tmp_path: Path) -> None:
    # In a Pod the workspace is a volume of its own, not inside the agent's folder.
    agent, workspace, outside = tmp_path / "agent", tmp_path / "workspace", tmp_path / "outside"
    for folder in (agent, workspace, outside):
        folder.mkdir()
    (outside / "answer.txt").write_text("the grader's")
    (agent / "notes.txt").write_text("mine")
    (workspace / "answer.txt").symlink_to(outside / "answer.txt")
    (workspace / "notes.txt").symlink_to(agent / "notes.txt")  # the agent's own: kept
    (agent / "home-link").symlink_to(workspace)  # its own workspace: kept
    view = build_view(agent, workspace=workspace, protected=[outside])
    removed = scrub_agent(agent, view)
    assert [Path(r.split(" -> ")[0]).name for r in removed] == ["answer.txt"]
    assert (workspace / "notes.txt").is_symlink() and (agent / "home-link").is_symlink()


@pytest.mark.parametrize("mode", ISOLATING_MODES)
def test_checks_see_a_workspace_beside_the_agents_folder(tmp_path: Path, mode: str) -> None:
    """In a Pod the workspace is a volume of its own: a check that runs the agent's code
    there (`sandbox.verifier`) must find it in its view, readable and writable, or a correct
    answer would score 0 as a failed command."""
    from openforge.sandbox import verifier

    agent, workspace, work = tmp_path / "agent", tmp_path / "workspace", tmp_path / "work"
    for folder in (agent / "home", agent / "tmp", workspace, work):
        folder.mkdir(parents=True)
    (workspace / "answer.txt").write_text("42\n")
    view = build_view(agent, workspace=workspace)
    env = {"PATH": os.environ["PATH"], "HOME": str(agent / "home")}
    with verifier.active(mode, view, agent, work, env):
        ran = verifier.run(["/bin/sh", "-c", "cat answer.txt && echo done > checked.txt"],
                           cwd=workspace, timeout_s=60)
    assert (ran.returncode, ran.stdout) == (0, "42\n"), ran.stderr
    assert (workspace / "checked.txt").read_text() == "done\n"


@pytest.mark.parametrize("mode", ISOLATING_MODES)
def test_a_check_that_prints_without_end_is_read_bounded(tmp_path: Path, mode: str) -> None:
    """The agent's code that a check runs decides how much it prints (up to its folder's
    disk limit): the supervisor keeps the first and last 4 MiB of it and says how much it
    left out, rather than hold gigabytes in memory (the OOM killer would end the
    supervisor: an unscored infrastructure failure)."""
    from openforge.sandbox import bounded, verifier

    agent, work = tmp_path / "agent", tmp_path / "work"
    for folder in (agent / "home", agent / "workspace", work):
        folder.mkdir(parents=True)
    view = build_view(agent, workspace=agent / "workspace")
    env = {"PATH": os.environ["PATH"], "HOME": str(agent / "home")}
    flood = ("import sys\nsys.stdout.write('FIRST')\n"
             "for _ in range(12): sys.stdout.write('x' * (1 << 20))\nsys.stdout.write('LAST')")
    with verifier.active(mode, view, agent, work, env):
        ran = verifier.run([sys.executable, "-c", flood], cwd=agent / "workspace", timeout_s=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout_omitted == 5 + (12 << 20) + 4 - 2 * bounded.OUTPUT_KEEP
    assert ran.stdout.startswith("FIRSTxxx") and ran.stdout.endswith("xxxLAST")
    assert len(ran.stdout) < 2 * bounded.OUTPUT_KEEP + 200
    assert f"[openforge: {ran.stdout_omitted:,} bytes of verifier-0.stdout not read" \
        in ran.stdout


@pytest.mark.parametrize("mode", ISOLATING_MODES)
def test_a_hidden_folder_inside_a_mapped_one_is_empty_in_the_sandbox(
        tmp_path: Path, mode: str) -> None:
    """A plugin's answer keys ship inside its installed package, which the view maps with
    the Python paths: a hidden folder (`Environment.hidden_paths`) is empty in the sandbox
    (read-only), the rest of the package stays readable, and a link the agent leaves into
    it is scrubbed."""
    from openforge.sandbox import verifier

    package = tmp_path / "site-packages" / "plugin"
    (package / "tasks" / "t1").mkdir(parents=True)
    (package / "tasks" / "t1" / "task.yaml").write_text("expected: 42\n")
    (package / "code.py").write_text("x = 1\n")
    agent, work = tmp_path / "agent", tmp_path / "work"
    for folder in (agent / "home", agent / "workspace", work):
        folder.mkdir(parents=True)
    view = build_view(agent, workspace=agent / "workspace", data=[package.parent],
                      hidden=[package / "tasks"])
    assert view.hidden == [str((package / "tasks").resolve())]
    env = {"PATH": os.environ["PATH"], "HOME": str(agent / "home")}
    probe = (f"cat {package}/code.py; ls -A {package}/tasks; cat {package}/tasks/t1/task.yaml; "
             f"touch {package}/tasks/new 2>/dev/null || echo read-only")
    with verifier.active(mode, view, agent, work, env):
        seen = verifier.run(["/bin/sh", "-c", probe], cwd=agent / "workspace", timeout_s=60)
    assert seen.stdout.splitlines() == ["x = 1", "read-only"], (seen.stdout, seen.stderr)
    (agent / "workspace" / "answer.txt").symlink_to(package / "tasks" / "t1" / "task.yaml")
    assert [r.split(" -> ")[0] for r in scrub_agent(agent, view)] == [
        str(agent / "workspace" / "answer.txt")]


@pytest.mark.parametrize("mode", ISOLATING_MODES)
def test_an_ended_sandbox_keeps_its_namespace_number_while_it_is_swept(
        tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the harness ends, the sandbox's PID namespace is swept for leftovers by its
    number, and the kernel reuses the numbers of freed namespaces for new ones: the
    supervisor holds the namespace open through every sweep, so no concurrent rollout's
    sandbox (its agent's, its grader's) can be given that number and be killed for it."""
    from openforge.harness import Command
    from openforge.sandbox import agent

    def open_namespaces() -> set[str]:
        fds = Path("/proc/self/fd")
        links = {_readlink(fds / fd) for fd in os.listdir(fds)}
        return {link for link in links if link.startswith("pid:[")}

    held_during: list[bool] = []
    sweep = agent.ns_members

    def members(namespace: str) -> list[int]:
        held_during.append(namespace in open_namespaces())
        return sweep(namespace)

    monkeypatch.setattr(agent, "ns_members", members)
    workspace = tmp_path / "agent" / "workspace"
    workspace.mkdir(parents=True)
    view = build_view(tmp_path / "agent", workspace=workspace, programs=[], data=[],
                      protected=[])
    # `cat` waits for its stdin, which the supervisor feeds only once it holds the namespace:
    # a command that needs nothing (`true`) may end first on a loaded machine, and then there
    # is no namespace left to hold or sweep.
    exit_ = agent.run_agent(mode, Command(argv=["cat"], cwd=workspace, stdin="fed\n"),
                            env={"PATH": "/usr/bin:/bin"}, view=view, work_dir=tmp_path,
                            stdout=tmp_path / "out", stderr=tmp_path / "err", timeout_s=60,
                            trusted=set())
    assert exit_.returncode == 0, (tmp_path / "err").read_text()
    assert (tmp_path / "out").read_text() == "fed\n"
    assert held_during and all(held_during)
    assert not open_namespaces()  # and lets go of it after


def _readlink(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:  # not a link, or closed meanwhile (the listing's own descriptor)
        return ""


@pytest.mark.parametrize("mode", ISOLATING_MODES)
async def test_a_python_the_sandbox_cannot_map_is_an_infrastructure_failure_that_says_why(
        mode: str) -> None:
    """Rollouts made inside the Python environment itself (TMPDIR in the virtualenv, as nox's
    session tmp) put a protected folder inside the interpreter's prefix, which is then not
    mapped: an attempt whose harness runs on it is an infrastructure failure naming both,
    never a harness's "No such file" scored as the policy's."""
    if not os.access(sys.prefix, os.W_OK):
        pytest.skip(f"{sys.prefix} is not writable here")
    base = Path(tempfile.mkdtemp(prefix="openforge-rollouts-", dir=sys.prefix))
    try:
        executor = LocalExecutor(sandbox=mode, base_dir=base)
        # mini runs on this Python: in either mode its program is inside the prefix.
        spec = RolloutSpec(run_id="run", rollout_id="lost", task=Task(id="t", prompt="true"),
                           harness="mini",
                           environment="executor_plugins:OneTaskEnv", reward="checker",
                           gateway_url="http://127.0.0.1:9", session_token="tok",
                           session_id="sid")
        result = await executor.run(spec)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert result.status == "infra_error" and result.reward is None
    assert "the sandbox cannot map what the agent runs on" in (result.error or "")
    assert str(base) in (result.error or "")
