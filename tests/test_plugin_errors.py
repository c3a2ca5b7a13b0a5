"""A bug in plugin code is a `plugin_error`: not retried, not scored, and shown as such, with
one consistent set of figures, in the headline, the progress bar, every report section,
`openforge runs` and the exported training data."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rich.console import Console

from openforge.config import EngineConfig, RunConfig
from openforge.metrics import AttemptOutcome, summarize
from openforge.runner import read_results, run_from_config

HERE = Path(__file__).parent
TASKS = [
    {"id": "fine", "prompt": "Create hello.txt containing exactly: Hello, world!",
     "check": {"files": {"hello.txt": "Hello, world!"}}},
    {"id": "score-bug", "prompt": "Create hello.txt containing exactly: Hello, world!",
     "check": {"files": {"hello.txt": "Hello, world!"}}},
    {"id": "prepare-bug", "prompt": "Create hello.txt containing exactly: Hello, world!",
     "check": {"files": {"hello.txt": "Hello, world!"}}},
]
SCRIPT = """
- replies:
    - tool_calls: [{name: write_file, arguments: {path: hello.txt, content: "Hello, world!"}}]
    - content: "Created hello.txt."
"""


def openforge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(HERE), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "openforge.cli", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd, env=env)


def test_plugin_errors_are_counted_apart_everywhere(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    (tmp_path / "script.yaml").write_text(SCRIPT)
    out = openforge("run", "--env", "plugin_bugs:PrepareBugEnvironment", "--reward",
                    "plugin_bugs:ScoreBugReward", "--set", "environment_options.path=tasks.jsonl",
                    "--engine", "scripted", "--script", "script.yaml", "--runs-dir", "runs",
                    "--concurrency", "1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    [run_dir] = list((tmp_path / "runs").iterdir())
    records = {r["task_id"]: r for r in map(json.loads,
                                            (run_dir / "results.jsonl").read_text().splitlines())}
    assert {t: r["status"] for t, r in records.items()} == {
        "fine": "ok", "score-bug": "plugin_error", "prepare-bug": "plugin_error"}
    assert all(r["tries"] == 1 for r in records.values())  # a bug is not retried
    assert records["score-bug"]["reward"] is None and not records["score-bug"]["passed"]
    assert records["score-bug"]["error"] == (
        "reward 'plugin_bugs:ScoreBugReward' raised ZeroDivisionError: division by zero "
        "while scoring (score)")
    assert records["prepare-bug"]["error"].startswith(
        "environment 'plugin_bugs:PrepareBugEnvironment' raised KeyError: 'fixture' while "
        "preparing the environment (prepare)")

    headline = ("pass@1 1.000 over 1 scored of 3 attempts (1 passed, mean reward 1.000); "
                "left out: 2 plugin errors, 0 infrastructure failures")
    stdout = " ".join(out.stdout.split())  # rich wraps long lines
    assert headline in stdout
    assert "pass 100% of 1 scored plugin errors 2 infra failures 0" in stdout  # progress bar
    assert "2 attempts ended in a plugin error (not scored, not retried)" in stdout

    report = json.loads((run_dir / "report.json").read_text())
    s = report["summary"]
    assert (s["attempts"], s["scored"], s["passed"], s["plugin_errors"], s["infra_failures"]) \
        == (3, 1, 1, 2, 0)
    assert s["headline"] == headline and report["pass_at_k"] == {"1": 1.0}
    rows = {r["task_id"]: r for r in report["tasks"]}
    assert rows["score-bug"]["plugin_errors"] == 1 and rows["score-bug"]["n"] == 0
    behaviours = report["behaviours"]
    assert behaviours["unscored_trials"] == 2
    assert behaviours["failure_categories"] == {"plugin_error": 2}
    html = (run_dir / "report.html").read_text()
    assert headline in html
    assert "2 attempts ended in a plugin error" in html
    assert "the 2 not scored (plugin errors, infrastructure failures) as failed" in html
    assert html.count("plugin error</span>") == 2  # each attempt labelled

    # What the summary says of the training data is what the export writes.
    trajectories = report["trajectories"]
    assert trajectories["sessions_left_out"] == {"plugin errors": 1}  # prepare-bug made no call
    export = openforge("export", str(run_dir), "--format", "samples", "--out", "samples",
                       cwd=tmp_path)
    assert export.returncode == 0, export.stderr
    samples = pq.read_table(tmp_path / "samples" / "data.parquet").to_pylist()
    assert len(samples) == trajectories["samples"]
    assert {r["task_id"] for r in samples} == {"fine"}
    assert f"-> {trajectories['samples']} samples" in stdout
    assert "sessions left out: plugin errors 1" in stdout

    runs = openforge("runs", "runs", cwd=tmp_path)
    row = runs.stdout.splitlines()[1].split()
    assert row[-7:] == ["1", "1", "1.000", "2", "0", "1.000", "yes"]


HARNESS_BUGS = ("harness-prepare-bug", "harness-command-bug", "harness-parse-bug")
INFRA_DOWN = ("service-down", "judge-down")


def test_harness_adapter_bugs_are_plugin_errors_and_infra_failures_are_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(HERE))
    check = {"files": {"hello.txt": "Hello, world!"}}
    tasks = [{"id": task_id, "prompt": "Create hello.txt", "check": check}
             for task_id in ("fine", *HARNESS_BUGS, *INFRA_DOWN)]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (tmp_path / "script.yaml").write_text(SCRIPT)
    config = RunConfig(
        engine=EngineConfig(name="scripted", options={"script": str(tmp_path / "script.yaml")}),
        harness="plugin_bugs:BuggyHarness",
        environment="plugin_bugs:FlakyServiceEnvironment",
        environment_options={"path": str(tmp_path / "tasks.jsonl")},
        reward="plugin_bugs:FlakyJudgeReward", executor="local",
        executor_options={"sandbox": "none", "base_dir": str(tmp_path / "sandboxes")},
        runs_dir=tmp_path / "runs", concurrency=2, k=1, max_infra_retries=2, timeout_s=120)
    summary = run_from_config(config, console=Console(file=io.StringIO()))
    records = {r.task_id: r for r in read_results(summary.run_dir)}

    # A harness adapter that raises is a plugin error: not scored, not retried, and the
    # error names the plugin, the stage and the method.
    harness = "harness 'plugin_bugs:BuggyHarness' raised"
    assert {t: (records[t].status, records[t].tries, records[t].reward) for t in HARNESS_BUGS} \
        == {t: ("plugin_error", 1, None) for t in HARNESS_BUGS}
    assert records["harness-prepare-bug"].error == (
        f"{harness} FileNotFoundError: settings.json while preparing the harness (prepare)")
    assert records["harness-command-bug"].error == (
        f"{harness} TypeError: 'NoneType' object is not iterable while building the harness "
        "command (command)")
    assert records["harness-parse-bug"].error == (
        f"{harness} IndexError: list index out of range while parsing the harness output "
        "(parse_output)")
    # A plugin that says its infrastructure failed (before the agent ran, or while scoring)
    # is an infrastructure failure: retried, with a new session each time, and not scored.
    for task_id in INFRA_DOWN:
        record = records[task_id]
        assert (record.status, record.tries, record.reward) == ("infra_error", 3, None)
        assert len(set(record.session_ids)) == 3 and len(record.infra_errors) == 3
    assert records["service-down"].error == ("preparing the environment (prepare) failed: "
                                             "RolloutInfraError: the task's database did not "
                                             "come up")
    assert records["judge-down"].error == ("scoring (score) failed: RolloutInfraError: the "
                                           "judge endpoint answered 503")
    assert records["fine"].status == "ok" and records["fine"].passed
    # Each kind counted apart, in the figures every report shows.
    m = summary.metrics
    assert (m.attempts, m.scored, m.passed, m.plugin_errors, m.infra_failures) == (6, 1, 1, 3, 2)
    assert m.headline() == ("pass@1 1.000 over 1 scored of 6 attempts (1 passed, mean reward "
                            "1.000); left out: 3 plugin errors, 2 infrastructure failures")


def test_online_training_says_which_attempts_were_not_scored_and_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A training step whose batch lost attempts to infrastructure failures says so in one
    console line, and `attempts.jsonl` keeps every attempt's status and each try's error."""
    from openforge.training.rollouts import RolloutCollector
    from openforge.types import Task

    monkeypatch.setenv("PYTHONPATH", str(HERE))
    check = {"files": {"hello.txt": "Hello, world!"}}
    (tmp_path / "tasks.jsonl").write_text("")
    (tmp_path / "script.yaml").write_text(SCRIPT)
    config = RunConfig(
        engine=EngineConfig(name="scripted", options={"script": str(tmp_path / "script.yaml")}),
        harness="plugin_bugs:BuggyHarness", environment="plugin_bugs:FlakyServiceEnvironment",
        environment_options={"path": str(tmp_path / "tasks.jsonl")},
        executor="local", executor_options={"sandbox": "none",
                                            "base_dir": str(tmp_path / "sandboxes")},
        concurrency=2, k=1, max_infra_retries=1, timeout_s=120)
    tasks = [Task(id=task_id, prompt="Create hello.txt", data={"check": check})
             for task_id in ("fine", "service-down")]
    out = io.StringIO()

    async def collect() -> None:
        async with RolloutCollector(config, tmp_path / "rollouts",
                                    Console(file=out, width=400)) as collector:
            step = await collector.collect(tasks, 1, "grpo-step0")
            assert [r.status for r in step.records] == ["ok", "infra_error"]

    import asyncio

    asyncio.run(collect())
    log = tmp_path / "rollouts" / "attempts.jsonl"
    assert out.getvalue().splitlines() == [
        "[grpo-step0] 1 of 2 attempts not scored (infra_error: preparing the environment "
        "(prepare) failed: RolloutInfraError: the task's database did not come up); every "
        f"one's error is in {log}"]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["tag"], r["task_id"], r["status"], r["tries"]) for r in rows] == [
        ("grpo-step0", "fine", "ok", 1), ("grpo-step0", "service-down", "infra_error", 2)]
    assert len(rows[1]["infra_errors"]) == 2


def test_the_figures_come_from_one_summary() -> None:
    outcomes = [AttemptOutcome(task_id="a", status="ok", reward=1.0, passed=True),
                AttemptOutcome(task_id="b", status="plugin_error"),
                AttemptOutcome(task_id="c", status="timeout"),
                AttemptOutcome(task_id="d", status="harness_error", reward=0.0)]
    m = summarize(outcomes, 1)
    assert (m.attempts, m.scored, m.passed, m.plugin_errors, m.infra_failures) == (4, 2, 1, 1, 1)
    assert m.pass_at == {1: 0.5}
    assert m.headline() == ("pass@1 0.500 over 2 scored of 4 attempts (1 passed, mean reward "
                            "0.500); left out: 1 plugin errors, 1 infrastructure failures")
    assert m.progress() == "pass 50% of 2 scored  plugin errors 1  infra failures 1"
