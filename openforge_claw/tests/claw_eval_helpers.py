"""What the Claw-Eval tests share: the fixture checkout, a judge stand-in, a direct runner."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from openforge.types import RewardResult, Task

from openforge_claw.environment import ClawEnvironment

REPO = Path(__file__).parent / "fixtures" / "claw_eval_repo"


def task_of(env: ClawEnvironment, task_id: str) -> Task:
    return next(t for t in env.tasks() if t.id == task_id)


@contextmanager
def judge_standin(score: float = 0.9) -> Iterator[dict[str, Any]]:
    """An OpenAI-compatible chat endpoint answering every request with a JSON score;
    yields {"url": base URL, "requests": [bodies...]}."""
    seen: dict[str, Any] = {"requests": []}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen["requests"].append({"path": self.path, "body": body,
                                     "auth": self.headers.get("Authorization")})
            answer = json.dumps({"score": score, "reasoning": "stand-in"})
            payload = json.dumps({
                "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": answer}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
            data = payload.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    seen["url"] = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()


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
