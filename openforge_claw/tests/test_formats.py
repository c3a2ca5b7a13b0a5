"""The QwenClawBench loader on a small fixture folder in its format, run through the claw
environment and the claw-grader (Claw-Eval: test_claw_eval.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge_claw.environment import ClawEnvironment
from openforge_claw.tasks import TaskLoadError, load_tasks

FIXTURES = Path(__file__).parent / "fixtures"
QWEN = FIXTURES / "qwenclawbench"


def test_qwenclawbench_task_is_read_and_graded(tmp_path: Path) -> None:
    (task,) = load_tasks(QWEN)
    assert task.format == "qwenclawbench" and task.grader.score_shape == "plain"
    assert task.judge_weights == {"automated": 0.6, "llm_judge": 0.4}
    assert "Expected Behavior" in (task.rubric or "")
    env = ClawEnvironment(path=str(QWEN / "tasks"))
    (t,) = list(env.tasks())
    ws = tmp_path / "ws"
    ws.mkdir()
    env.prepare(t, ws)
    assert (ws / "numbers.txt").read_text() == "10\n20\n30\n"
    assert (ws / "docs/README.txt").read_text() == "shared docs\n"
    (ws / "sum.txt").write_text("60\n")
    assert env.check(t, ws, env.final_state(t, ws)).passed
    (ws / "sum.txt").write_text("59\n")
    wrong = env.check(t, ws, env.final_state(t, ws))
    assert wrong.score == pytest.approx(0.5) and not wrong.passed  # 1 of 2 criteria


def test_bad_folders_give_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="no claw tasks here"):
        load_tasks(tmp_path)
    (tmp_path / "task_1.md").write_text("no front matter")
    with pytest.raises(TaskLoadError, match="no YAML front matter"):
        load_tasks(tmp_path)
