"""`gateway.workers = N`: N processes on one store, each session served by exactly one.

Real worker processes (`python -m openforge.gateway.server --worker I ...`) started by a
`Gateway` in this process, the scripted engine in each, one SQLite store. Also: the gateway
process imports no torch with a remote engine, and hands memory back after a large request.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from openforge.config import EngineConfig, GatewayConfig
from openforge.gateway.server import Gateway
from openforge.gateway.sessions import worker_of
from openforge.store import Store

CHAT = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[tuple[Gateway, Store]]:
    store = Store(tmp_path / "workers.sqlite")
    engine = EngineConfig(name="scripted", model="tiny",
                          options={"replies": [{"content": "ok"}]})
    gw = Gateway(GatewayConfig(workers=2, admin_key="workers-admin"), engine, store)
    await gw.start()
    try:
        yield gw, store
    finally:
        await gw.stop()
        store.close()


async def recorded(store: Store, session_id: str, n: int) -> None:
    """Until the session has `n` calls: a worker records a call just after its last byte."""
    for _ in range(300):
        if store.count_calls(session_id=session_id) >= n:
            return
        await asyncio.sleep(0.05)


async def chat(url: str, token: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as h:
        return await h.post(f"{url}/s/{token}/v1/chat/completions", json=CHAT)


async def test_each_session_is_served_by_one_worker(pool: tuple[Gateway, Store]) -> None:
    gw, store = pool
    urls = gw.worker_urls
    assert len(urls) == 2 and len(set(urls)) == 2 and len(set(gw.pids())) == 2
    for pid in gw.pids():  # secrets travel in the environment, never on a command line
        assert "workers-admin" not in " ".join(psutil.Process(pid).cmdline())
    sessions = [gw.open_session(task_id=f"t{i}") for i in range(6)]
    # Opened on the least loaded worker: the sessions spread evenly.
    owners = [worker_of(s.id, 2) for s in sessions]
    assert sorted(owners) == [0, 0, 0, 1, 1, 1]
    for s in sessions:
        own = gw.url_for(s)
        assert own == urls[worker_of(s.id, 2)]
        assert gw.session_url(s) == f"{own}/s/{s.token}/v1"
        for _ in range(2):
            assert (await chat(own, s.token)).status_code == 200
        # The other worker refuses it: the session's state lives in one process only.
        other = urls[1 - worker_of(s.id, 2)]
        r = await chat(other, s.token)
        assert r.status_code == 421 and "another gateway worker" in r.text
    for s in sessions:
        await recorded(store, s.id, 2)
        assert [c.index for c in store.list_calls(s.id)] == [0, 1]
    headers = {"authorization": "Bearer workers-admin"}
    async with httpx.AsyncClient(timeout=30) as h:
        cached = [(await h.get(f"{u}/admin/health", headers=headers)).json() for u in urls]
    assert [c["open_sessions_cached"] for c in cached] == [3, 3]
    assert [c["worker"] for c in cached] == [0, 1]
    # Each worker counts its own sessions' calls; the gateway adds them up.
    assert [(c["served"]["ok"], c["served"]["refused"]) for c in cached] == [(6, 3), (6, 3)]
    served = await gw.served()
    assert (served["ok"], served["refused"], served["refused_by_status"]) == (12, 6, {"421": 6})
    assert served["cpu_s"] >= sum(c["served"]["cpu_s"] for c in cached) > 0


async def test_admin_routes_reach_every_worker(pool: tuple[Gateway, Store]) -> None:
    gw, store = pool
    urls = gw.worker_urls
    headers = {"authorization": "Bearer workers-admin"}
    async with httpx.AsyncClient(timeout=30) as h:
        # Opened through worker 0's admin API: base_url names the worker that serves it.
        opened = [(await h.post(f"{urls[0]}/admin/sessions", headers=headers, json={})).json()
                  for _ in range(2)]
        assert {o["base_url"].split("/s/")[0] for o in opened} == set(urls)
        for o in opened:
            assert (await h.post(f"{o['base_url']}/chat/completions", json=CHAT,
                                 headers={"authorization": f"Bearer {o['token']}"})
                    ).status_code == 200
        # Pause on one worker pauses all; resume likewise.
        assert (await h.post(f"{urls[1]}/admin/pause", headers=headers,
                             json={"retry_after": 7})).status_code == 200
        for o in opened:
            r = await h.post(f"{o['base_url']}/chat/completions", json=CHAT,
                             headers={"authorization": f"Bearer {o['token']}"})
            assert r.status_code == 429 and r.headers["retry-after"] == "7"
        assert (await h.post(f"{urls[0]}/admin/resume", headers=headers)).status_code == 200
        # Closing through any worker revokes the token where the session is served.
        for o in opened:
            assert (await h.post(f"{urls[0]}/admin/sessions/{o['id']}/close",
                                 headers=headers)).status_code == 200
            r = await h.post(f"{o['base_url']}/chat/completions", json=CHAT,
                             headers={"authorization": f"Bearer {o['token']}"})
            assert r.status_code == 401
    # In process, as the runner closes its sessions.
    s = gw.open_session()
    assert (await chat(gw.url_for(s), s.token)).status_code == 200
    assert gw.close_session(s.id) is not None
    assert (await chat(gw.url_for(s), s.token)).status_code == 401
    gw.pause(3)
    t = gw.open_session()
    assert (await chat(gw.url_for(t), t.token)).status_code == 429
    gw.resume()
    assert (await chat(gw.url_for(t), t.token)).status_code == 200


async def test_scoring_routes_on_any_worker_and_a_seal_reaches_the_serving_one(
        pool: tuple[Gateway, Store]) -> None:
    """Hashed tokens keep each session on its worker; any worker answers the scoring routes,
    and a seal sent to the other one still revokes the token where the session is served."""
    gw, store = pool
    urls = gw.worker_urls
    sessions = [gw.open_session() for _ in range(2)]
    assert {worker_of(s.id, 2) for s in sessions} == {0, 1}
    for s in sessions:
        assert (await chat(gw.url_for(s), s.token)).status_code == 200
        assert (await chat(urls[1 - worker_of(s.id, 2)], s.token)).status_code == 421
        await recorded(store, s.id, 1)
        stored = store.get_session(s.id)
        assert stored is not None and stored.token == "" and stored.token_hash != s.token
    async with httpx.AsyncClient(timeout=30) as h:
        for s in sessions:
            own = worker_of(s.id, 2)
            scoring = {"authorization": f"Bearer {s.scoring_token}"}
            for url in urls:  # either worker reads the shared store
                r = await h.get(f"{url}/scoring/sessions/{s.id}/calls", headers=scoring)
                assert r.status_code == 200 and len(r.json()["calls"]) == 1
                refused = await h.get(f"{url}/scoring/sessions/{s.id}/calls",
                                      headers={"authorization": f"Bearer {s.token}"})
                assert refused.status_code == 401
            # Sealed through the worker that does not serve it.
            sealed = await h.post(f"{urls[1 - own]}/scoring/sessions/{s.id}/seal",
                                  headers=scoring)
            assert sealed.status_code == 200
            assert (await chat(urls[own], s.token)).status_code == 401


async def test_a_dead_worker_comes_back_and_its_sessions_continue(
        pool: tuple[Gateway, Store]) -> None:
    gw, store = pool
    s = gw.open_session()
    url = gw.url_for(s)
    assert (await chat(url, s.token)).status_code == 200
    await recorded(store, s.id, 1)  # not killed between its answer and its row
    victim = gw.pids()[worker_of(s.id, 2)]
    psutil.Process(victim).kill()
    deadline = time.monotonic() + 120
    while True:
        try:
            r = await chat(url, s.token)
            if r.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the worker did not come back"
        await asyncio.sleep(0.5)
    assert victim not in gw.pids()
    await recorded(store, s.id, 2)
    assert [c.index for c in store.list_calls(s.id)] == [0, 1]


def test_the_gateway_process_imports_no_torch(tmp_path: Path) -> None:
    """A gateway in front of a remote engine: tokenizer and renderer only."""
    script = f"""
