"""A task's own service program (`services: [{name, command}]`): started on a free loopback
port of its own, its `/state` snapshotted for the grader, its whole process group ended."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import psutil
import pytest

from openforge_claw.services import Services, ServiceSpec

# A service program as a task would ship it: the port from argv ({port}) and PORT must agree,
# and it starts a child (a grandchild of ours) that stop() must end with it.
SERVER = """
import json, os, subprocess, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

port = int(sys.argv[1])
assert port == int(os.environ["PORT"]), "argv and PORT disagree"
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
with open("child.pid", "w") as f:
    f.write(str(child.pid))

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"path": self.path, "greeting": os.environ["GREETING"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def _spec(command: str) -> ServiceSpec:
    return ServiceSpec(name="shop", command=command, state_path="/state",
                       env={"GREETING": "hello"})


def test_a_command_service_starts_answers_snapshots_and_ends_with_its_children(
        tmp_path: Path) -> None:
    (tmp_path / "server.py").write_text(SERVER)
    spec = _spec(f"{sys.executable} server.py {{port}}")
    assert spec.resolved_kind == "command"
    services, other = Services(), Services()
    urls = services.start([spec], tmp_path)
    try:
        # Two rollouts of the same task: each gets its own port, never the same one.
        other_dir = tmp_path / "other"
        other_dir.mkdir()
        (other_dir / "server.py").write_text(SERVER)
        other_urls = other.start([spec], other_dir)
        assert urls["shop"] != other_urls["shop"]
        assert httpx.get(urls["shop"] + "/items").json() == {"path": "/items",
                                                             "greeting": "hello"}
        assert services.snapshot() == {"shop": {
            "url": urls["shop"], "state": {"path": "/state", "greeting": "hello"}, "log": []}}
        child = psutil.Process(int((tmp_path / "child.pid").read_text()))
        assert child.is_running()
    finally:
        services.stop()
        other.stop()
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    with pytest.raises(httpx.HTTPError):
        httpx.get(urls["shop"] + "/items", timeout=2.0)


def test_a_command_that_exits_before_it_is_ready_is_a_clear_error(tmp_path: Path) -> None:
    spec = _spec(f"{sys.executable} -c 'raise SystemExit(3)'")
    services = Services()
    with pytest.raises(RuntimeError, match=r"service 'shop' exited with code 3 before it was "
                                           r"ready"):
        services.start([spec], tmp_path)
    assert services.running == []
