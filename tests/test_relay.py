"""An isolated rollout's network: its own namespace, reaching only the ports it is allowed.

`openforge.sandbox.ports` lists what a rollout may reach (the gateway's port and what its
supervisor's process tree listens on), `openforge.sandbox.relay` carries those ports into the
sandbox, whose PID 1 serves them on 127.0.0.1. Real sockets, real processes, real sandboxes.
The adversarial suite (tests/test_adversarial.py, attack `neighbour`) shows the same through
a whole `openforge run`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_modes import ISOLATING_MODES
from socket_servers import serve

from openforge.harness import Command
from openforge.sandbox import ports
from openforge.sandbox.agent import run_agent
from openforge.sandbox.relay import THREAD_NAME, Relay, socket_name
from openforge.sandbox.view import build_view


def _listener(host: str = "127.0.0.1", family: int = socket.AF_INET) -> socket.socket:
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen(16)
    return server


def _serve(server: socket.socket, reply: bytes | None = None) -> None:
    """Answer each connection with `reply`, or echo what it sends when `reply` is None."""

    def handle(conn: socket.socket) -> None:
        with conn:
            if reply is not None:
                conn.sendall(reply)
                return
            while data := conn.recv(65536):
                conn.sendall(data)

    serve(server, handle)


@pytest.fixture
def child_listening() -> Iterator[tuple[int, int]]:
    """(pid, port) of a child process listening on 127.0.0.1."""
    code = ("import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
            "print(s.getsockname()[1], flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    port = int(proc.stdout.readline())
    yield proc.pid, port
    proc.stdin.close()
    proc.wait()


def test_own_services_are_what_the_process_tree_listens_on(
        child_listening: tuple[int, int]) -> None:
    child, child_port = child_listening
    with _listener() as mine, _listener("0.0.0.0") as wildcard:
        my_port, wildcard_port = mine.getsockname()[1], wildcard.getsockname()[1]
        # The child's tree holds only its own socket; this process's tree holds all three.
        assert ports.own_services(child) == {child_port: "127.0.0.1"}
        found = ports.own_services()
        assert {child_port, my_port, wildcard_port} <= set(found)
    # A socket that no longer listens is no longer listed.
    assert my_port not in ports.own_services()


def test_own_services_find_ipv6_loopback() -> None:
    try:
        server = _listener("::1", socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    with server:
        assert ports.own_services()[server.getsockname()[1]] == "::1"


def test_allowed_is_the_gateway_and_own_services_on_unprivileged_ports(
        child_listening: tuple[int, int]) -> None:
    child, child_port = child_listening
    with _listener() as neighbour:  # this process is not in the child's tree
        url = "http://127.0.0.1:8123/s/tok/v1"
        assert ports.allowed(url, child) == {8123: ("127.0.0.1", 8123),
                                             child_port: ("127.0.0.1", child_port)}
        assert neighbour.getsockname()[1] not in ports.allowed(url, child)
    # A privileged port cannot be listened on inside (no capability left): not carried.
    assert 80 not in ports.allowed("http://127.0.0.1:80/s/tok/v1", child)
    assert ports.gateway("http://localhost/s/t/v1") == ("localhost", 80)
    assert ports.loopback("localhost") and ports.loopback("127.0.0.1") and ports.loopback("::1")
    assert not ports.loopback("10.1.2.3") and not ports.loopback("gateway.svc")


def test_relay_joins_each_unix_socket_to_its_port_until_closed() -> None:
    with _listener() as echo:
        _serve(echo)
        port = echo.getsockname()[1]
        relay = Relay({port: ("127.0.0.1", port)})
        path = relay.directory / socket_name(port)
        with socket.socket(socket.AF_UNIX) as a:
            a.connect(str(path))
            a.sendall(b"x" * 200_000)
            a.shutdown(socket.SHUT_WR)  # a half-close still gets the whole answer
            got = b""
            while data := a.recv(65536):
                got += data
        assert got == b"x" * 200_000
        held = socket.socket(socket.AF_UNIX)
        held.connect(str(path))
        held.sendall(b"ping")
        assert held.recv(4) == b"ping"
        relay.close()
        # Closing ends the connections still open, removes the sockets, leaves no thread.
        assert held.recv(4) == b""
        held.close()
        assert not relay.directory.exists()
        assert [t for t in threading.enumerate() if t.name == THREAD_NAME] == []


def test_relay_to_a_closed_port_closes_the_connection() -> None:
    with _listener() as server:
        port = server.getsockname()[1]
    with Relay({port: ("127.0.0.1", port)}) as relay, socket.socket(socket.AF_UNIX) as conn:
        conn.connect(str(relay.directory / socket_name(port)))
        assert conn.recv(16) == b""


_PROBE = """
import json, socket, sys
out = {}
for name, port in json.loads(sys.argv[1]).items():
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            out[name] = c.recv(64).decode()
    except OSError as exc:
        out[name] = type(exc).__name__
# The sandbox's own loopback works: a server of the agent's, reached by the agent.
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
c = socket.create_connection(s.getsockname()); conn, _ = s.accept(); conn.sendall(b"self")
out["self"] = c.recv(4).decode()
print(json.dumps(out))
"""


@pytest.mark.parametrize("mode", ISOLATING_MODES)
def test_an_isolated_agent_reaches_its_relayed_ports_and_no_other(mode: str,
                                                                  tmp_path: Path) -> None:
    with _listener() as own, _listener() as neighbour:
        _serve(own, b"own service")
        _serve(neighbour, b"neighbour")
        own_port, neighbour_port = own.getsockname()[1], neighbour.getsockname()[1]
        agent = tmp_path / "agent"
        workspace = agent / "workspace"
        workspace.mkdir(parents=True)
        view = build_view(agent, workspace=workspace, programs=[], data=[], protected=[])
        targets = {"own": own_port, "neighbour": neighbour_port}
        with Relay({own_port: ("127.0.0.1", own_port)}) as relay:
            exit_ = run_agent(mode, Command(argv=[sys.executable, "-c", _PROBE,
                                                  json.dumps(targets)], cwd=workspace),
                              env={"PATH": "/usr/bin:/bin"}, view=view, work_dir=tmp_path,
                              stdout=tmp_path / "out", stderr=tmp_path / "err", timeout_s=60,
                              trusted=set(), relay=relay)
    assert exit_.returncode == 0, (tmp_path / "err").read_text()
    seen = json.loads((tmp_path / "out").read_text())
    assert seen == {"own": "own service", "neighbour": "ConnectionRefusedError",
                    "self": "self"}


@pytest.mark.parametrize("mode", ISOLATING_MODES)
def test_without_a_relay_an_isolated_agent_reaches_no_host_port(mode: str,
                                                                 tmp_path: Path) -> None:
    with _listener() as host_service:
        _serve(host_service, b"host")
        port = host_service.getsockname()[1]
        agent = tmp_path / "agent"
        workspace = agent / "workspace"
        workspace.mkdir(parents=True)
        view = build_view(agent, workspace=workspace, programs=[], data=[], protected=[])
        exit_ = run_agent(mode, Command(argv=[sys.executable, "-c", _PROBE,
                                              json.dumps({"host": port})], cwd=workspace),
                          env={"PATH": "/usr/bin:/bin"}, view=view, work_dir=tmp_path,
                          stdout=tmp_path / "out", stderr=tmp_path / "err", timeout_s=60,
                          trusted=set())
    assert exit_.returncode == 0, (tmp_path / "err").read_text()
    assert json.loads((tmp_path / "out").read_text()) == {"host": "ConnectionRefusedError",
                                                          "self": "self"}
