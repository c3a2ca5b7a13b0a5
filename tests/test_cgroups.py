"""A rollout's cgroup (openforge.sandbox.cgroups): real cgroups of this machine, made, joined,
limited, emptied and removed; and what the local executor does where none can be made.
The runs through every sandbox mode are in test_adversarial.py (`forkbomb`, `hog`)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from attack_programs import FORK_LOOP

from openforge.executors.local import LocalExecutor, LocalExecutorError
from openforge.harness import Command
from openforge.sandbox import cgroups, leftovers
from openforge.sandbox.agent import run_agent
from openforge.sandbox.cgroups import RolloutCgroup, joiner
from openforge.sandbox.modes import bwrap_path
from openforge.sandbox.view import View

NO_CGROUPS = cgroups.unavailable(["processes", "memory"])
needs_cgroups = pytest.mark.skipif(NO_CGROUPS is not None,
                                   reason=f"no cgroup this user can make: {NO_CGROUPS}")

# Forks until refused (at most 500 times), each child asleep with its output closed; prints
# how many it made.
FORKS = FORK_LOOP % {"tries": 500, "who": "FORKS"}


@needs_cgroups
def test_a_rollout_cgroup_bounds_what_starts_in_it_and_goes_without_a_trace() -> None:
    group = RolloutCgroup.create("test-forks", max_processes=12)
    [(path, _)] = group.dirs.values()
    try:
        out = subprocess.run([sys.executable, "-c", FORKS], capture_output=True, text=True,
                             preexec_fn=joiner(group.procs_files), timeout=120)
        forked = int(out.stdout.removeprefix("FORKS forked "))
        assert 0 < forked < 12  # the python itself is one of the 12
        assert group.hits().processes >= 1
        assert len(group.members()) == forked  # its children live on, asleep, in the cgroup
    finally:
        hits, ended = group.close()
    assert hits.as_dict()["processes"] >= 1 and ended == forked
    assert not path.exists() and group.dirs == {}


@needs_cgroups
def test_a_process_past_the_memory_limit_is_ended_and_counted() -> None:
    group = RolloutCgroup.create("test-memory", memory_max=64 << 20)
    try:
        ran = subprocess.run([sys.executable, "-c", "b = bytearray(512 << 20)\n"
                              "for i in range(0, len(b), 4096): b[i] = 1\nprint('survived')"],
                             capture_output=True, text=True, timeout=120,
                             preexec_fn=joiner(group.procs_files))
        assert ran.returncode == -9 and "survived" not in ran.stdout
    finally:
        hits, _ = group.close()
    assert hits.memory >= 1


NO_CPU_CGROUP = cgroups.unavailable(["cpu"])
needs_cpu_cgroup = pytest.mark.skipif(NO_CPU_CGROUP is not None,
                                      reason=f"no cpu cgroup this user can make: {NO_CPU_CGROUP}")

# Two processes busy for 1.5 s of wall time: they want 3 CPU-seconds.
SPIN = ("import os, time\nend = time.monotonic() + 1.5\nos.fork()\n"
        "while time.monotonic() < end: pass")


@needs_cpu_cgroup
def test_cpu_max_holds_all_the_rollouts_processes_to_their_quota_together() -> None:
    group = RolloutCgroup.create("test-cpu", cpu_max=0.2)
    [(path, version)] = group.dirs.values()
    try:
        quota = (path / ("cpu.cfs_quota_us" if version == 1 else "cpu.max")).read_text().split()
        assert quota[0] == "20000"  # a fifth of each 100 ms period
        subprocess.run([sys.executable, "-c", SPIN], check=True, timeout=120,
                       preexec_fn=joiner(group.procs_files))
        # Wanting 15 times their quota, they waited in most of the periods they ran in.
        assert group.hits().cpu >= 1
    finally:
        hits, _ = group.close()
    assert hits.as_dict()["cpu"] >= 1 and not path.exists()


@needs_cpu_cgroup
def test_a_cpu_share_alone_makes_a_cgroup_without_a_quota() -> None:
    group = RolloutCgroup.create("test-share", max_processes=20, cpu_share=True)
    try:
        assert set(group.dirs) == {"pids", "cpu"}
        path, version = group.dirs["cpu"]
        quota = (path / ("cpu.cfs_quota_us" if version == 1 else "cpu.max")).read_text().split()
        assert quota[0] in ("-1", "max")  # no cap: its processes only weigh as one
        ran = subprocess.run(["cat", "/proc/self/cgroup"], capture_output=True, text=True,
                             check=True, preexec_fn=joiner(group.procs_files))
        assert path.name in ran.stdout
    finally:
        group.close()
    assert not path.exists()


def test_a_sandbox_that_cannot_join_its_cgroup_does_not_start(tmp_path: Path) -> None:
    gone = tmp_path / "removed-cgroup" / "cgroup.procs"
    exit_ = run_agent("none", Command(argv=["true"]), env={}, view=View(binds=[]),
                      work_dir=tmp_path, stdout=tmp_path / "out", stderr=tmp_path / "err",
                      timeout_s=30, trusted=set(), cgroups=[str(gone)])
    assert exit_.returncode is None
    assert exit_.setup_error is not None
    assert exit_.setup_error.startswith("cannot start true in the rollout's cgroup")


def test_without_cgroups_the_default_limit_is_left_out_and_an_explicit_one_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups, "hierarchies", dict)  # a machine with no cgroup to use
    executor = LocalExecutor(sandbox="none")
    assert executor.limits == {}
    assert executor.describe_sandbox().startswith("sandbox: none. WARNING")
    assert "guarantees. No process limit per rollout (no cgroup hierarchy of this process " \
        "has the pids controller" in executor.describe_sandbox()
    for option, value in (("max_processes", 100), ("memory_max", "1GiB"), ("cpu_max", 1.5)):
        with pytest.raises(LocalExecutorError) as refused:
            LocalExecutor(sandbox="none", **{option: value})
        assert str(refused.value).startswith(f"executor option {option}: no cgroup hierarchy")
        assert f"set {option} to null to run without the limit" in str(refused.value)
    quiet = LocalExecutor(sandbox="none", max_processes=None)
    assert not quiet.cpu_share and "cgroup" not in quiet.describe_sandbox()  # nothing asked


# A runner that makes a rollout cgroup, starts a sleeper in it (in a session of its own, so
# it outlives the runner), says both, then waits for a line: killed, it never removes them.
RUNNER = """
import subprocess, sys
from openforge.sandbox.cgroups import RolloutCgroup, joiner
group = RolloutCgroup.create("sweep-me", max_processes=20)
sleeper = subprocess.Popen(["sleep", "600"], preexec_fn=joiner(group.procs_files),
                           start_new_session=True)
