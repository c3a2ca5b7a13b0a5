"""openforge.builtin.chat_endpoint, the built-in agents' model client, against a real HTTP
server: the body and key it sends, what it retries (and numbers), what it gives up on."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from openforge.builtin.chat_endpoint import (
    ChatEndpoint,
    EndpointDown,
    EndpointError,
    function_calls,
    reply_message,
)

COMPLETION = {"id": "c1", "object": "chat.completion", "choices": [
    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}]}


class Script:
    """What the server answers, one (status, headers, body) per request, and what it saw."""

    def __init__(self, *answers: tuple[int, dict[str, str], str]) -> None:
        self.answers = list(answers)
        self.seen: list[dict[str, Any]] = []


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            script.seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                "body": json.loads(body)})
            status, headers, text = script.answers.pop(0)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(text.encode())))
            self.end_headers()
            self.wfile.write(text.encode())

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/s/tok/v1/", script
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_completion_is_posted_with_the_body_and_the_bearer_key(
        server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [(200, {"Content-Type": "application/json"}, json.dumps(COMPLETION))]
    answer = ChatEndpoint(url, "sk-session").create(
        model="policy", messages=[{"role": "user", "content": "hello"}], max_tokens=8)
    assert answer == COMPLETION
    [seen] = script.seen
    assert seen["path"] == "/s/tok/v1/chat/completions"
    assert seen["headers"]["authorization"] == "Bearer sk-session"
    assert "x-stainless-retry-count" not in seen["headers"]
    assert seen["body"] == {"model": "policy", "messages": [{"role": "user", "content": "hello"}],
                            "max_tokens": 8}


def test_overload_and_server_errors_are_retried_twice_and_numbered(
        server: tuple[str, Script]) -> None:
    url, script = server
    now = {"Retry-After": "0"}
    script.answers = [(503, now, "busy"), (429, now, "slow down"),
                      (200, {}, json.dumps(COMPLETION))]
    assert ChatEndpoint(url, "k").create(model="m", messages=[]) == COMPLETION
    assert [s["headers"].get("x-stainless-retry-count") for s in script.seen] == [None, "1", "2"]
    assert len({json.dumps(s["body"]) for s in script.seen}) == 1  # the same request each time


def test_an_endpoint_that_keeps_failing_is_down_after_the_retries(
        server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [(502, {"Retry-After": "0"}, "engine lost")] * 3
    with pytest.raises(EndpointDown, match="Error code: 502 - engine lost"):
        ChatEndpoint(url, "k").create(model="m", messages=[])
    assert len(script.seen) == 3


def test_a_refused_request_is_an_error_at_once(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [(400, {}, '{"error": {"message": "context length exceeded"}}')]
    with pytest.raises(EndpointError, match="Error code: 400 - .*context length exceeded"):
        ChatEndpoint(url, "k").create(model="m", messages=[])
    assert len(script.seen) == 1


def test_no_server_is_an_endpoint_down() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EndpointDown, match="Connection error"):
        ChatEndpoint(f"http://127.0.0.1:{port}/v1", "k", retries=0).create(model="m", messages=[])


def test_an_answer_that_is_not_json_is_an_endpoint_down(server: tuple[str, Script]) -> None:
    url, script = server
    script.answers = [(200, {}, "<html>proxy error</html>")]
    with pytest.raises(EndpointDown):
        ChatEndpoint(url, "k", retries=0).create(model="m", messages=[])


def test_only_well_formed_function_calls_are_the_agents_to_run() -> None:
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "shell", "arguments": '{"command": "ls"}'}},
        {"id": "b", "type": "custom", "custom": {"name": "x", "input": "y"}},
        {"id": "c", "type": "function", "function": {"name": 7}},
        "not a call"]}
    assert function_calls(message) == [
        {"id": "a", "type": "function", "function": {"name": "shell", "arguments": '{"command": "ls"}'}}]
    assert function_calls({"role": "assistant", "content": "done"}) == []
    assert function_calls({"tool_calls": "nonsense"}) == []


def test_the_reply_is_the_first_choices_message_and_anything_else_is_an_error() -> None:
    assert reply_message(COMPLETION) == {"role": "assistant", "content": "hi"}
    no_content = {"choices": [{"message": {"role": "assistant", "content": None,
                                           "tool_calls": []}}]}
    assert reply_message(no_content) == {"role": "assistant", "content": "", "tool_calls": []}
    for answer in ({"error": {"message": "overloaded"}}, {"choices": []},
                   {"choices": [{"message": "text"}]}):
        with pytest.raises(EndpointError, match="not a chat completion"):
            reply_message(answer)
