"""The demo environment, its checkers, the checker reward, and the end-to-end runs that must
score pass@1 = 1.0 with tests/demo_solutions.yaml and 0.5 with tests/demo_half_solutions.yaml."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from openforge.builtin.checker import CheckerReward, NoCheckerError
from openforge.builtin.demo import DemoEnvironment, _run_python
from openforge.builtin.mini_agent import run_tool
from openforge.config import EngineConfig, RunConfig
from openforge.environment import Environment
from openforge.runner import read_results, run_from_config
from openforge.types import Task

HERE = Path(__file__).parent
FULL = HERE / "demo_solutions.yaml"
HALF = HERE / "demo_half_solutions.yaml"


def solve(script: Path, task: Task, workspace: Path) -> None:
    """Apply a script's tool calls for `task` directly, as the mini agent would."""
    entries: list[dict[str, Any]] = yaml.safe_load(script.read_text())
    entry = next(e for e in entries if re.search(e["match"], task.prompt))
    for reply in entry["replies"]:
        for call in reply.get("tool_calls", []):
            out = run_tool(workspace, call["name"], json.dumps(call["arguments"]))
            assert not out.startswith("error"), out


def scores(script: Path | None, tmp_path: Path) -> dict[str, float]:
    env = DemoEnvironment()
    reward = CheckerReward()
    out = {}
    for task in env.tasks():
        ws = tmp_path / task.id
        ws.mkdir()
        env.prepare(task, ws)
        if script is not None:
            solve(script, task, ws)
        state = env.final_state(task, ws)
        out[task.id] = reward.score(task, env, ws, state).score
    return out


def test_at_least_twelve_unique_tasks() -> None:
    tasks = list(DemoEnvironment().tasks())
    assert len(tasks) >= 12
    assert len({t.id for t in tasks}) == len(tasks)
    assert all(t.prompt and t.environment == "demo" for t in tasks)


def test_untouched_workspaces_fail_every_checker(tmp_path: Path) -> None:
    result = scores(None, tmp_path)
    assert result == {task_id: 0.0 for task_id in result}  # doing nothing earns nothing


def test_full_solutions_pass_every_checker(tmp_path: Path) -> None:
    result = scores(FULL, tmp_path)
    assert result == {task_id: 1.0 for task_id in result}


def test_half_solutions_pass_exactly_half(tmp_path: Path) -> None:
    result = scores(HALF, tmp_path)
    assert sum(1 for s in result.values() if s == 1.0) == len(result) // 2


def test_partial_credit_and_final_state(tmp_path: Path) -> None:
    env = DemoEnvironment()
    task = next(t for t in env.tasks() if t.id == "json-edit")
    env.prepare(task, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"name": "demo-app", "debug": False, "version": 1}))
    state = env.final_state(task, tmp_path)
    assert json.loads(state["files"]["config.json"]["content"])["debug"] is False
    verdict = env.check(task, tmp_path, state)
    assert verdict.score == pytest.approx(0.5) and not verdict.passed


def test_a_file_or_an_output_too_large_to_read_whole_is_never_a_match(tmp_path: Path) -> None:
    """The checkers read at most 1 MiB of a file the agent wrote (it decides how large it
    is): the right answer followed by 2 MiB of spaces, which stripping would have made a
    match, is cut and fails; so does a script whose output is too long to read whole."""
    env = DemoEnvironment()
    hello = next(t for t in env.tasks() if t.id == "hello-file")
    (tmp_path / "hello.txt").write_text("Hello, world!" + " " * (2 << 20))
    verdict = env.check(hello, tmp_path, {})
    assert (verdict.score, verdict.details["reason"]) == (0.0, "hello.txt has the wrong content")
    (tmp_path / "hello.txt").write_text("Hello, world!" + " " * 100)
    assert env.check(hello, tmp_path, {}).score == 1.0
    script = tmp_path / "loud.py"
    script.write_text("print('x' * (9 << 20))")
    assert _run_python(tmp_path, "loud.py") == (-1, "")
    script.write_text("print('ok')")
    assert _run_python(tmp_path, "loud.py") == (0, "ok\n")


def test_checker_reward_needs_a_checker(tmp_path: Path) -> None:
    class NoChecker(Environment):
        def tasks(self, split: str | None = None) -> list[Task]:
            return [Task(id="t", prompt="p")]

    with pytest.raises(NoCheckerError, match="no programmatic checker"):
        CheckerReward().score(Task(id="t", prompt="p"), NoChecker(), tmp_path, {})


def test_write_file_refuses_to_escape(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    assert "outside the workspace" in run_tool(ws, "write_file", json.dumps({"path": "../x", "content": "1"}))
    assert "outside the workspace" in run_tool(ws, "write_file", json.dumps({"path": "/etc/x", "content": "1"}))
    assert not (tmp_path / "x").exists()
    assert run_tool(ws, "nope", "{}").startswith("error: unknown tool")
    assert run_tool(ws, "shell", "not json").startswith("error: arguments")


def _scripted_run(script: Path, runs: Path, **extra: Any) -> Any:
    config = RunConfig(engine=EngineConfig(name="scripted", options={"script": str(script)}),
                       runs_dir=runs, concurrency=4, **extra)
    return run_from_config(config)


def test_run_with_full_solutions_scores_one(tmp_path: Path) -> None:
    summary = _scripted_run(FULL, tmp_path)
    assert summary.metrics.pass_at[1] == 1.0
    assert summary.metrics.infra_failures == 0
    records = read_results(summary.run_dir)
    assert len(records) == len(list(DemoEnvironment().tasks()))
    report = json.loads((summary.run_dir / "report.json").read_text())
    assert report["pass_at_k"]["1"] == 1.0
    html = (summary.run_dir / "report.html").read_text()
    assert "<svg" in html and "write_file" in html and "<script src" not in html

    from openforge.store import Store

    with Store(summary.run_dir / "store.sqlite") as store:
        for record in records:
            calls = store.list_calls(record.session_id)
            assert len(calls) >= 2 and all(c.completion_ids for c in calls)
