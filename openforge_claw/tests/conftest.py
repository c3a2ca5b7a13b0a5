"""Shared helpers of the openforge-claw tests. E2E tests (real OpenClaw from npm) run only
with OPENFORGE_E2E=1."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from openforge.builtin.mini_agent import run_tool
from openforge.types import RewardResult, Task

from openforge_claw.environment import ClawEnvironment
from openforge_claw.rewards import GraderReward

SOLUTIONS = Path(__file__).resolve().parents[1] / "src/openforge_claw/solutions"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("OPENFORGE_E2E") == "1":
        return
    skip = pytest.mark.skip(reason="real OpenClaw from npm: set OPENFORGE_E2E=1")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: runs the real OpenClaw (OPENFORGE_E2E=1)")


def apply_script(script: Path, task: Task, workspace: Path) -> str:
    """Run a script's tool calls for `task` in `workspace` as the mini agent would; return
    the scripted final answer."""
    entries: list[dict[str, Any]] = yaml.safe_load(script.read_text())
    entry = next(e for e in entries if re.search(e["match"], task.prompt))
    answer = ""
    for reply in entry["replies"]:
        for call in reply.get("tool_calls", []):
            run_tool(workspace, "shell", json.dumps(call["arguments"]))
        answer = reply.get("content", answer)
    return answer


def run_direct(env: ClawEnvironment, task: Task, workspace: Path,
               script: Path | None) -> tuple[RewardResult, dict[str, Any]]:
    """prepare -> (script) -> final state -> claw-grader, in this process."""
    workspace.mkdir(parents=True, exist_ok=True)
    env.prepare(task, workspace)
    try:
        answer = apply_script(script, task, workspace) if script else ""
        state = env.final_state(task, workspace)
        state["final_answer"] = answer
        state["harness_status"] = "completed"
        return GraderReward().score(task, env, workspace, state), state
    finally:
        env.close()
