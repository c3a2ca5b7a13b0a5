"""Fixtures: a stand-in website (a local HTTP server of tests/site) and a stand-in judge.

The judge stand-in is an OpenAI-chat-compatible server (POST /v1/chat/completions) that
litellm calls exactly as it calls a hosted judge (openforge-gui's `webjudge`, which
`mind2web-judge` is). It answers WebJudge's three stages by
rule: key points for the task, "Score: 4" for a screenshot, and a verdict that is success
when the final response in the verdict request names the blue mug's price ($12).
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent


class _Quiet:
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class _SiteHandler(_Quiet, SimpleHTTPRequestHandler):
    pass


class _JudgeHandler(_Quiet, BaseHTTPRequestHandler):
    server: JudgeServer

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.server.requests.append(body)
        content = body["messages"][-1]["content"]
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        text = " ".join(p.get("text", "") for p in parts)
        if "List the key points" in text:
            reply = "- the blue mug\n- its price"
        elif "Score from 1 to 5" in text:
            reply = "Score: 4\nThe page shows the mug shop."
        else:
            reply = "The response names the price." if "$12" in text else "Wrong price."
            reply += "\nStatus: success" if "$12" in text else "\nStatus: failure"
        data = json.dumps({
            "id": "chatcmpl-judge", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "judge"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": reply}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class JudgeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _JudgeHandler)
        self.requests: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


def _serve(server: ThreadingHTTPServer) -> Iterator[ThreadingHTTPServer]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(_SiteHandler, directory=str(HERE / "site")))
    for s in _serve(server):
        yield f"http://127.0.0.1:{s.server_address[1]}/index.html"


@pytest.fixture
def judge() -> Iterator[JudgeServer]:
    yield from _serve(JudgeServer())  # type: ignore[misc]