import sys
from openforge.config import GatewayConfig
from openforge.gateway.app import create_app
from openforge.gateway.engines.vllm import VLLMEngine
from openforge.gateway.model import load_model_bundle
from openforge.gateway.state import GatewayState
from openforge.store import Store
bundle = load_model_bundle("tiny")
engine = VLLMEngine(bundle, url="http://127.0.0.1:9")
create_app(GatewayState(GatewayConfig(), Store({str(tmp_path / 's.sqlite')!r}), engine, bundle))
heavy = sorted(m for m in ("torch", "transformers", "safetensors") if m in sys.modules)
print(",".join(heavy) or "none")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "none"


def test_memory_returns_after_a_large_request(tmp_path: Path) -> None:
    """RSS after a 24 MB request comes back near what it was before it."""
    port_file = tmp_path / "port"
    code = f"""
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
open({str(port_file)!r}, "w").write(str(port))
from openforge.gateway.server import main
main(["--store", {str(tmp_path / 'm.sqlite')!r}, "--engine", "scripted", "--model", "tiny",
      "--port", str(port), "--option", 'replies=[{{"content": "ok"}}]'])
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                            env={**os.environ, "OPENFORGE_ADMIN_KEY": "k"})  # never on argv
    try:
        base = _wait_up(proc, port_file)
        headers = {"authorization": "Bearer k"}
        token = httpx.post(f"{base}/admin/sessions", headers=headers, json={}).json()["token"]
        small = httpx.post(f"{base}/s/{token}/v1/chat/completions", json=CHAT, timeout=60)
        assert small.status_code == 200
        before = psutil.Process(proc.pid).memory_info().rss
        big = json.dumps({"model": "m", "messages": [
            {"role": "user", "content": "hello world, this is some text. " * 750_000}]})
        r = httpx.post(f"{base}/s/{token}/v1/chat/completions", content=big, timeout=120,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400  # far beyond the tiny model's context
        # The memory is handed back once the call is done (just after its answer).
        for _ in range(100):
            after = psutil.Process(proc.pid).memory_info().rss
            if after - before < len(big) // 2:
                break
            time.sleep(0.1)
        assert after - before < len(big) // 2, (before >> 20, after >> 20)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_says_what_its_workers_served_when_it_stops(tmp_path: Path) -> None:
    # Port 0: each worker binds a free port of its own (a fixed port P would take P + 1 too,
    # which a concurrent test may hold); the banner names them.
    proc = subprocess.Popen(
        [sys.executable, "-m", "openforge.gateway.server", "--store", str(tmp_path / "w.sqlite"),
         "--engine", "scripted", "--model", "tiny", "--port", "0", "--workers", "2",
         "--option", 'replies=[{"content": "ok"}]'],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "OPENFORGE_ADMIN_KEY": "k"})
    try:
        assert proc.stdout is not None
        banner = ""
        while not banner.startswith("openforge gateway on "):
            ready, _, _ = select.select([proc.stdout], [], [], 300)  # a hang, not a timing
            assert ready, "the gateway printed no banner"
            banner = proc.stdout.readline()
            assert banner, "the gateway exited before serving"
        base = banner.split()[3]
        headers = {"authorization": "Bearer k"}
        for _ in range(4):  # opened on alternating workers
            opened = httpx.post(f"{base}/admin/sessions", headers=headers, json={}).json()
            url = f"{opened['base_url']}/chat/completions"
            assert httpx.post(url, json=CHAT, timeout=60).status_code == 200
            assert httpx.post(url, content=b"[", timeout=60).status_code == 400
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    last = out.strip().splitlines()[-1]
    assert last.startswith("gateway stopped; calls: 4 answered and 0 failed (both recorded), "
                           "4 refused (4 x 400), 0 abandoned by their client; "), last
    assert re.search(r"CPU \d+\.\d s, \d+\.\d\d ms per recorded call$", last), last


def _wait_up(proc: subprocess.Popen[Any], port_file: Path) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the gateway exited"
        if port_file.exists() and port_file.read_text():
            base = f"http://127.0.0.1:{port_file.read_text()}"
            try:
                if httpx.get(f"{base}/admin/health",
                             headers={"authorization": "Bearer k"}).status_code == 200:
                    return base
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    raise AssertionError("the gateway did not start")



