"""The local executor: results only from a live, honest supervisor; hard timeouts with no
survivors; crashes; the scrubbed environment; cancellation; every sandbox mode."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from sandbox_modes import ALL_MODES, ISOLATING_MODES

from openforge.executors.local import LocalExecutor, LocalExecutorError, LocalOptions
from openforge.executors.process import (
    end_and_reap,
    exited,
    reap_adopted,
    reap_children,
    signal_members,
    wait_exited,
    wait_gone,
)
from openforge.options import OptionsError
from openforge.sandbox.protocol import new_result_key, result_line, scrub_env
from openforge.types import RewardResult, RolloutResult, RolloutSpec, Task

TESTS_DIR = str(Path(__file__).parent)


@pytest.fixture(autouse=True)
def _plugins_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", TESTS_DIR)


def make_spec(harness: str, env: str = "executor_plugins:OneTaskEnv", timeout_s: float = 30.0,
              rollout_id: str = "r1", prompt: str = "p", **env_options: object) -> RolloutSpec:
    return RolloutSpec(run_id="run", rollout_id=rollout_id, task=Task(id="only", prompt=prompt),
                       harness=f"executor_plugins:{harness}", environment=env,
                       environment_options=env_options, reward="checker",
                       gateway_url="http://127.0.0.1:9", session_token=f"tok-{rollout_id}",
                       session_id=f"sid-{rollout_id}", timeout_s=timeout_s)


def recorded_pids(base: Path) -> list[int]:
    files = list(base.glob("*/agent/workspace/pids.txt"))
    assert files, "the rollout never recorded its pids"
    return [int(p) for p in files[0].read_text().split()]


def leftovers(where: Path) -> list[psutil.Process]:
    """Live processes of the rollouts under `where`: started there (their working directory)
    or naming it on their command line (other test runs on this machine are not ours)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.cwd().startswith(str(where)) or str(where) in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("mode", ALL_MODES)
async def test_ok_rollout_reports_its_result(tmp_path: Path, mode: str) -> None:
    executor = LocalExecutor(sandbox=mode, base_dir=tmp_path)
    result = await executor.run(make_spec("OkHarness"))
    assert result.status == "ok", result.error
    assert result.reward is not None and result.reward.passed
    assert result.final_answer == "all done"
    assert result.sandbox == mode and result.session_id == "sid-r1"
    assert list(tmp_path.iterdir()) == []  # the rollout directory was removed


async def test_a_watch_that_cannot_start_du_leaves_the_rollout_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """`du` that cannot be started (the machine out of processes) is no fault of the agent's:
    the rollout runs to its end and is scored, and the runner's log says the watch failed."""
    async def no_du(folder: Path) -> object:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr("openforge.sandbox.disk.usage", no_du)
    result = await LocalExecutor(sandbox="none", base_dir=tmp_path).run(make_spec("OkHarness"))
    assert result.status == "ok", result.error
    assert result.reward is not None and result.reward.passed and result.limits_reached == {}
    assert "the watch of a rollout's folder failed ([Errno 11] Resource temporarily " \
        "unavailable); the rollout goes on without it" in caplog.text


@pytest.mark.parametrize("mode", ALL_MODES)
async def test_hanging_harness_is_killed_with_all_descendants(tmp_path: Path, mode: str) -> None:
    executor = LocalExecutor(sandbox=mode, base_dir=tmp_path, keep_dirs=True)
    result = await executor.run(make_spec("HangHarness", timeout_s=3))
    assert result.status == "timeout"
    assert result.reward is None
    assert len(recorded_pids(tmp_path)) == 3
    if mode == "none":
        assert wait_gone(recorded_pids(tmp_path)) == []
    assert leftovers(tmp_path) == []  # in a PID namespace the recorded pids are its own


@pytest.mark.parametrize("mode", ALL_MODES)
async def test_orphans_without_markers_are_ended_and_counted(tmp_path: Path, mode: str) -> None:
    result = await LocalExecutor(sandbox=mode, base_dir=tmp_path).run(make_spec("OrphansHarness"))
    assert result.status == "ok", result.error
    assert result.harness_output["ended_processes"] == 2
    assert [p for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [])[:2] in (["sleep", "7013"], ["sleep", "7014"])] == []


