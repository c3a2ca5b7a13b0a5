"""The loopback ports an isolated rollout's agent may reach: `allowed(session_url)`.

An isolating sandbox has a network namespace of its own (only `lo`, nothing of the host's), so
the agent cannot connect to what a neighbour rollout or the host listens on 127.0.0.1 — a
neighbour's mock services hold state its grader reads. It still needs exactly two kinds of
port, which `openforge.sandbox.relay` carries into the sandbox:

- the gateway's, from the session URL the harness is given;
- the ports its own environment's services listen on: whatever this supervisor process, or a
  process it started, listens on at launch time (after `prepare`), found by matching the
  listening sockets in /proc/net/tcp{,6} with the socket descriptors those processes hold.
  Services may be threads of the supervisor or child processes (e.g. a mock server started by
  the environment), so both count; a socket the supervisor did not open is never listed.

Only unprivileged ports (1024 and up) are carried: inside, the sandbox's PID 1 has no
capability left to listen on a lower one (`UNPRIVILEGED`).
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

import psutil

_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp
UNPRIVILEGED = 1024  # the lowest port a process without CAP_NET_BIND_SERVICE may listen on


def _address(hex_ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} writes it (32-bit words in host byte order)."""
    raw = bytes.fromhex(hex_ip)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def _reachable_on_loopback(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return ip.is_loopback or ip.is_unspecified


def listening(proc_net: str = "/proc/net") -> dict[int, tuple[str, int]]:
    """Socket inode -> (loopback host, port) for each TCP socket listening where 127.0.0.1 or
    ::1 reaches it (a loopback address or the wildcard)."""
    found: dict[int, tuple[str, int]] = {}
    for name, host in (("tcp", "127.0.0.1"), ("tcp6", "::1")):
        try:
            with open(f"{proc_net}/{name}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            hex_ip, hex_port = fields[1].split(":")
            ip = _address(hex_ip)
            if not _reachable_on_loopback(ip):
                continue
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                host = "127.0.0.1"
            found[int(fields[9])] = (host, int(hex_port, 16))
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def own_services(pid: int | None = None) -> dict[int, str]:
    """Port -> loopback host, for every port that process `pid` (default: this one) or one of
    its descendants listens on."""
    root = psutil.Process(pid)
    pids = {root.pid}
    try:
        pids |= {p.pid for p in root.children(recursive=True)}
    except psutil.Error:
        pass
    held: set[int] = set()
    for each in pids:
        held |= _socket_inodes(each)
    ports: dict[int, str] = {}
    for inode, (host, port) in listening().items():
        if inode in held:
            ports.setdefault(port, host)
    return ports


def loopback(host: str) -> bool:
    """Whether `host` is this machine's loopback: the one a sandbox's relayed ports serve."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def gateway(session_url: str) -> tuple[str, int]:
    """The gateway's (host, port), from the session URL."""
    url = urlsplit(session_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    return url.hostname or "127.0.0.1", port


def allowed(session_url: str, pid: int | None = None) -> dict[int, tuple[str, int]]:
    """Port inside the sandbox -> where on the host it leads: the gateway's port and each of
    this supervisor's own services (see the module docstring). Inside, the sandbox serves
    them on loopback only: a gateway elsewhere (`loopback` false) stays out of its reach."""
    ports = {port: (host, port) for port, host in own_services(pid).items()}
    host, port = gateway(session_url)
    ports[port] = (host, port)
    return {port: target for port, target in ports.items() if port >= UNPRIVILEGED}
