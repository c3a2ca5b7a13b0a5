"""Format detection and bad folders (each benchmark's own loader tests: test_claw_eval.py,
test_qwenclawbench.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge_claw.tasks import TaskLoadError, detect_format, load_tasks

FIXTURES = Path(__file__).parent / "fixtures"


def test_each_benchmark_checkout_is_recognised() -> None:
    assert detect_format(FIXTURES / "claw_eval_repo") == "claw-eval"
    assert detect_format(FIXTURES / "claw_eval_repo" / "tasks" / "T002_notes_digest") == "claw-eval"
    assert detect_format(FIXTURES / "qwenclawbench") == "qwenclawbench"
    assert detect_format(FIXTURES / "qwenclawbench" / "tasks") == "qwenclawbench"
    builtin = load_tasks(Path(__file__).parents[1] / "src/openforge_claw/tasks")
    assert {t.format for t in builtin} == {"claw"} and builtin.skipped == []


def test_bad_folders_give_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="no claw tasks here"):
        load_tasks(tmp_path)
    (tmp_path / "task_1.md").write_text("no front matter")
    with pytest.raises(TaskLoadError, match="no YAML front matter"):
        load_tasks(tmp_path)
