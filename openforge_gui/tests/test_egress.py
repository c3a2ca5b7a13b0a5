"""The browser of a web task reaches the task's own site and the public web, never another
address of the host or its network: the agent drives it through the computer API in real
Chromium (`goto`, a redirect of the task's own site), and a second local server stands for
what the host serves only to itself (a neighbour's service, a metadata service)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from openforge.types import Task
from openforge_gui.computer import ComputerClient
from openforge_gui.egress import EgressProxy, is_public
from openforge_gui.webtasks import WebVoyagerEnvironment

SECRET_HITS: list[str] = []


class _Secret(BaseHTTPRequestHandler):
    """What the host serves to itself alone."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        SECRET_HITS.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html><head><title>Secret</title></head><body>key=hunter2</body></html>")


# A page whose script gathers WebRTC's network candidates (UDP that would bypass the proxy)
# and shows them in its title once done.
RTC_PAGE = b"""<html><head><title>gathering</title></head><body><script>
const found = [];
const pc = new RTCPeerConnection({iceServers: []});
pc.createDataChannel("x");
pc.onicecandidate = e => { if (e.candidate) found.push(e.candidate.candidate);
                           else document.title = "ice:" + JSON.stringify(found); };
pc.createOffer().then(offer => pc.setLocalDescription(offer));
</script></body></html>"""


class _Site(BaseHTTPRequestHandler):
    """The task's own site; `/away?to=URL` redirects anywhere, as open redirects on the web do;
    `/rtc` is `RTC_PAGE`."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/away?to="):
            self.send_response(302)
            self.send_header("Location", self.path.split("=", 1)[1])
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(RTC_PAGE if self.path == "/rtc" else
                         b"<html><head><title>Shop</title></head><body>Blue mug</body></html>")


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    yield from _serve(_Site)


@pytest.fixture(scope="module")
def secret() -> Iterator[str]:
    yield from _serve(_Secret)


def _episode(tmp_path: Path, start: str, **options: Any
             ) -> tuple[WebVoyagerEnvironment, Task, Path, ComputerClient]:
    records = tmp_path / "tasks.jsonl"
    records.write_text(json.dumps({"id": "e1", "web": start, "ques": "Buy a mug."}) + "\n")
    env = WebVoyagerEnvironment(path=str(records), width=400, height=300, **options)
    task = next(iter(env.tasks()))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env.prepare(task, workspace)
    return env, task, workspace, ComputerClient.from_workspace(workspace)


def test_the_browser_reaches_the_tasks_site_but_no_other_address_of_the_host(
        site: str, secret: str, tmp_path: Path) -> None:
    port = secret.rsplit(":", 1)[1]
    SECRET_HITS.clear()
    env, task, workspace, client = _episode(tmp_path, f"{site}/start")
    try:
        attempts = [f"{secret}/direct",                    # goto the host's service
                    f"http://localhost:{port}/by-name",     # the same by a name
                    f"{site}/away?to={secret}/redirected",  # the task's site redirects there
                    f"https://127.0.0.1:{port}/tunnel"]     # a tunnel (CONNECT) to it
        for url in attempts:
            client.act({"type": "goto", "url": url})
        ok = client.act({"type": "goto", "url": f"{site}/other"})
        state = env.final_state(task, workspace)
    finally:
        env.close()
    assert SECRET_HITS == []  # nothing reached it, a redirect's next hop included
    assert ok.ok and state["final_url"] == f"{site}/other" and state["final_title"] == "Shop"
    refused = state["egress_refused"]
    assert refused["count"] == 4
    assert all("not a public address" in why for why in refused["first"])
    assert any("/redirected" in why for why in refused["first"])


def test_allowed_hosts_opens_a_private_origin_the_task_needs(
        site: str, secret: str, tmp_path: Path) -> None:
    SECRET_HITS.clear()
    env, task, workspace, client = _episode(tmp_path, f"{site}/start", allowed_hosts=[secret])
    try:
        client.act({"type": "goto", "url": f"{site}/away?to={secret}/intranet"})
        state = env.final_state(task, workspace)
    finally:
        env.close()
    assert SECRET_HITS == ["/intranet"]
    assert state["final_title"] == "Secret" and "egress_refused" not in state


def test_a_pages_script_gets_no_udp_around_the_proxy(site: str, tmp_path: Path) -> None:
    env, task, workspace, client = _episode(tmp_path, f"{site}/rtc")
    try:
        for _ in range(600):  # until the page's candidate gathering is done (no time bound)
            title = client.observation().title
            if title.startswith("ice:"):
                break
            time.sleep(0.05)
    finally:
        env.close()
    assert json.loads(title.removeprefix("ice:")) == []  # without the switch: udp host ones


def _through(proxy: EgressProxy, head: bytes) -> bytes:
    """What the proxy answers a client that sends `head` (then reads until it closes)."""
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head)
        if head.startswith(b"CONNECT"):  # through the tunnel, once it is up
            answer = sock.recv(4096)
            if not answer.startswith(b"HTTP/1.1 200"):
                return answer
            sock.sendall(b"GET /tunnelled HTTP/1.0\r\n\r\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_the_proxy_tunnels_and_relays_to_an_allowed_origin_only(site: str, secret: str) -> None:
    SECRET_HITS.clear()
    proxy = EgressProxy([site])
    try:
        origin = site.removeprefix("http://")
        tunnelled = _through(proxy, f"CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\n\r\n".encode())
        relayed = _through(proxy, f"GET {site}/page HTTP/1.1\r\nHost: {origin}\r\n"
                                  "Proxy-Connection: keep-alive\r\n\r\n".encode())
        other = secret.removeprefix("http://")
        refused = _through(proxy, f"CONNECT {other} HTTP/1.1\r\n\r\n".encode())
        not_http = _through(proxy, b"GET ftp://example.org/ HTTP/1.1\r\n\r\n")
    finally:
        proxy.close()
    assert tunnelled.startswith(b"HTTP/1.0 200") and b"Blue mug" in tunnelled
    assert relayed.startswith(b"HTTP/1.0 200") and b"Blue mug" in relayed
    assert refused.startswith(b"HTTP/1.1 403") and b"not a public address" in refused
    assert not_http.startswith(b"HTTP/1.1 400")
    assert SECRET_HITS == [] and proxy.refused_count == 1


@pytest.mark.parametrize(("address", "public"), [
    ("93.184.215.14", True), ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", True),
    ("127.0.0.1", False), ("127.8.9.10", False), ("::1", False), ("10.1.2.3", False),
    ("172.16.0.1", False), ("192.168.1.1", False), ("169.254.169.254", False),
    ("100.64.0.1", False), ("0.0.0.0", False), ("::ffff:127.0.0.1", False),
    ("fe80::1%eth0", False), ("fd00::1", False), ("224.0.0.1", False)])
def test_only_public_addresses_count_as_public(address: str, public: bool) -> None:
    assert is_public(address) is public
