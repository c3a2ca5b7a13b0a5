"""The Claw-Eval loader on a small fixture folder in its format, run through the claw
environment (services started and stopped) and the claw-grader; bad folders
(QwenClawBench's own tests: test_qwenclawbench.py)."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
from conftest import run_direct
from openforge.builtin.mini_agent import run_tool

from openforge_claw.environment import ClawEnvironment
from openforge_claw.tasks import TaskLoadError, load_tasks

FIXTURES = Path(__file__).parent / "fixtures"
CLAW_EVAL = FIXTURES / "claw_eval"


def test_claw_eval_task_is_read() -> None:
    (task,) = load_tasks(CLAW_EVAL)
    assert task.format == "claw-eval" and task.id == "T001_weather_note"
    assert [(s.name, s.resolved_kind) for s in task.services] == [("weather", "command"),
                                                                 ("notes", "notes")]
    assert task.services[1].seed["notes"][0]["title"] == "Keep me"  # from NOTES_FIXTURES
    assert [c.type for c in task.grader.checks] == ["keywords_present", "python"]
    assert task.rubric and "concise" in task.rubric  # llm_judge component -> rubric
    assert task.tools == ["notes_create"] and task.timeout_s == 300


def _solve_weather(ws: Path) -> None:
    weather = (ws / ".claw/weather.url").read_text()
    out = run_tool(ws, "shell", json.dumps({"command": f"curl -s '{weather}/weather?city=Berlin'"}))
    assert '"temp_c": 21' in out, out
    run_tool(ws, "shell", json.dumps({"command": (
        "curl -s -X POST -H 'Content-Type: application/json' -d "
        "'{\"title\": \"Berlin weather\", \"body\": \"21 C\"}' \"$(cat .claw/notes.url)/notes\"")}))


def test_claw_eval_task_runs_and_its_service_process_is_gone(tmp_path: Path) -> None:
    env = ClawEnvironment(path=str(CLAW_EVAL))
    (task,) = list(env.tasks())
    ws = tmp_path / "ws"
    ws.mkdir()
    env.prepare(task, ws)
    pid = env.services.running[0].proc.pid  # type: ignore[attr-defined]
    assert psutil.pid_exists(pid)
    try:
        _solve_weather(ws)
        state = env.final_state(task, ws)
        state["final_answer"] = "It is 21 degrees in Berlin."
    finally:
        env.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    verdict = env.check(task, ws, state)
    assert verdict.passed and verdict.score == 1.0, verdict.details
    idle, _ = run_direct(ClawEnvironment(path=str(CLAW_EVAL)), task, tmp_path / "idle", None)
    assert not idle.passed and idle.details["completion"] == 0.0


def test_bad_folders_give_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="no claw tasks here"):
        load_tasks(tmp_path)
    (tmp_path / "task_1.md").write_text("no front matter")
    with pytest.raises(TaskLoadError, match="no YAML front matter"):
        load_tasks(tmp_path)
