"""Check functions the `tasks` environment's tests name by import path (`task_checks:...`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openforge.types import Task


def answer_in_file(task: Task, workspace: Path, final_state: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Passes when answer.txt holds the task's ground truth."""
    path = workspace / "answer.txt"
    got = path.read_text().strip() if path.is_file() else None
    return float(got == str(task.data["ground_truth"])), {"got": got}


def always_half(task: Task, workspace: Path, final_state: dict[str, Any]) -> float:
    return 0.5


def says_yes(task: Task, workspace: Path, final_state: dict[str, Any]) -> bool:
    return "yes" in str(final_state.get("final_answer") or "").lower()


def returns_text(task: Task, workspace: Path, final_state: dict[str, Any]) -> str:
    return "passed"