[(path, _)] = group.dirs.values()
print(path, sleeper.pid, flush=True)
sys.stdin.readline()
group.close()
"""


@needs_cgroups
def test_the_cgroups_a_killed_runner_left_are_swept_and_a_live_runners_kept() -> None:
    [where] = {h.own for h in cgroups.hierarchies().values() if h.controller == "pids"}
    namespace, pid, start = leftovers.maker_tag(os.getpid()).split(".")
    # This process's pid with another start time: a runner gone, its pid reused.
    reused = where / f"openforge-{namespace}.{pid}.{int(start) + 1}-reused-0"
    # A runner in another PID namespace: its pid cannot be checked from here.
    elsewhere = where / f"openforge-{int(namespace) + 1}.1.1-elsewhere-0"
    killed, live = (subprocess.Popen([sys.executable, "-c", RUNNER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True) for _ in range(2))
    try:
        assert killed.stdout is not None and live.stdout is not None
        killed_path, sleeper = killed.stdout.readline().split()
        live_path, _ = live.stdout.readline().split()
        killed.kill()
        killed.wait()
        for path in (reused, elsewhere):
            path.mkdir()
        assert Path(killed_path).exists() and psutil.pid_exists(int(sleeper))

        removed = cgroups.sweep()

        assert {Path(killed_path).name, reused.name} <= set(removed)
        assert not Path(killed_path).exists() and not reused.exists()
        assert not psutil.pid_exists(int(sleeper)) or \
            psutil.Process(int(sleeper)).status() == psutil.STATUS_ZOMBIE
        assert Path(live_path).exists() and elsewhere.exists()
        assert Path(live_path).name not in removed and elsewhere.name not in removed
    finally:
        for path in (reused, elsewhere):
            with contextlib.suppress(FileNotFoundError):
                path.rmdir()
        killed.kill()
        live.communicate("\n", timeout=60)
    assert not Path(live_path).exists()


@needs_cgroups
@needs_cpu_cgroup
def test_the_runs_header_says_the_limits() -> None:
    executor = LocalExecutor(sandbox="none", memory_max="1GiB")
    assert executor.limits == {"max_processes": 1024, "memory_max": 1 << 30}
    # (A sweep's note may follow: another test's runner may have been killed.)
    assert "guarantees. At most 1024 processes and 1,024 MiB of memory per rollout (cgroup), " \
        "each rollout's processes weighing as one on the CPU;" in executor.describe_sandbox()
    capped = LocalExecutor(sandbox="none", memory_max="1GiB", cpu_max=1.5)
    assert capped.limits["cpu_max"] == 1.5
    assert "At most 1024 processes, 1,024 MiB of memory and 1.5 CPUs per rollout (cgroup)" \
        in capped.describe_sandbox()
    shared = LocalExecutor(sandbox="none", max_processes=None)
    assert shared.limits == {} and shared.cpu_share
    assert "guarantees. Each rollout's processes weigh as one on the CPU (cgroup);" \
        in shared.describe_sandbox()
    isolated = LocalExecutor(sandbox="bwrap" if bwrap_path() else "none", max_processes=50)
    if isolated.mode == "bwrap":
        assert "no capabilities; at most 50 processes per rollout (cgroup)" \
            in isolated.describe_sandbox()