async def test_hanging_rollout_is_killed_by_the_hard_timeout(tmp_path: Path) -> None:
    executor = LocalExecutor(sandbox="none", base_dir=tmp_path, keep_dirs=True,
                             kill_margin_s=0.5, grace_s=0.5)
    result = await executor.run(make_spec("OkHarness", env="executor_plugins:HangInPrepareEnv",
                                          timeout_s=2))
    assert result.status == "timeout"
    assert "hard timeout" in (result.error or "")
    assert wait_gone(recorded_pids(tmp_path)) == []


async def test_crashing_harness_is_an_infra_error(tmp_path: Path) -> None:
    result = await LocalExecutor(sandbox="none", base_dir=tmp_path).run(make_spec("CrashHarness"))
    assert result.status == "infra_error"
    assert result.is_infra_failure and result.reward is None


@pytest.mark.parametrize("mode", ALL_MODES)
async def test_a_program_that_cannot_start_is_an_infra_error(tmp_path: Path, mode: str) -> None:
    result = await LocalExecutor(sandbox=mode, base_dir=tmp_path).run(make_spec("NoProgramHarness"))
    assert result.status == "infra_error" and result.reward is None
    assert (result.error or "").startswith(
        "starting the harness failed: cannot run /nonexistent/agent-program: No such file")


async def test_failing_harness_is_scored(tmp_path: Path) -> None:
    result = await LocalExecutor(sandbox="none", base_dir=tmp_path).run(make_spec("FailHarness"))
    assert result.status == "harness_error"
    assert result.reward is not None and result.reward.score == 0.0


async def test_a_reward_that_raises_is_a_plugin_error(tmp_path: Path) -> None:
    result = await LocalExecutor(sandbox="none", base_dir=tmp_path).run(
        make_spec("OkHarness", env="executor_plugins:RaisingEnv"))
    assert result.status == "plugin_error" and not result.is_retried and not result.is_scored
    assert result.error == ("reward 'checker' raised ZeroDivisionError: a bug in the checker "
                            "while scoring (score)")


async def test_a_supervisor_that_dies_without_a_result(tmp_path: Path) -> None:
    executor = LocalExecutor(sandbox="none", base_dir=tmp_path, python="/bin/false")
    result = await executor.run(make_spec("OkHarness"))
    assert result.status == "infra_error"
    assert (result.error or "").startswith("rollout supervisor died: exit code 1")


def _zombie(proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """`proc` once it has exited and is not yet waited for."""
    while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.01)
    return proc


async def test_a_dead_supervisors_cleanup_leaves_the_runners_own_children_alone(
        tmp_path: Path) -> None:
    # The runner's own commands (the disk watch's du, a plugin's) are waited for elsewhere:
    # reaping one steals its exit status (subprocess then reports 0 for a failed command),
    # ending one fails it. Only a dead supervisor's orphans are the cleanup's.
    failed = _zombie(subprocess.Popen(["sh", "-c", "exit 3"]))
    running = subprocess.Popen(["sleep", "30"])
    try:
        executor = LocalExecutor(sandbox="none", base_dir=tmp_path, python="/bin/false")
        result = await executor.run(make_spec("OkHarness"))
        assert result.status == "infra_error"  # its supervisor died: the cleanup ran
        assert failed.wait() == 3
        assert running.poll() is None
    finally:
        running.kill()
        running.wait()


def test_reaping_takes_adopted_zombies_and_leaves_this_processs_own() -> None:
    own = _zombie(subprocess.Popen(["sh", "-c", "exit 3"]))
    # Standing in for an adopted orphan: a child in a session of its own, as an agent's is.
    other = _zombie(subprocess.Popen(["sh", "-c", "exit 4"], start_new_session=True))
    reap_children()
    assert own.wait() == 3
    with pytest.raises(ChildProcessError):
        os.waitpid(other.pid, os.WNOHANG)


def test_ending_a_tree_leaves_its_leaders_exit_status_to_its_owner() -> None:
    # kill_tree once reaped the leader itself: Popen then read exit status 0 whatever the
    # process had returned, and a killed supervisor looked like one that had succeeded.
    exited = _zombie(subprocess.Popen(["sh", "-c", "exit 3"], start_new_session=True))
    running = subprocess.Popen(["sleep", "30"], start_new_session=True)
    assert end_and_reap(exited, grace_s=1.0) == 3
    assert end_and_reap(running, grace_s=1.0) == -signal.SIGTERM


