"""A mock service: a small real JSON-over-HTTP server on 127.0.0.1, one per rollout.

Each service holds its state as plain JSON (collections of records with an `id`), serves
the generic routes below plus its own actions, and records every request it answers in an
audit log (bounded: see `_MAX_LOG_ENTRIES`). The grader reads both, state and log, from the
environment's final state.

Generic routes (any collection named in the state)::

    GET    /<collection>            list (query ?q=text filters on any field)
    GET    /<collection>/<id>       one record
    POST   /<collection>            create (JSON body; an `id` is assigned)
    PATCH  /<collection>/<id>       update fields
    DELETE /<collection>/<id>       delete
    GET    /                        the service's name and collections

The server runs in a daemon thread of the rollout process (`ThreadingHTTPServer` on port
0, so concurrent rollouts never collide) and dies with it; `stop()` closes the socket.
"""

from __future__ import annotations

import copy
import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

_MAX_BODY = 1_000_000
# The audit log keeps the first requests with their bodies, later ones without (a body can
# be a megabyte), and past `_MAX_LOG_ENTRIES` only counts them (`dropped`), keeping the
# latest as the last entry: checks that need every request (`request_not_made`) fail on a
# log with drops, so flooding a service cannot hide a request from the grader.
_MAX_LOG_BODIES = 500
_MAX_LOG_ENTRIES = 20_000


class ServiceError(Exception):
    """An error answer: HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class MockService:
    """Base of the mock services. Subclasses add actions by overriding `action`."""

    name = "service"
    default_state: dict[str, list[dict[str, Any]]] = {}

    def __init__(self, seed: dict[str, Any] | None = None) -> None:
        state = copy.deepcopy(self.default_state)
        state.update(copy.deepcopy(seed or {}))
        self.state: dict[str, Any] = state
        self.log: list[dict[str, Any]] = []
        self.dropped = 0  # requests answered but not kept in the log
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._server is not None, "the service is not started"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        service = self

        class Handler(_Handler):
            owner = service

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name=f"claw-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def snapshot(self) -> dict[str, Any]:
        """The final state the grader reads: the data and the audit log."""
        with self._lock:
            return {"url": self.url if self._server else None,
                    "state": copy.deepcopy(self.state), "log": list(self.log),
                    "dropped": self.dropped}

    # -- requests --------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, str], body: Any,
               headers: dict[str, str]) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p]
        with self._lock:
            try:
                answer = self.action(method, parts, query, body, headers)
                status, data = (200, answer) if answer is not None else self._generic(
                    method, parts, query, body)
            except ServiceError as exc:
                status, data = exc.status, {"error": str(exc)}
            self._log({"method": method, "path": path, "query": query, "status": status},
                      body)
        return status, data

    def _log(self, entry: dict[str, Any], body: Any) -> None:
        if len(self.log) < _MAX_LOG_BODIES:
            entry["body"] = body
        if len(self.log) < _MAX_LOG_ENTRIES:
            self.log.append(entry)
        else:
            self.dropped += 1
            self.log[-1] = entry

    def action(self, method: str, parts: list[str], query: dict[str, str], body: Any,
               headers: dict[str, str]) -> Any:
        """A service-specific answer, or None to fall through to the generic routes."""
        return None

    def collection(self, name: str) -> list[dict[str, Any]]:
        items = self.state.get(name)
        if not isinstance(items, list):
            raise ServiceError(404, f"no collection {name!r}; collections: "
                                    f"{', '.join(self.collections())}")
        return items

    def collections(self) -> list[str]:
        return sorted(k for k, v in self.state.items() if isinstance(v, list))

    def new_id(self, items: list[dict[str, Any]]) -> Any:
        numeric = [i["id"] for i in items if isinstance(i.get("id"), int)]
        return max(numeric, default=0) + 1

    def find(self, items: list[dict[str, Any]], key: str) -> dict[str, Any]:
        for item in items:
            if str(item.get("id")) == key:
                return item
        raise ServiceError(404, f"no record with id {key}")

    def _generic(self, method: str, parts: list[str], query: dict[str, str],
                 body: Any) -> tuple[int, Any]:
        if not parts:
            if method == "GET":
                return 200, {"service": self.name, "collections": self.collections()}
            raise ServiceError(405, f"{method} / is not allowed")
        items = self.collection(parts[0])
        if len(parts) == 1:
            if method == "GET":
                needle = query.get("q", "").lower()
                rows = [i for i in items if needle in json.dumps(i).lower()] if needle else items
                return 200, rows
            if method == "POST":
                record = self._body_object(body)
                record = {**record, "id": record.get("id", self.new_id(items))}
                items.append(record)
                return 201, record
        elif len(parts) == 2:
            record = self.find(items, parts[1])
            if method == "GET":
                return 200, record
            if method in ("PATCH", "PUT"):
                record.update({k: v for k, v in self._body_object(body).items() if k != "id"})
                return 200, record
            if method == "DELETE":
                items.remove(record)
                return 200, {"deleted": record.get("id")}
        raise ServiceError(405, f"{method} /{'/'.join(parts)} is not allowed")

    @staticmethod
    def _body_object(body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ServiceError(400, "the request body must be a JSON object")
        return body


class _Handler(BaseHTTPRequestHandler):
    owner: MockService
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # the audit log is the record; stderr stays quiet

    def _serve(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body: Any = None
        if length:
            raw = self.rfile.read(min(length, _MAX_BODY))
            try:
                body = json.loads(raw)
            except ValueError:
                self._send(400, {"error": "the request body is not valid JSON"})
                return
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, data = self.owner.handle(self.command, url.path, query, body, headers)
        self._send(status, data)

    def _send(self, status: int, data: Any) -> None:
        payload = (json.dumps(data, indent=1) + "\n").encode()
        self.send_response(status, HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve
