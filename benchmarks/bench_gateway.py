"""Gateway overhead, recording rate and token-cache memory (prints; asserts nothing about time).

Three processes, as in production: an engine stand-in (aiohttp, fixed latency), the gateway
(`python -m openforge.gateway.server`, the `vllm` engine pointed at the stand-in), and this
load generator (aiohttp). Measured in one run:

1. Overhead: 64 concurrent sessions x 20-turn agent conversations (the model calls a tool,
   the harness sends its output back, the history grows), non-streaming, through the
   gateway vs. straight to the stand-in's own chat endpoint (same 20 ms latency): p50
   latency ratio and throughput ratio; the gateway's CPU ms/call.
2. Recording rate: the gateway with the in-process `scripted` engine (instant): recorded
   calls per second of gateway CPU time, i.e. on one core.
3. Memory: bytes of cached session token ids per cached token (`SessionTokens.nbytes()`).

Ends with a summary: each figure, its target (issue 3) and whether it was met.

    python benchmarks/bench_gateway.py [--quick] [--sessions N] [--turns N] [--latency-ms N]
                                       [--profile PREFIX]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import aiohttp
import psutil

ADMIN_KEY = "bench-admin-key"
SHELL = {"type": "function", "function": {
    "name": "shell", "description": "Run a shell command in the workspace.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                   "required": ["cmd"]}}}
TOOL_ARGS = {"cmd": "pytest -q"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the engine stand-in (runs in its own process) ---------------------------------------------


def run_standin(port: int, latency_s: float) -> None:
    """vLLM's token endpoint and an OpenAI chat endpoint, each answering after `latency_s`."""
    from aiohttp import web

    from openforge.gateway.conversation import Message, Tool, ToolCall
    from openforge.gateway.model import load_model_bundle
    from openforge.gateway.render import assistant_turn_ids

    bundle = load_model_bundle("tiny")
    call = ToolCall(id="call_1", name="shell", arguments=json.dumps(TOOL_ARGS))
    ids = assistant_turn_ids(bundle, [], Message(role="assistant", content="", tool_calls=[call]),
                             [Tool(name="shell", parameters=SHELL["function"]["parameters"])])
    generated = {"choices": [{"token_ids": ids, "finish_reason": "stop",
                              "logprobs": {"content": [{"logprob": -0.5} for _ in ids]}}],
                 "weight_versions": ["bench"]}
    chat = {"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "policy",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "shell", "arguments": json.dumps(TOOL_ARGS)}}]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": len(ids), "total_tokens": 10}}
    generated_body, chat_body = json.dumps(generated), json.dumps(chat)

    async def generate(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(latency_s)
        return web.Response(text=generated_body, content_type="application/json")

    async def chat_completions(request: web.Request) -> web.Response:
        await request.json()  # a real server parses what it is sent
        await asyncio.sleep(latency_s)
        return web.Response(text=chat_body, content_type="application/json")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/inference/v1/generate", generate)
    app.router.add_post("/v1/chat/completions", chat_completions)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# --- processes ---------------------------------------------------------------------------------


def wait_http(url: str, process: subprocess.Popen[bytes], headers: dict[str, str] | None = None
              ) -> None:
    import urllib.request

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"a benchmark process exited early with {process.returncode}")
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=2):
                return
        except Exception:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def start_standin(latency_s: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    p = subprocess.Popen([sys.executable, __file__, "--standin", str(port), "--latency-ms",
                          str(latency_s * 1000)])
    url = f"http://127.0.0.1:{port}"
    # aiohttp answers 405 to GET on a POST route: the server is up.
    import urllib.error
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            import urllib.request
            urllib.request.urlopen(f"{url}/v1/chat/completions", timeout=2)
        except urllib.error.HTTPError:
            return p, url
        except Exception:
            if p.poll() is not None:
                raise SystemExit("the engine stand-in exited early") from None
            time.sleep(0.2)
    raise SystemExit("the engine stand-in did not come up")


def start_gateway(store: Path, engine_args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "openforge.gateway.server", "--store", str(store),
                          "--model", "tiny", "--port", str(port), "--admin-key", ADMIN_KEY,
                          *engine_args], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/admin/health", p, {"Authorization": f"Bearer {ADMIN_KEY}"})
    return p, url


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


# --- load ---------------------------------------------------------------------------------------


@dataclass
class Load:
    latencies: list[float]
    wall_s: float
    calls: int

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1000

    @property
    def rps(self) -> float:
        return self.calls / self.wall_s


async def open_sessions(url: str, n: int) -> list[str]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as h:
        tokens = []
        for i in range(n):
            async with h.post(f"{url}/admin/sessions", json={"run_id": "bench",
                                                             "task_id": f"t{i}"}) as r:
                tokens.append((await r.json())["token"])
        return tokens


async def drive(endpoints: list[str], tokens: list[str], turns: int) -> Load:
    """One conversation per endpoint, all at once, each `turns` calls with a growing history."""
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)

    async def conversation(h: aiohttp.ClientSession, endpoint: str, token: str, k: int) -> None:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a coding agent. Work step by step."},
            {"role": "user", "content": f"Task {k}: refactor module {k} and run its tests."}]
        headers = {"Authorization": f"Bearer {token}"}
        for turn in range(turns):
            body = {"model": "policy", "messages": messages, "tools": [SHELL], "max_tokens": 128}
            t0 = time.perf_counter()
            async with h.post(endpoint, json=body, headers=headers) as r:
                data = await r.json()
                if r.status != 200:
                    raise SystemExit(f"benchmark request failed: {r.status} {data}")
            latencies.append(time.perf_counter() - t0)
            message = data["choices"][0]["message"]
            calls = message.get("tool_calls") or []
            messages.append({"role": "assistant", "content": message.get("content") or "",
                             "tool_calls": calls})
            for tc in calls:  # the harness runs the tool and sends its output back
                messages.append({"role": "tool", "tool_call_id": tc["id"],
                                 "content": f"step {turn}: 12 passed, {turn} warnings\n" * 4})

    async with aiohttp.ClientSession(connector=connector) as h:
        t0 = time.perf_counter()
        await asyncio.gather(*(conversation(h, e, t, k)
                               for k, (e, t) in enumerate(zip(endpoints, tokens, strict=True))))
        wall = time.perf_counter() - t0
    return Load(latencies, wall, len(latencies))


