"""Shared helpers of the openforge-claw tests: the scripted-solution runner and a stand-in
LLM judge (a real local HTTP server speaking OpenAI chat completions). E2E tests (real
OpenClaw from npm) run only with OPENFORGE_E2E=1."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from openforge.builtin.mini_agent import run_tool
from openforge.sandbox.modes import bwrap_path, bwrap_works, namespaces_available
from openforge.types import RewardResult, Task

from openforge_claw.environment import ClawEnvironment
from openforge_claw.rewards import GraderReward

SOLUTIONS = Path(__file__).resolve().parents[1] / "src/openforge_claw/solutions"

# An agent's module that a QwenClawBench grader loads into its own process (as task_00059's
# does): it finds the job (with the nonce) in the frames that called it, writes a perfect
# result and ends the process before grade() returns.
IN_PROCESS_FORGER = (
    "import os, sys\n"
    "frame = sys._getframe()\n"
    "while frame is not None and not isinstance(frame.f_locals.get('job'), dict):\n"
    "    frame = frame.f_back\n"
    "nonce = frame.f_locals['job']['nonce']\n"
    "os.write(1, (nonce + ' {\"ok\": true, \"scores\": {\"forged\": 1.0}}\\n').encode())\n"
    "os._exit(0)\n")


def _isolating_modes() -> list[object]:
    bwrap = bwrap_path()
    return [pytest.param("bwrap", id="bwrap", marks=pytest.mark.skipif(
                bwrap is None or not bwrap_works(bwrap),
                reason="bubblewrap is not installed or cannot run here (CI installs it)")),
            pytest.param("namespaces", id="namespaces", marks=pytest.mark.skipif(
                not namespaces_available(),
                reason="this kernel does not allow unprivileged user, mount and PID namespaces"))]


# The sandbox modes that isolate the agent, as pytest parameters (skipped, saying why, where
# this machine cannot run one).
ISOLATING_MODES = _isolating_modes()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("OPENFORGE_E2E") == "1":
        return
    skip = pytest.mark.skip(reason="real OpenClaw from npm: set OPENFORGE_E2E=1 (nox -s e2e does)")
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


class _JudgeHandler(BaseHTTPRequestHandler):
    server: JudgeStandIn

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"path": self.path, "body": body,
                                     "auth": self.headers.get("Authorization")})
        status, answer = (self.server.replies.pop(0) if self.server.replies
                          else (200, self.server.answer))
        reply = {"id": "judge-1", "object": "chat.completion", "created": 0,
                 "model": body.get("model"),
                 "choices": [{"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": answer}}],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        payload = json.dumps(reply if status == 200 else {"error": {"message": answer}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


class JudgeStandIn(ThreadingHTTPServer):
    """A judge model behind an OpenAI-compatible endpoint on 127.0.0.1: it answers the
    queued `replies` ((HTTP status, answer text)) in order, then `answer`; every request
    is kept in `requests` ({path, body, auth})."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _JudgeHandler)
        self.requests: list[dict[str, Any]] = []
        self.replies: list[tuple[int, str]] = []
        self.answer = "{}"

    @property
    def url(self) -> str:
        """The base URL (`.../v1`), as judge options take it."""
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


@pytest.fixture
def judge() -> Iterator[JudgeStandIn]:
    server = JudgeStandIn()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()