def _take_pid(pid: int, argv: list[str]) -> subprocess.Popen[bytes]:
    """Start `argv` (in a session of its own) with the freed `pid`, as chance does on a
    busy machine: the kernel's next pid is set to hand it over. Skips where it cannot be."""
    for _ in range(20):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError as exc:
            pytest.skip(f"the next pid cannot be chosen here: {exc}")
        taker = subprocess.Popen(argv, start_new_session=True)
        if taker.pid == pid:
            return taker
        taker.kill()
        taker.wait()
    pytest.skip("another process took the pid each time")


def test_a_reaped_process_is_never_killed_by_the_pid_it_had() -> None:
    # A reaped process's pid (and its group's) can go to a new process at once: on a
    # busy runner, another rollout's supervisor.
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    taker = _take_pid(gone.pid, ["sleep", "30"])
    try:
        assert end_and_reap(gone, grace_s=1.0) == 0
        assert taker.poll() is None
    finally:
        taker.kill()
        taker.wait()


def test_a_signal_to_a_scans_members_never_reaches_a_new_owner_of_a_pid() -> None:
    # The first look finds a member that then ends and is reaped; its pid goes to an
    # outsider before the signal. The second look (through pidfds) no longer lists it.
    member = subprocess.Popen(["sleep", "30"], start_new_session=True)
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    taker = _take_pid(gone.pid, ["sleep", "30"])
    try:
        assert signal_members([member.pid, gone.pid], lambda: [member.pid],
                              signal.SIGKILL) == {member.pid}
        assert member.wait(timeout=5) == -signal.SIGKILL
        assert taker.poll() is None
    finally:
        for proc in (member, taker):
            proc.kill()
            proc.wait()


def test_reaping_adopted_orphans_leaves_a_new_owner_of_their_pid_its_exit_status() -> None:
    # An orphan found, then reaped elsewhere (another rollout's sweep); its pid goes to a
    # process that exits 5. Reaping what was found must not take that 5 from its owner.
    gone = subprocess.Popen(["true"], start_new_session=True)
    found = psutil.Process(gone.pid)
    gone.wait()
    # The kernel hands pids out in turn: one comes back only after the counter went all
    # the way round, never within the clock tick that start times are counted in.
    time.sleep(2 / os.sysconf("SC_CLK_TCK"))
    taker = _take_pid(gone.pid, ["sh", "-c", "exit 5"])
    assert wait_exited(taker, 5.0)
    reap_adopted([found])
    assert taker.wait(timeout=5) == 5


async def test_waiting_for_a_supervisor_leaves_it_unreaped_until_its_tree_is_ended() -> None:
    proc = subprocess.Popen(["sh", "-c", "exit 4"], start_new_session=True)
    await exited(proc)
    assert psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE  # its pid still held
    assert end_and_reap(proc) == 4


def _collect(executor: LocalExecutor, tmp_path: Path, stdout: str, key: bytes,
             returncode: int = 0) -> RolloutResult:
    out = tmp_path / "out"
    out.write_text(stdout)
    return executor._collect(make_spec("OkHarness"), out, tmp_path / "none", key, returncode,
                             False, 1.0)


def test_only_the_supervisors_signed_last_line_for_this_attempt_is_taken(tmp_path: Path) -> None:
    executor = LocalExecutor(sandbox="none")
    key = new_result_key()
    forged = RolloutResult(rollout_id="r1", task_id="only", session_id="sid-r1", status="ok",
                           reward=RewardResult(score=1.0, passed=True))
    assert _collect(executor, tmp_path, result_line(forged, key), key).status == "ok"
    refused = {
        "unsigned": result_line(forged),
        "another key": result_line(forged, new_result_key()),
        "not last": result_line(forged, key) + "\nmore output",
        "another session": result_line(forged.model_copy(update={"session_id": "x"}), key),
        "another rollout": result_line(forged.model_copy(update={"rollout_id": "r2"}), key),
        "another attempt": result_line(forged.model_copy(update={"attempt": 3}), key),
    }
    for why, text in refused.items():
        result = _collect(executor, tmp_path, text, key)
        assert result.status == "infra_error" and result.reward is None, why
        assert (result.error or "").startswith("rollout supervisor died: "), why
    # A valid, signed line from a supervisor that was killed afterwards: not taken either.
    killed = _collect(executor, tmp_path, result_line(forged, key), key, returncode=-9)
    assert killed.status == "infra_error"
    assert "rollout supervisor died: killed by signal SIGKILL" in (killed.error or "")


