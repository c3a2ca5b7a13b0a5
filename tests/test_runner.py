"""The runner: the half-solving script scores 0.5, infra failures are retried and excluded,
an interrupted or killed run resumes to exactly k attempts per task."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import yaml

from openforge.config import EngineConfig, RunConfig
from openforge.runner import RunError, read_results, run_from_config
from openforge.sandbox import cgroups
from openforge.sandbox.modes import ISOLATING, resolve
from openforge.sandbox.relay import relay_parent
from openforge.store import Store

HERE = Path(__file__).parent
FULL = HERE / "demo_solutions.yaml"
HALF = HERE / "demo_half_solutions.yaml"
# How long a clean stop may take before the test calls it hung: a guard, not a bound on speed.
HANG_GUARD_S = 240


@pytest.fixture(autouse=True)
def _plugins_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(HERE))


def scripted(script: Path) -> EngineConfig:
    return EngineConfig(name="scripted", options={"script": str(script)})


def test_half_solutions_score_half(tmp_path: Path) -> None:
    summary = run_from_config(RunConfig(engine=scripted(HALF), runs_dir=tmp_path, concurrency=4))
    assert summary.metrics.pass_at[1] == 0.5
    assert summary.metrics.scored == 12 and summary.metrics.infra_failures == 0


def test_crashing_harness_is_retried_and_excluded(tmp_path: Path) -> None:
    config = RunConfig(engine=scripted(FULL), runs_dir=tmp_path, harness="executor_plugins:CrashHarness",
                       environment="executor_plugins:OneTaskEnv", k=2, max_infra_retries=2)
    summary = run_from_config(config)
    records = read_results(summary.run_dir)
    assert [r.status for r in records] == ["infra_error", "infra_error"]
    assert all(r.tries == 3 and len(set(r.session_ids)) == 3 and r.reward is None for r in records)
    assert summary.metrics.infra_failures == 2 and summary.metrics.scored == 0
    assert summary.metrics.pass_at == {}  # never counted as a 0 reward
    with Store(summary.run_dir / "store.sqlite") as store:
        assert len(store.list_sessions(summary.run_id)) == 6  # a new session per try
    report = json.loads((summary.run_dir / "report.json").read_text())
    assert report["summary"]["infra_failures"] == 2


def test_missing_harness_is_an_infra_failure(tmp_path: Path) -> None:
    config = RunConfig(engine=scripted(FULL), runs_dir=tmp_path, harness="executor_plugins:MissingHarness",
                       environment="executor_plugins:OneTaskEnv", max_infra_retries=0)
    records = read_results(run_from_config(config).run_dir)
    assert records[0].status == "infra_error" and "not installed" in (records[0].error or "")


def test_unknown_task_and_bad_resume_dir(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="unknown task id"):
        run_from_config(RunConfig(engine=scripted(FULL), runs_dir=tmp_path, tasks=["nope"]))
    with pytest.raises(RunError, match="not a run directory"):
        run_from_config(RunConfig(), resume=tmp_path)


def _gated_script(tmp_path: Path) -> Path:
    """The full solutions, each rollout first waiting for its gate (`_open_next_gate`): a
    rollout cannot finish before the test lets it, so when the test interrupts or kills the
    runner is decided by the test, never by how fast the machine is."""
    gates = tmp_path / "gates"
    gates.mkdir(exist_ok=True)
    # The rollout's directory is <base>/<name>/agent/workspace: its gate is gates/<name>.
    # It says it waits in its workspace (`_wait_for_a_waiting_rollout`).
    wait = (f'name=$(basename "$(dirname "$(dirname "$PWD")")"); touch .waiting; '
            f'until [ -e {gates}/all ] || [ -e "{gates}/$name" ]; do sleep 0.05; done')
    entries = yaml.safe_load(FULL.read_text())
    for entry in entries:
        entry["replies"].insert(0, {"tool_calls": [{"name": "shell",
                                                    "arguments": {"command": wait}}]})
    script = tmp_path / "gated.yaml"
    script.write_text(yaml.safe_dump(entries))
    return script


def _start_run(tmp_path: Path, resume: Path | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "openforge.cli", "run"]
    if resume is not None:
        argv += ["--resume", str(resume)]
    else:
        argv += ["--engine", "scripted", "--script", str(_gated_script(tmp_path)),
                 "--runs-dir", str(tmp_path / "runs"),
                 "-k", "2", "--limit", "2", "--concurrency", "1",
                 "--set", f"executor_options.base_dir={tmp_path / 'sandboxes'}"]
    # The gates' folder on the Python path: an isolated rollout sees the Python paths
    # (read-only, as mounts: a gate opened later shows), not the test's /tmp.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(tmp_path / "gates")])}
    # Ctrl-C as a terminal sends it: with SIGINT's default disposition, which a runner started
    # from a background job (whose shell ignores SIGINT, and so would it) does not have.
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _open_next_gate(tmp_path: Path, proc: subprocess.Popen[str]) -> None:
    """Let the rollout running now (concurrency 1: the only rollout directory whose gate is
    closed) go on; wait for it to start if none is running yet."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        for rollout in (tmp_path / "sandboxes").glob("*/agent"):
            gate = tmp_path / "gates" / rollout.parent.name
            if not gate.exists():
                gate.touch()
                return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("no rollout started in time")


