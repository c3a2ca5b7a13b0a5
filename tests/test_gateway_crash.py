"""Crash safety: a gateway process under load, with injected engine errors and clients that
hang up, is killed with SIGKILL and restarted on the same store.

Afterwards the store must hold exactly one successful call per response a client fully
received (compared by the sha256 of each request body, which is unique per request), one
failed call per 503 a client received, and nothing else: no call recorded twice, nothing
recorded for requests whose client left or whose gateway died before answering.

Requests go out in rounds (every client sends one request, all wait for the answers), and
the kill lands in the middle of a round, while every request of that round is inside the
engine's `delay_s`: a call is recorded right after its last byte is written, so a kill
between those two instants could be told from neither side; the rounds keep the test
about the gateway's guarantees, not about that instant.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from openforge.store import Store

ADMIN_KEY = "crash-test-admin-key"
DELAY_S = 0.4
CLIENTS = 8
ENTRIES = [{"match": "explode", "replies": [{"error": "injected failure", "status": 503}]},
           {"replies": [{"content": "fine"}]}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Gateway:
    process: subprocess.Popen[bytes]
    url: str


def start(store_path: Path, log_path: Path) -> Gateway:
    port = free_port()
    cmd = [sys.executable, "-m", "openforge.gateway.server", "--store", str(store_path),
           "--engine", "scripted", "--model", "tiny", "--port", str(port),
           "--keepalive", "0.05",
           "--option", f"delay_s={DELAY_S}", "--option", f"entries={json.dumps(ENTRIES)}"]
    env = {**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY}  # never on argv
    with open(log_path, "ab") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"gateway exited: {log_path.read_text()[-2000:]}")
        try:
            r = httpx.get(f"{url}/admin/health", headers={"authorization": f"Bearer {ADMIN_KEY}"})
            if r.status_code == 200:
                return Gateway(process, url)
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    raise AssertionError("gateway did not start in 120 s")


@dataclass
class Tally:
    """What the clients saw, by sha256 of the exact request body sent."""

    received: set[str] = field(default_factory=set)  # full 200 responses
    failed: set[str] = field(default_factory=set)  # full 503 answers
    abandoned: int = 0  # the client hung up on purpose
    lost: int = 0  # the gateway died under the request


async def one_request(h: httpx.AsyncClient, url: str, token: str, client: int, n: int,
                      tally: Tally) -> None:
    # 0,1: plain; 2: stream; 3: stream, hang up early; 4: injected engine error
    kind = (client + n) % 5
    if (client * 3 + n) % 7 == 0:
        kind = 5  # not streaming, hang up early
    text = f"{'explode' if kind == 4 else 'hello'} from {client}-{n}"
    body = {"model": "policy", "messages": [{"role": "user", "content": text}],
            "stream": kind in (2, 3)}
    raw = json.dumps(body).encode()
    digest = hashlib.sha256(raw).hexdigest()
    headers = {"content-type": "application/json", "authorization": f"Bearer {token}"}
    endpoint = f"{url}/v1/chat/completions"
    try:
        if kind in (2, 3):
            async with h.stream("POST", endpoint, content=raw, headers=headers) as r:
                chunks = []
                async for chunk in r.aiter_bytes():
                    if kind == 3:
                        tally.abandoned += 1
                        return  # leaving the block closes the connection mid-stream
                    chunks.append(chunk)
                if r.status_code == 200 and b"data: [DONE]" in b"".join(chunks):
                    tally.received.add(digest)
                return
        timeout = 0.1 if kind == 5 else 30
        try:
            r = await h.post(endpoint, content=raw, headers=headers, timeout=timeout)
        except httpx.ReadTimeout:
            if kind == 5:
                tally.abandoned += 1
                return
            raise
        if r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "fine":
            tally.received.add(digest)
        elif r.status_code == 503:
            tally.failed.add(digest)
        else:
            raise AssertionError(f"unexpected answer {r.status_code}: {r.text[:200]}")
    except httpx.TransportError:
        tally.lost += 1


async def run_rounds(url: str, tokens: list[str], rounds: range, tally: Tally,
                     kill: subprocess.Popen[bytes] | None = None) -> None:
    """Rounds of one request per client; with `kill`, SIGKILL it mid-way through the last."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=30) as h:
        for n in rounds:
            batch = [one_request(h, url, token, i, n, tally) for i, token in enumerate(tokens)]
            if kill is not None and n == rounds[-1]:
                async def killer() -> None:
                    await asyncio.sleep(DELAY_S / 2)
                    os.kill(kill.pid, signal.SIGKILL)
                batch.append(killer())
            await asyncio.gather(*batch)


def test_kill_9_under_load_loses_and_doubles_nothing(tmp_path: Path) -> None:
    store_path, log_path = tmp_path / "crash.sqlite", tmp_path / "gateway.log"
    gw = start(store_path, log_path)
    try:
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        tokens = [httpx.post(f"{gw.url}/admin/sessions", headers=admin,
                             json={"run_id": "crash"}).json()["token"] for _ in range(CLIENTS)]
        tally = Tally()
        asyncio.run(run_rounds(gw.url, tokens, range(0, 4), tally, kill=gw.process))
        assert gw.process.wait(timeout=10) == -signal.SIGKILL
        assert tally.lost > 0  # requests of the last round died with the gateway
        gw = start(store_path, log_path)
        asyncio.run(run_rounds(gw.url, tokens, range(4, 8), tally))
    finally:
        gw.process.send_signal(signal.SIGTERM)
        gw.process.wait(timeout=30)

    assert tally.abandoned > 0 and tally.failed and tally.received
    store = Store(store_path)
    try:
        calls = list(store.iter_calls(run_id="crash"))
        ok = [c.body_digest for c in calls if c.status == "ok"]
        failed = [c.body_digest for c in calls if c.status == "failed"]
        assert len(ok) == len(set(ok)) == len(tally.received)
        assert set(ok) == tally.received
        assert len(failed) == len(set(failed)) and set(failed) == tally.failed
        assert len({c.id for c in calls}) == len(calls)
        for session in store.list_sessions(run_id="crash"):
            indices = [c.index for c in store.list_calls(session.id)]
            assert indices == list(range(len(indices)))  # numbering resumed after the restart
    finally:
        store.close()
