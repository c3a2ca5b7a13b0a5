"""The trusted end of a task's tools: routes each call to its mock service, records it.

Claw-Eval's runner sends a tool call as an HTTP request to the tool's endpoint (JSON body =
the call's arguments) and writes a `ToolDispatch` to the trace: tool name, endpoint URL,
request body, response status and body, latency. The graders read those dispatches
(`dispatches`). Here the same happens in the environment's process, outside the agent's
reach: the agent's MCP server or `claw-tool` command (`bridge.py`) only forwards the call
to this proxy, so what the grader reads is what actually happened.

Routes (127.0.0.1, a free port; for the bridge, and harmless to call directly):

    GET  /tools          {"tools": [{name, description, input_schema}, ...]}
    POST /call/<tool>    body: the arguments object
                         -> {"status": <the service's HTTP status>, "body": <its JSON>}

Exactly as Claw-Eval's dispatcher: an unknown tool is a 404 dispatch with an empty
endpoint; a service that fails or answers with something other than JSON is a 500
dispatch whose body is `{"error": "..."}`.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from openforge_claw.claweval.spec import ToolEndpoint, ToolSpec

MAX_BODY = 1_000_000
MAX_DISPATCHES = 5_000
_CALL_TIMEOUT_S = 30.0


class ToolProxy:
    """The task's tools for one rollout; `dispatches` is what Claw-Eval's grader reads."""

    def __init__(self, tools: list[ToolSpec], endpoints: list[ToolEndpoint]) -> None:
        self.tools = tools
        self.endpoints = {e.tool_name: e for e in endpoints}
        self.dispatches: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._client = httpx.Client(trust_env=False, timeout=_CALL_TIMEOUT_S)

    @property
    def url(self) -> str:
        assert self._server is not None, "the tool proxy is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> None:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="claw-eval-tools",
                         daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._client.close()

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Route one call and record its dispatch; returns the dispatch."""
        endpoint = self.endpoints.get(name)
        started = time.monotonic()
        if endpoint is None:
            status, body, url = 404, {"error": f"unknown tool '{name}'"}, ""
        else:
            url = endpoint.url
            try:
                response = self._client.request(endpoint.method, url, json=arguments)
                status, body = response.status_code, response.json()
            except Exception as exc:  # what Claw-Eval's dispatcher does with any failure
                status, body = 500, {"error": str(exc)}
        dispatch = {"tool_use_id": f"call_{len(self.dispatches)}", "tool_name": name,
                    "endpoint_url": url, "request_body": arguments, "response_status": status,
                    "response_body": body,
                    "latency_ms": (time.monotonic() - started) * 1000 if endpoint else 0.0,
                    "timestamp": datetime.now(UTC).isoformat()}
        with self._lock:
            if len(self.dispatches) < MAX_DISPATCHES:
                self.dispatches.append(dispatch)
        return dispatch


class _Handler(BaseHTTPRequestHandler):
    owner: ToolProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib's name)
        pass  # the dispatches are the log

    def _answer(self, status: int, payload: Any) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (stdlib's name)
        if self.path.rstrip("/") == "/tools":
            self._answer(200, {"tools": [t.model_dump() for t in self.owner.tools]})
        else:
            self._answer(404, {"error": f"no route {self.path}; GET /tools, POST /call/<tool>"})

    def do_POST(self) -> None:  # noqa: N802 (stdlib's name)
        if not self.path.startswith("/call/"):
            self._answer(404, {"error": f"no route {self.path}; POST /call/<tool>"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                         {"error": f"arguments over {MAX_BODY} bytes"})
            return
        try:
            arguments = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            self._answer(400, {"error": f"the arguments are not JSON: {exc}"})
            return
        if not isinstance(arguments, dict):
            self._answer(400, {"error": "the arguments must be a JSON object"})
            return
        dispatch = self.owner.call(self.path[len("/call/"):], arguments)
        self._answer(200, {"status": dispatch["response_status"],
                           "body": dispatch["response_body"]})