def _wait_for_results(tmp_path: Path, lines: int, proc: subprocess.Popen[str]) -> Path:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        for path in (tmp_path / "runs").glob("*/results.jsonl"):
            if len(path.read_text().splitlines()) >= lines:
                return path.parent
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError("the run produced no results in time")


def _wait_for_a_waiting_rollout(tmp_path: Path, proc: subprocess.Popen[str]) -> None:
    """Wait until a rollout's agent runs (its sandbox is set up, in its cgroup) and waits at
    its closed gate."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if any(not (tmp_path / "gates" / said.parents[2].name).exists()
               for said in (tmp_path / "sandboxes").glob("*/agent/workspace/.waiting")):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("no rollout started in time")


def _cgroups_of(runner_pid: int) -> list[str]:
    """The rollout cgroups the runner with this pid made, in every hierarchy."""
    return sorted(path.name for where in cgroups.hierarchies().values()
                  for path in where.own.glob(f"openforge-*.{runner_pid}.*"))


def _assert_complete(run_dir: Path, tasks: int = 2, k: int = 2) -> None:
    records = read_results(run_dir)
    counts = Counter(r.task_id for r in records)
    assert len(counts) == tasks and set(counts.values()) == {k}
    assert len({(r.task_id, r.attempt) for r in records}) == tasks * k
    report = json.loads((run_dir / "report.json").read_text())
    assert all(row["n"] == k for row in report["tasks"])
    assert report["pass_at_k"]["1"] == 1.0


def _leftovers(tmp_path: Path) -> list[psutil.Process]:
    marker = str(tmp_path / "sandboxes")
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_interrupted_then_killed_run_resumes_to_exactly_k_attempts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 1. Ctrl-C: a clean stop, exit 130, and the command to resume.
    # Each rollout waits at its gate until the test opens it: one finishes, the next waits.
    proc = _start_run(tmp_path)
    _open_next_gate(tmp_path, proc)
    run_dir = _wait_for_results(tmp_path, 1, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 130, err
    assert f"openforge run --resume {run_dir}" in " ".join(err.split()) and "Traceback" not in err
    after_interrupt = len(read_results(run_dir))
    assert after_interrupt == 1

    # 2. Resume, then SIGKILL the resumed runner while a rollout waits: no clean-up code
    # runs at all.
    proc = _start_run(tmp_path, resume=run_dir)
    _open_next_gate(tmp_path, proc)
    _wait_for_results(tmp_path, after_interrupt + 1, proc)
    _wait_for_a_waiting_rollout(tmp_path, proc)
    left_behind = _cgroups_of(proc.pid)
    # Its folders on disk: the waiting rollout's, and (isolated) its supervisor's relay's.
    supervisors = [child.pid for child in psutil.Process(proc.pid).children()]
    folders = sorted((tmp_path / "sandboxes").glob(f"openforge-*.{proc.pid}.*"))
    relays = [path for pid in supervisors
              for path in relay_parent().glob(f"openforge-*.{pid}.*-relay-*")]
    assert len(folders) == 1
    assert len(relays) == (1 if resolve("auto") in ISOLATING else 0)
    proc.kill()
    proc.communicate()
    deadline = time.monotonic() + 10
    while _leftovers(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftovers(tmp_path) == []  # the sandboxes died with their parent
    after_kill = len(read_results(run_dir))
    assert after_interrupt < after_kill

    # The killed runner's rollout cgroup (where this machine lets a runner make one; one
    # name, in the pids and, where it can be made, the cpu hierarchy) stays until the next
    # executor is made, which removes it.
    assert _cgroups_of(proc.pid) == left_behind
    assert len(set(left_behind)) == (0 if cgroups.unavailable(["processes"]) else 1)
    assert len(left_behind) == len(set(left_behind)) * (1 if cgroups.unavailable(["cpu"]) else 2)
    # So do its folders (the relay's, in the shared temporary folder, may go sooner: any
    # executor made meanwhile removes it).
    assert all(path.is_dir() for path in folders)

    # 3. Resume to the end: only the missing attempts run, each task has exactly k.
    # A SIGKILL can tear the last line mid-write: it must be skipped, not glued to the next.
    with open(run_dir / "results.jsonl", "a") as f:
        f.write('{"task_id": "torn", "attem')
    (tmp_path / "gates" / "all").touch()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), str(tmp_path / "gates")]))
    summary = run_from_config(RunConfig(), resume=run_dir)
    assert summary.attempts_run == 4 - after_kill
    _assert_complete(run_dir)
    assert os.path.exists(run_dir / "report.html")
    assert _cgroups_of(proc.pid) == []
    assert [path for path in folders + relays if os.path.lexists(path)] == []
    # The killed runner's tries died with it: their sessions were closed on resume.
    with Store(run_dir / "store.sqlite") as store:
        assert [s.id for s in store.list_sessions(summary.run_id) if s.status == "open"] == []


def test_progress_line_says_what_the_executor_waits_for(tmp_path: Path) -> None:
    from openforge.executors.local import LocalExecutor
    from openforge.runner import Runner

    class Waiting(LocalExecutor):
        def progress(self) -> str:
            return "2 waiting for quota"

    runner = Runner(RunConfig(engine=scripted(FULL), runs_dir=tmp_path), tmp_path)
    assert runner._stats(Waiting(sandbox="none")) == \
        "pass - of 0 scored  plugin errors 0  infra failures 0  (2 waiting for quota)"
    assert runner._stats(LocalExecutor(sandbox="none")) == \
        "pass - of 0 scored  plugin errors 0  infra failures 0"