class Profiler:
    """`py-spy record` attached to a process while a phase runs (`--profile PREFIX`).

    Writes collapsed stacks (`PREFIX.PHASE.txt`, one `frame;frame;... count` line per stack)
    that any flame-graph tool reads. Off unless asked for: py-spy is not a dependency.
    """

    def __init__(self, prefix: str | None, phase: str, pid: int) -> None:
        self.path = f"{prefix}.{phase}.txt" if prefix else None
        self.pid = pid
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Profiler:
        if self.path is not None:
            self.process = subprocess.Popen(
                ["py-spy", "record", "--pid", str(self.pid), "--rate", "250", "--format", "raw",
                 "--nonblocking", "-o", self.path], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            time.sleep(0.5)  # py-spy attaches before the load starts
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            self.process.wait(timeout=60)
            print(f"profile written to {self.path}")


def cpu_s(process: subprocess.Popen[bytes]) -> float:
    t = psutil.Process(process.pid).cpu_times()
    return t.user + t.system


async def health(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as h:
        async with h.get(f"{url}/admin/health") as r:
            return dict(await r.json())


@dataclass
class Result:
    """One measured figure, its target and whether the target was met."""

    name: str
    value: float
    target: str
    met: bool | None  # None: reported, no target
    fmt: str = "{:.3f}"

    def line(self) -> str:
        verdict = "" if self.met is None else "met" if self.met else "NOT met"
        return f"  {self.name:<34} {self.fmt.format(self.value):>9}   target {self.target:<9} {verdict}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 sessions x 5 turns (CI smoke run)")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--profile", metavar="PREFIX",
                        help="record the gateway with py-spy during each phase "
                             "(PREFIX.overhead.txt, PREFIX.instant.txt; collapsed stacks)")
    parser.add_argument("--standin", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.standin:
        run_standin(args.standin, args.latency_ms / 1000)
        return
    if args.profile and shutil.which("py-spy") is None:
        raise SystemExit("--profile needs py-spy on PATH: pip install py-spy")
    if args.quick:
        args.sessions, args.turns = 16, 5
    n, turns = args.sessions, args.turns
    print(f"bench_gateway: {n} sessions x {turns} turns, engine latency {args.latency_ms:g} ms, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")

    standin, standin_url = start_standin(args.latency_ms / 1000)
    with TemporaryDirectory() as tmp:
        try:
            # 1. direct to the stand-in, then through the gateway to the same stand-in.
            direct = asyncio.run(drive([f"{standin_url}/v1/chat/completions"] * n,
                                       ["x"] * n, turns))
            gw, gw_url = start_gateway(Path(tmp) / "overhead.sqlite", [
                "--engine", "vllm", "--option", f"url={standin_url}"])
            try:
                tokens = asyncio.run(open_sessions(gw_url, n))
                with Profiler(args.profile, "overhead", gw.pid):
                    cpu0 = cpu_s(gw)
                    through = asyncio.run(drive([f"{gw_url}/v1/chat/completions"] * n, tokens,
                                                turns))
                    gw_cpu_ms = (cpu_s(gw) - cpu0) * 1000 / through.calls
                stats = asyncio.run(health(gw_url))
                rss_mb = psutil.Process(gw.pid).memory_info().rss / 2**20
            finally:
                stop(gw)
        finally:
            stop(standin)

        print(f"direct to stand-in : p50 {direct.p50_ms:7.1f} ms   {direct.rps:7.1f} calls/s")
        print(f"through gateway    : p50 {through.p50_ms:7.1f} ms   {through.rps:7.1f} calls/s   "
              f"gateway CPU {gw_cpu_ms:.2f} ms/call   RSS {rss_mb:.0f} MB")
        tokens_cached = max(1, stats["cached_tokens"])
        bytes_per_token = stats["cached_token_bytes"] / tokens_cached
        print(f"token cache        : {stats['cached_tokens']} tokens in "
              f"{stats['open_sessions_cached']} sessions")

        # 2. an instant engine: how many calls the gateway records per CPU-second.
        gw, gw_url = start_gateway(Path(tmp) / "instant.sqlite", [
            "--engine", "scripted", "--option",
            f'replies=[{{"tool_calls": [{{"name": "shell", "arguments": {json.dumps(TOOL_ARGS)}}}]}}]'])
        try:
            tokens = asyncio.run(open_sessions(gw_url, n))
            with Profiler(args.profile, "instant", gw.pid):
                cpu0 = cpu_s(gw)
                instant = asyncio.run(drive([f"{gw_url}/v1/chat/completions"] * n, tokens, turns))
                used = cpu_s(gw) - cpu0
        finally:
            stop(gw)
        print(f"instant engine     : {instant.rps:7.1f} calls/s wall, gateway CPU "
              f"{used * 1000 / instant.calls:.2f} ms/call")

    latency_ratio = through.p50_ms / direct.p50_ms
    throughput_ratio = through.rps / direct.rps
    per_cpu_s = instant.calls / used
    results = [
        Result("p50 latency ratio (20 ms engine)", latency_ratio, "<= 1.10", latency_ratio <= 1.10),
        Result("throughput ratio (20 ms engine)", throughput_ratio, ">= 0.90",
               throughput_ratio >= 0.90),
        Result("gateway CPU ms per call (20 ms)", gw_cpu_ms, "-", None, "{:.2f}"),
        Result("gateway CPU ms per call (instant)", used * 1000 / instant.calls, "-", None,
               "{:.2f}"),
        Result("recorded calls per CPU-second", per_cpu_s, ">= 500", per_cpu_s >= 500, "{:.0f}"),
        Result("token cache bytes per token", bytes_per_token, "<= 8", bytes_per_token <= 8,
               "{:.2f}"),
    ]
    print(f"summary ({n} sessions x {turns} turns; ratios from one run on this machine, "
          f"load average {os.getloadavg()[0]:.1f} at the end):")
    for r in results:
        print(r.line())
    print("  (the ratios depend on the cores that the load generator, the stand-in and the "
          "gateway share; CPU ms per call is the figure that transfers between machines)")


if __name__ == "__main__":
    main()