def test_a_result_line_before_the_supervisors_is_a_forgery(tmp_path: Path) -> None:
    executor = LocalExecutor(sandbox="none")
    key = new_result_key()
    honest = RolloutResult(rollout_id="r1", task_id="only", session_id="sid-r1", status="ok",
                           reward=RewardResult(score=1.0, passed=True), final_answer="done")
    # What an agent without isolation writes into the supervisor's stdout, before its line.
    forged = result_line(honest.model_copy(update={"final_answer": "forged"}))
    result = _collect(executor, tmp_path, f"{forged}\n\n{result_line(honest, key)}", key)
    assert result.status == "violation" and not result.is_retried
    assert result.reward is not None and (result.reward.score, result.reward.passed) == (0.0, False)
    assert result.reward.details["violation"] == "forged result line"
    assert (result.error or "").startswith(
        "violation: forged result line in the supervisor's stdout: OPENFORGE_RESULT {")
    assert result.final_answer == "done"  # the rest is the supervisor's
    # Other output before the supervisor's line is nobody's business.
    plain = _collect(executor, tmp_path, f"a log line\n{result_line(honest, key)}", key)
    assert plain.status == "ok" and plain.reward == honest.reward


async def test_the_agent_writing_into_the_supervisors_stdout_is_seen(tmp_path: Path) -> None:
    # Without isolation the agent can open its supervisor's stdout through /proc; the file is
    # appended to, so the supervisor's own last line does not overwrite what it wrote.
    script = ("p=$PPID; while ! grep -q openforge.rollout /proc/$p/cmdline; do "
              "p=$(awk '{print $4}' /proc/$p/stat); done; "
              "echo 'OPENFORGE_RESULT {\"status\": \"ok\"}' >> /proc/$p/fd/1; echo ok > ok.txt")
    result = await LocalExecutor(sandbox="none", base_dir=tmp_path).run(
        make_spec("ShellHarness", prompt=script))
    assert result.status == "violation", result.error
    assert (result.error or "").startswith("violation: forged result line in the supervisor's "
                                           'stdout: OPENFORGE_RESULT {"status": "ok"}')


@pytest.mark.parametrize("mode", ALL_MODES)
async def test_env_is_scrubbed_and_home_isolated(tmp_path: Path, mode: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    real_home = tmp_path / "real-home"
    real_home.mkdir()
    for name, value in {"FAKE_API_KEY": "sk-secret", "GITHUB_TOKEN": "ghp", "AWS_REGION": "x",
                        "AWS_SECRET_ACCESS_KEY": "y", "OPENFORGE_API_KEY": "z",
                        "OPENFORGE_VISIBLE": "yes", "LC_GITHUB_PAT": "ghp_x", "DB_PASS": "pw",
                        "HOME": str(real_home), "LC_ALL": "C.UTF-8"}.items():
        monkeypatch.setenv(name, value)
    base = tmp_path / "rollouts"
    executor = LocalExecutor(sandbox=mode, base_dir=base, keep_dirs=True)
    result = await executor.run(make_spec("EnvDumpHarness"))
    assert result.status == "ok", result.error
    env = json.loads(next(base.glob("*/agent/workspace/env.json")).read_text())
    for secret in ("FAKE_API_KEY", "GITHUB_TOKEN", "AWS_REGION", "AWS_SECRET_ACCESS_KEY",
                   "OPENFORGE_API_KEY", "OPENFORGE_VISIBLE", "LC_GITHUB_PAT", "DB_PASS"):
        assert secret not in env
    assert env["LC_ALL"] == "C.UTF-8"
    agent_dir = next(base.iterdir()) / "agent"
    assert env["HOME"] == str(agent_dir / "home")
    for xdg in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "TMPDIR"):
        assert env[xdg].startswith(str(agent_dir))
    assert (agent_dir / "home" / "marker").exists()
    assert list(real_home.iterdir()) == []


