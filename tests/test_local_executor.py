"""The local executor: results, hard timeouts with no survivors, crashes, scrubbed env, cancellation."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from executor_plugins import ResultSink

from openforge.executors.local import LocalExecutor, bwrap_path, scrub_env
from openforge.executors.process import wait_gone
from openforge.types import RolloutSpec, Task

TESTS_DIR = str(Path(__file__).parent)


@pytest.fixture(autouse=True)
def _plugins_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", TESTS_DIR)


@pytest.fixture
def sink() -> Iterator[ResultSink]:
    server = ResultSink()
    yield server
    server.close()


def make_spec(sink: ResultSink, harness: str, env: str = "executor_plugins:OneTaskEnv",
              timeout_s: float = 30.0, rollout_id: str = "r1") -> RolloutSpec:
    return RolloutSpec(run_id="run", rollout_id=rollout_id, task=Task(id="only", prompt="p"),
                       harness=f"executor_plugins:{harness}", environment=env,
                       reward="checker", gateway_url=sink.url, session_token=f"tok-{rollout_id}",
                       timeout_s=timeout_s)


def recorded_pids(base: Path) -> list[int]:
    files = list(base.glob("*/workspace/pids.txt"))
    assert files, "the rollout never recorded its pids"
    return [int(p) for p in files[0].read_text().split()]


async def test_ok_rollout_posts_and_prints_result(sink: ResultSink, tmp_path: Path) -> None:
    executor = LocalExecutor(sandbox="none", base_dir=tmp_path)
    result = await executor.run(make_spec(sink, "OkHarness"))
    assert result.status == "ok", result.error
    assert result.reward is not None and result.reward.passed
    assert result.final_answer == "all done"
    assert sink.results["tok-r1"]["status"] == "ok"
    assert list(tmp_path.iterdir()) == []  # the rollout directory was removed


async def test_hanging_harness_is_killed_with_all_descendants(sink: ResultSink, tmp_path: Path) -> None:
    executor = LocalExecutor(sandbox="none", base_dir=tmp_path, keep_dirs=True)
    result = await executor.run(make_spec(sink, "HangHarness", timeout_s=3))
    assert result.status == "timeout"
    assert result.reward is None
    pids = recorded_pids(tmp_path)
    assert len(pids) == 3
    assert wait_gone(pids) == []


async def test_hanging_rollout_is_killed_by_the_hard_timeout(sink: ResultSink, tmp_path: Path) -> None:
    executor = LocalExecutor(sandbox="none", base_dir=tmp_path, keep_dirs=True,
                             kill_margin_s=0.5, grace_s=0.5)
    result = await executor.run(make_spec(sink, "OkHarness", env="executor_plugins:HangInPrepareEnv",
                                          timeout_s=2))
    assert result.status == "timeout"
    assert "hard timeout" in (result.error or "")
    assert wait_gone(recorded_pids(tmp_path)) == []


async def test_crashing_harness_is_an_infra_error(sink: ResultSink, tmp_path: Path) -> None:
    result = await LocalExecutor(sandbox="none", base_dir=tmp_path).run(make_spec(sink, "CrashHarness"))
    assert result.status == "infra_error"
    assert result.is_infra_failure and result.reward is None


async def test_failing_harness_is_scored(sink: ResultSink, tmp_path: Path) -> None:
    result = await LocalExecutor(sandbox="none", base_dir=tmp_path).run(make_spec(sink, "FailHarness"))
    assert result.status == "harness_error"
    assert result.reward is not None and result.reward.score == 0.0


async def test_rollout_that_dies_without_result(sink: ResultSink, tmp_path: Path) -> None:
    executor = LocalExecutor(sandbox="none", base_dir=tmp_path, python="/bin/false")
    result = await executor.run(make_spec(sink, "OkHarness"))
    assert result.status == "infra_error"
    assert "no result" in (result.error or "")


async def test_env_is_scrubbed_and_home_isolated(sink: ResultSink, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    real_home = tmp_path / "real-home"
    real_home.mkdir()
    for name, value in {"FAKE_API_KEY": "sk-secret", "GITHUB_TOKEN": "ghp", "AWS_REGION": "x",
                        "AWS_SECRET_ACCESS_KEY": "y", "OPENFORGE_API_KEY": "z",
                        "OPENFORGE_VISIBLE": "yes", "HOME": str(real_home), "LC_ALL": "C.UTF-8"}.items():
        monkeypatch.setenv(name, value)
    base = tmp_path / "rollouts"
    executor = LocalExecutor(sandbox="none", base_dir=base, keep_dirs=True)
    result = await executor.run(make_spec(sink, "EnvDumpHarness"))
    assert result.status == "ok", result.error
    env = json.loads(next(base.glob("*/workspace/env.json")).read_text())
    for secret in ("FAKE_API_KEY", "GITHUB_TOKEN", "AWS_REGION", "AWS_SECRET_ACCESS_KEY",
                   "OPENFORGE_API_KEY"):
        assert secret not in env
    assert env["OPENFORGE_VISIBLE"] == "yes" and env["LC_ALL"] == "C.UTF-8"
    rollout_dir = next(base.iterdir())
    assert env["HOME"] == str(rollout_dir / "home")
    for xdg in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "TMPDIR"):
        assert env[xdg].startswith(str(rollout_dir))
    assert (rollout_dir / "home" / "marker").exists()
    assert list(real_home.iterdir()) == []


def test_scrub_env_allowlist() -> None:
    env = scrub_env({"PATH": "/bin", "HOME": "/root", "OPENAI_API_KEY": "k", "OPENFORGE_TOKEN": "t",
                     "OPENFORGE_X": "1", "LC_CTYPE": "C", "SSH_AUTH_SOCK": "/s", "TZ": "UTC"})
    assert env == {"PATH": "/bin", "OPENFORGE_X": "1", "LC_CTYPE": "C", "TZ": "UTC"}


async def test_cancellation_kills_the_rollout(sink: ResultSink, tmp_path: Path) -> None:
    executor = LocalExecutor(sandbox="none", base_dir=tmp_path, keep_dirs=True)
    task = asyncio.create_task(executor.run(make_spec(sink, "HangHarness", timeout_s=120)))
    for _ in range(200):
        if list(tmp_path.glob("*/workspace/pids.txt")):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # the pid line is written in one go; let it land
    pids = recorded_pids(tmp_path)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert wait_gone(pids) == []
    assert not [c for c in psutil.Process().children(recursive=True)
                if c.status() != psutil.STATUS_ZOMBIE and "openforge.rollout" in " ".join(c.cmdline())]


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
async def test_bwrap_keeps_code_under_tmp_importable(sink: ResultSink, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # e.g. a plugin installed with `pip install --target /tmp/x`: the private /tmp must not hide it
    code = tmp_path / "plugin-code"
    code.mkdir()
    (code / "tmp_plugin.py").write_text("from executor_plugins import OkHarness as TmpHarness\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS_DIR, str(code)]))
    spec = make_spec(sink, "OkHarness").model_copy(update={"harness": "tmp_plugin:TmpHarness"})
    result = await LocalExecutor(sandbox="bwrap", base_dir=tmp_path / "rollouts").run(spec)
    assert result.status == "ok", result.error


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed")
async def test_bwrap_sandbox(sink: ResultSink, tmp_path: Path) -> None:
    executor = LocalExecutor(sandbox="bwrap", base_dir=tmp_path, keep_dirs=True)
    assert "bubblewrap" in executor.describe_sandbox()
    result = await executor.run(make_spec(sink, "EnvDumpHarness"))
    assert result.status == "ok", result.error
    assert sink.results["tok-r1"]["status"] == "ok"  # the network to the gateway works
    before = set(psutil.pids())
    hang = await executor.run(make_spec(sink, "HangHarness", timeout_s=3, rollout_id="r2"))
    assert hang.status == "timeout"
    # pids inside the sandbox are namespaced: look for new survivors by their command lines.
    leftovers = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if proc.pid not in before and proc.status() != psutil.STATUS_ZOMBIE and (
                    str(tmp_path) in cmdline or "time.sleep(600)" in cmdline):
                leftovers.append(proc)
        except psutil.Error:
            continue
    assert leftovers == []


def test_sandbox_none_says_so() -> None:
    text = LocalExecutor(sandbox="none").describe_sandbox()
    assert text.startswith("sandbox: none")
    assert os.path.exists(LocalExecutor(sandbox="none").config.python)
