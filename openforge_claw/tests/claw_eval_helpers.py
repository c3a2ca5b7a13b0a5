"""What the Claw-Eval tests share: the fixture checkout and a direct runner (the judge
stand-in is conftest's, shared with the QwenClawBench tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openforge.types import RewardResult, Task

from openforge_claw.environment import ClawEnvironment

REPO = Path(__file__).parent / "fixtures" / "claw_eval_repo"


def task_of(env: ClawEnvironment, task_id: str) -> Task:
    return next(t for t in env.tasks() if t.id == task_id)


def graded(env: ClawEnvironment, task: Task, workspace: Path, answer: str,
           act: Any = None) -> tuple[RewardResult, dict[str, Any]]:
    """prepare -> `act(workspace)` -> final state -> the task's own grader, in this process."""
    workspace.mkdir(parents=True, exist_ok=True)
    env.prepare(task, workspace)
    try:
        if act is not None:
            act(workspace)
        state = env.final_state(task, workspace)
    finally:
        env.close()
    state["final_answer"] = answer
    return env.score(task, workspace, state, None), state