def test_scrub_env_is_an_allowlist_of_exact_names() -> None:
    env = scrub_env({"PATH": "/bin", "HOME": "/root", "OPENAI_API_KEY": "k", "OPENFORGE_TOKEN": "t",
                     "OPENFORGE_X": "1", "LC_CTYPE": "C", "LC_MY_PAT": "p", "SSH_AUTH_SOCK": "/s",
                     "TZ": "UTC", "OPENFORGE_CACHE": "/c", "MY_PASSWORD": "p"})
    assert env == {"PATH": "/bin", "LC_CTYPE": "C", "TZ": "UTC", "OPENFORGE_CACHE": "/c"}
    assert scrub_env({"DISPLAY": ":1", "X_TOKEN": "t"}, ["DISPLAY", "X_TOKEN"]) == {
        "DISPLAY": ":1", "PATH": os.defpath}


def test_pass_env_refuses_credential_names() -> None:
    assert LocalOptions(pass_env=["DISPLAY"]).pass_env == ["DISPLAY"]
    with pytest.raises(OptionsError, match="option pass_env: .*HF_TOKEN look like credentials"):
        LocalExecutor(pass_env=["DISPLAY", "HF_TOKEN"])


async def test_cancellation_kills_the_rollout(tmp_path: Path) -> None:
    executor = LocalExecutor(sandbox="none", base_dir=tmp_path, keep_dirs=True)
    task = asyncio.create_task(executor.run(make_spec("HangHarness", timeout_s=120)))
    for _ in range(400):
        if list(tmp_path.glob("*/agent/workspace/pids.txt")):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # the pid line is written in one go; let it land
    pids = recorded_pids(tmp_path)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert wait_gone(pids) == []
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("mode", ISOLATING_MODES)
async def test_code_under_tmp_stays_importable(tmp_path: Path, mode: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # e.g. a plugin installed with `pip install --target /tmp/x`: the private /tmp must not hide it
    code = tmp_path / "plugin-code"
    code.mkdir()
    (code / "tmp_plugin.py").write_text(
        "import sys\nfrom executor_plugins import _Script\n"
        "class TmpHarness(_Script):\n"
        "    script = 'import tmp_plugin; open(\"ok.txt\", \"w\").write(\"ok\"); print(\"all done\")'\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS_DIR, str(code)]))
    spec = make_spec("OkHarness").model_copy(update={"harness": "tmp_plugin:TmpHarness"})
    result = await LocalExecutor(sandbox=mode, base_dir=tmp_path / "rollouts").run(spec)
    assert result.status == "ok", result.error


def test_describe_sandbox_names_the_mode_and_warns_without_isolation() -> None:
    text = LocalExecutor(sandbox="none").describe_sandbox()
    assert text.startswith("sandbox: none. WARNING: rollouts run WITHOUT isolation")
    assert os.path.exists(LocalExecutor(sandbox="none").options.python)


@pytest.mark.parametrize("mode", ISOLATING_MODES)
def test_the_header_and_the_supervisor_get_the_size_of_the_private_tmp(mode: str) -> None:
    executor = LocalExecutor(sandbox=mode)
    assert "view, private /tmp and /dev/shm of 2 GiB each, own PID namespace" \
        in executor.describe_sandbox()
    assert "--tmp-max 2147483648" in " ".join(executor._argv(Path("/r"), Path("/s"), None))
    executor = LocalExecutor(sandbox=mode, tmp_max=None)
    assert "view, private /tmp, own PID namespace" in executor.describe_sandbox()
    assert "--tmp-max" not in executor._argv(Path("/r"), Path("/s"), None)
    # Without isolation /tmp is the host's: there is nothing to size.
    assert "--tmp-max" not in LocalExecutor(sandbox="none")._argv(Path("/r"), Path("/s"), None)


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr("openforge.sandbox.modes.bwrap_path", lambda: None)
    yield


def test_auto_falls_back_to_namespaces_then_none(no_bwrap: None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("openforge.sandbox.modes.namespaces_available", lambda: True)
    assert LocalExecutor().mode == "namespaces"
    monkeypatch.setattr("openforge.sandbox.modes.namespaces_available", lambda: False)
    assert LocalExecutor().mode == "none"
    with pytest.raises(LocalExecutorError, match="bubblewrap is not installed"):
        LocalExecutor(sandbox="bwrap")
