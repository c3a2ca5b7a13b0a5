"""The browser's way out: a forward proxy to the public web and the task's own sites only.

The browser runs on the trusted side, in the environment's process and on the host's
network, and the agent steers it: `goto` opens any http(s) URL, and a page may redirect
anywhere. Unguarded, `goto http://127.0.0.1:PORT/` or `http://169.254.169.254/` (a cloud
machine's credentials) would put in the agent's next screenshot what the host serves only
to itself: its neighbours' services, a metadata service, the LAN. Playwright's request
routing cannot stop that: it never sees a redirect's next hop, so a page that redirects to
127.0.0.1 gets through.

So Chromium sends every request, loopback included (`--proxy-bypass-list=<-loopback>`),
to an `EgressProxy`. It resolves the name itself and connects only to a public address
(`ipaddress`' `is_global`) or to an origin the environment allowed (the task's start page,
`allowed_hosts`). The address it checks is the address it connects to, so a name that
resolves to a public address at the check and a private one at the connect (DNS
rebinding) gets nowhere. Anything else is answered `403` with a line that says why, and
kept in `refused` for the final state.
"""

from __future__ import annotations

import ipaddress
import logging
import selectors
import socket
import socketserver
import threading
from collections.abc import Iterable
from urllib.parse import urlsplit

log = logging.getLogger("openforge_gui.egress")

MAX_HEAD_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 10.0
KEEP_REFUSED = 20  # refusals listed in the final state (all are counted)
# Hop-by-hop headers of the browser's request to the proxy, not for the site.
_HOP_BY_HOP = {b"proxy-connection", b"connection", b"keep-alive", b"proxy-authorization"}


class Refused(Exception):
    """The destination is neither public nor one the environment allowed."""


def is_public(address: str) -> bool:
    """Whether an IP address is on the public internet (not loopback, private, link-local,
    shared or reserved; an IPv4 address mapped into IPv6 counts as itself)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def origin_of(url: str) -> tuple[str, int]:
    """(host, port) of an http(s) URL, the port filled in from the scheme."""
    parts = urlsplit(url)
    default = 443 if parts.scheme == "https" else 80
    return (parts.hostname or "").lower(), parts.port or default


class EgressProxy:
    """A forward proxy on 127.0.0.1 for one browser; see the module for what it lets out."""

    def __init__(self, allowed: Iterable[str] = ()) -> None:
        self.allowed: set[tuple[str, int]] = set()
        for url in allowed:
            self.allow(url)
        self.refused: list[str] = []
        self.refused_count = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.request)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler,
                                                       bind_and_activate=True)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="egress-proxy")
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def chromium_args(self) -> list[str]:
        """Chromium's switches that send all of its traffic through this proxy: TCP through
        the proxy, loopback included, and no UDP of WebRTC's besides (a page's script could
        reach the host's ports with it)."""
        return [f"--proxy-server={self.url}", "--proxy-bypass-list=<-loopback>",
                "--force-webrtc-ip-handling-policy=disable_non_proxied_udp"]

    def allow(self, url: str) -> None:
        """Let the browser reach the origin of `url` whatever its address (the task's own
        site); other schemes (file://) never pass through here."""
        if url.startswith(("http://", "https://")):
            self.allowed.add(origin_of(url))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- one connection from the browser ---------------------------------------------------

    def _serve(self, client: socket.socket) -> None:
        head, rest = _read_head(client)
        if head is None:
            return
        lines = head.split(b"\r\n")
        try:
            method, target, version = lines[0].decode("latin-1").split(" ")
        except ValueError:
            _answer(client, 400, "openforge egress: not an HTTP request")
            return
        try:
            if method == "CONNECT":
                name, _, number = target.rpartition(":")
                upstream = self._connect(name.strip("[]").lower(), int(number), target)
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                parts = urlsplit(target)
                if parts.scheme != "http" or not parts.hostname:
                    _answer(client, 400, f"openforge egress: {target!r} is not an http URL")
                    return
                host, port = origin_of(target)
                upstream = self._connect(host, port, target)
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                headers = [line for line in lines[1:]
                           if line and line.split(b":", 1)[0].strip().lower() not in _HOP_BY_HOP]
                # One request per connection: the site closes after answering, and the
                # browser opens a new connection (checked again) for its next request.
                head = b"\r\n".join([f"{method} {path} {version}".encode("latin-1"), *headers,
                                     b"Connection: close", b"", b""])
                upstream.sendall(head)
        except Refused as exc:
            self._note_refused(str(exc))
            _answer(client, 403, f"openforge egress: {exc}")
            return
        except (OSError, ValueError) as exc:
            _answer(client, 502, f"openforge egress: cannot reach {target}: {exc}")
            return
        with upstream:
            if rest:
                upstream.sendall(rest)
            _relay(client, upstream)

    def _connect(self, host: str, port: int, target: str) -> socket.socket:
        if (host, port) in self.allowed:
            return socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        for *_, address in infos:
            if not is_public(str(address[0])):
                raise Refused(f"{target} is at {address[0]}, not a public address; the browser "
                              "reaches the public web and the task's own sites only")
        last: OSError | None = None
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            sock.settimeout(CONNECT_TIMEOUT_S)
            try:
                sock.connect(address)  # the address checked above, not the name again
            except OSError as exc:
                sock.close()
                last = exc
                continue
            return sock
        raise last or OSError(f"{host} has no address")

    def _note_refused(self, why: str) -> None:
        log.info("egress refused: %s", why)
        with self._lock:
            self.refused_count += 1
            if len(self.refused) < KEEP_REFUSED:
                self.refused.append(why)


def _read_head(sock: socket.socket) -> tuple[bytes | None, bytes]:
    """The request head (without its blank line) and whatever came after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            _answer(sock, 431, "openforge egress: request head too large")
            return None, b""
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _answer(sock: socket.socket, status: int, text: str) -> None:
    body = (text + "\n").encode()
    reason = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large",
              502: "Bad Gateway"}[status]
    try:
        sock.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    except OSError:
        pass


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    a.settimeout(None)
    b.settimeout(None)
    with selectors.DefaultSelector() as sel:
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        while True:
            for key, _ in sel.select():
                source: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    chunk = source.recv(65536)
                    if not chunk:
                        return
                    key.data.sendall(chunk)
                except OSError:
                    return
