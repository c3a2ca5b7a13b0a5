"""Gateway CPU per recorded call against a bare pass-through, in one run (prints a summary).

Processes, as in production: an engine stand-in (aiohttp; vLLM's `/v1/completions` with
token ids in and out, and an OpenAI chat endpoint, each answering after a fixed latency),
the gateway (`python -m openforge.gateway.server`, the `vllm` engine with
`api=completions` pointed at the stand-in), a bare pass-through (starlette + uvicorn +
an aiohttp client, forwarding chat requests to the stand-in and recording nothing: how
REFERENCE.md 2b measured peer gateways), and this load generator (aiohttp).

Phases, each S concurrent sessions x T turns, non-streaming, growing histories:

- `direct`: straight to the stand-in's chat endpoint (the throughput reference);
- `pass-through`: through the bare proxy;
- `tools`: through the gateway, tool-call turns (the model calls a tool, the harness
  sends its output back);
- `users`: through the gateway, user-message turns (the model answers, the user writes
  again), with the default render policy, and once more with `exact`;
- `workers`: a gateway with one worker and one with `--workers 2` serve at the same time,
  under one load of tool-call turns whose sessions alternate between them
  (`side_by_side`): the ratio of their recorded calls per CPU-second (the 2-worker
  gateway's CPU summed over its processes). Run one after the other, as the phases above
  are, the two would see different machines: on 2 shared cores one round moves by a
  fifth, more than the 10% the ratio is judged by. Two kinds of rounds, WORKER_ROUNDS of
  each per round, alternating:
  - the same sessions per worker (S/2 on the one worker, S on the two): what a second
    worker costs when it carries what the first carries, i.e. any per-worker overhead.
    Issue 20's target (within 10%) is judged on this one;
  - the same sessions per gateway (S/2 on each, so S/4 per worker): reported. A process
    serving fewer sessions at once shares its fixed costs per event-loop wake-up (the
    epoll wait, socket wake-ups of the peers, a group commit) among fewer calls, so its
    CPU per call rises as its sessions fall, with one worker or several.
  Afterwards every session must be cached by exactly the worker it maps to, and each
  session's token must be refused (421) by the other worker;
- `stall`: S sessions' tool turns, first alone, then while another client keeps sending
  10 MB bodies: the difference in their p99 latency.

Every phase but `stall` runs `--rounds` times (default 3), round after round; a phase's
CPU ms per call is the median of its rounds, printed with the lowest and highest (a single
round moves by a fifth with the machine's other tenants). The two-worker figures are
the medians of the `workers` phase's side-by-side rounds.

For each: recorded calls, CPU ms per call of the serving process(es), its ratio to the
pass-through's, p50 / p99 latency, RSS at the end, and the merge rate (calls per training
sample) of what the gateway recorded. For the one-worker phases it then prints what the
gateway counted itself over the phase (`GET /admin/health`, "served": CPU ms per recorded
call and the calls it recorded), the figure `openforge serve` reports when it stops. The summary ends with each target of issue 20 and
whether it was met. Timing depends on the machine (2 shared cores here: the load
generator, the stand-in and the server compete); CPU ms per call is the figure that
transfers, and the load average at start and end is printed with it.

    python benchmarks/bench_gateway.py [--quick] [--sessions N] [--turns N] [--latency-ms N]
                                       [--rounds N] [--profile PREFIX] [--system-words N]
                                       [--group K]
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
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import aiohttp
import psutil

ADMIN_KEY = "bench-admin-key"
WORKER_ROUNDS = 4  # side-by-side rounds of the `workers` phase, per round of the benchmark
SHELL = {"type": "function", "function": {
    "name": "shell", "description": "Run a shell command in the workspace.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                   "required": ["cmd"]}}}
TOOL_ARGS = {"cmd": "pytest -q"}
ANSWER = "Done: the tests pass now, and I updated the module's docstring to match."
STALL_BODY_BYTES = 10 * 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the engine stand-in and the pass-through (each runs in its own process) ----------------


def reply_ids(bundle: Any) -> dict[str, list[int]]:
    """The completion ids the engine answers with, by profile: "tools" a call of the shell
    tool, "users" a text answer."""
    from openforge.gateway.conversation import Message, Tool, ToolCall
    from openforge.gateway.render import assistant_turn_ids

    call = ToolCall(id="call_1", name="shell", arguments=json.dumps(TOOL_ARGS))
    tools = [Tool(name="shell", parameters=SHELL["function"]["parameters"])]
    return {
        "tools": assistant_turn_ids(bundle, [], Message(role="assistant", tool_calls=[call]),
                                    tools),
        "users": assistant_turn_ids(bundle, [], Message(role="assistant", content=ANSWER)),
    }


SYSTEM_PROMPT = "You are a coding agent. Work step by step."
_FILLER = ("Read", "the", "files", "before", "you", "change", "them;", "run", "tests",
           "after", "each", "edit", "and", "report", "what", "failed.")


def use_system_words(n: int) -> None:
    """Make every session's system prompt `n` words longer (`--system-words`): harnesses
    send instructions and tool lists of thousands of tokens with every call, and a cost
    that grows with the prompt shows only with one of that size."""
    global SYSTEM_PROMPT
    words = (_FILLER[i % len(_FILLER)] if i % 5 else f"rule{i}" for i in range(n))
    SYSTEM_PROMPT = "You are a coding agent. Work step by step. " + " ".join(words)


GROUP = 1
"""Sessions per task (`--group`): the rollouts of one task open with the same messages, as
a GRPO group's k attempts do; 1, every session its own task."""


def use_group(k: int) -> None:
    global GROUP
    GROUP = max(k, 1)


def first_messages(k: int) -> list[dict[str, Any]]:
    """Session `k`'s opening messages (the system prompt is every session's, the task its
    group's)."""
    task = k // GROUP
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Task {task}: refactor module {task} and run its tests."}]


def next_turn(messages: list[dict[str, Any]], answer: dict[str, Any], profile: str,
              turn: int, k: int) -> None:
    """Append the model's `answer` and what the harness sends back: the tool's output
    (tool-call turns) or the user's next message. What is added names session `k`: texts
    shared by every session would be tokenized once for all of them, which real tool
    outputs are not."""
    calls = answer.get("tool_calls") or []
    messages.append({"role": "assistant", "content": answer.get("content") or "",
                     "tool_calls": calls})
    if profile == "tools" or calls:  # the harness runs the tool, sends its output
        for tc in calls:
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content":
                             f"step {turn} of task {k}: 12 passed, {turn} warnings\n" * 4})
    else:  # the user reads the answer and writes again
        messages.append({"role": "user", "content":
                         f"Thanks. Now step {turn} of task {k}: also cover edge case {turn}."})


def run_standin(port: int, latency_s: float) -> None:
    """vLLM's `/v1/completions` (token ids; the reply by the requested model name: "tools"
    answers a tool call, "users" a text; the prompt's ids echoed, as vLLM does with
    `return_token_ids`) and an OpenAI chat endpoint (a tool call)."""
    from aiohttp import web

    from openforge.gateway.model import load_model_bundle

    replies = reply_ids(load_model_bundle("tiny"))
    # As vLLM answers `return_token_ids`: the generated ids, and the prompt's echoed
    # (compact JSON, as vLLM's JSONResponse writes it), around the prompt sent.
    completions = {
        name: json.dumps({"choices": [{
            "text": "", "token_ids": ids, "finish_reason": "stop",
            "logprobs": {"token_logprobs": [-0.5] * len(ids)}, "prompt_token_ids": 0}],
            "weight_versions": ["bench"]}, separators=(",", ":")).split('"prompt_token_ids":0')
        for name, ids in replies.items()}
    chat = json.dumps({
        "id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "policy",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "shell", "arguments": json.dumps(TOOL_ARGS)}}]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}})

    async def completions_route(request: web.Request) -> web.Response:
        body = await request.json()  # a real server parses what it is sent
        await asyncio.sleep(latency_s)
        head, tail = completions[body.get("model", "tools")]
        echo = json.dumps(body["prompt"], separators=(",", ":")) if body.get(
            "return_token_ids") else "null"
        return web.Response(text=f'{head}"prompt_token_ids":{echo}{tail}',
                            content_type="application/json")

    async def chat_route(request: web.Request) -> web.Response:
        await request.json()
        await asyncio.sleep(latency_s)
        return web.Response(text=chat, content_type="application/json")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tools"}]})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/completions", completions_route)
    app.router.add_post("/v1/chat/completions", chat_route)
    app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def run_passthrough(port: int, upstream: str) -> None:
    """A bare proxy on the gateway's own stack (starlette + uvicorn + aiohttp client):
    forwards each chat request to `upstream` and returns its answer, recording nothing."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    client: dict[str, aiohttp.ClientSession] = {}

    async def forward(request: Request) -> Response:
        if "s" not in client:
            client["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        body = await request.body()
        async with client["s"].post(upstream, data=body,
                                    headers={"content-type": "application/json"}) as r:
            data = await r.read()
            return Response(data, r.status, media_type="application/json")

    app = Starlette(routes=[Route("/v1/chat/completions", forward, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                loop="uvloop")


# --- processes ---------------------------------------------------------------------------------


def wait_http(url: str, process: subprocess.Popen[bytes], headers: dict[str, str] | None = None,
              ok: tuple[int, ...] = (200,)) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"a benchmark process exited early with {process.returncode}")
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=2):
                return
        except urllib.error.HTTPError as exc:
            if exc.code in ok:
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def start_helper(flag: str, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    p = subprocess.Popen([sys.executable, __file__, flag, str(port), *args])
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/v1/chat/completions", p, ok=(405,))  # a GET on a POST route: it is up
    return p, url


def start_gateway(store: Path, standin_url: str, profile: str, policy: str = "append",
                  workers: int = 1) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port() if workers == 1 else _free_port_run(workers)
    p = subprocess.Popen([
        sys.executable, "-m", "openforge.gateway.server", "--store", str(store), "--model",
        "tiny", "--port", str(port), "--engine", "vllm",
        "--option", f"url={standin_url}", "--option", "api=completions",
        "--option", f"served_model={profile}", "--set", f"gateway.render_policy={policy}",
        "--workers", str(workers)], stdout=subprocess.DEVNULL,
        env={**os.environ, "OPENFORGE_ADMIN_KEY": ADMIN_KEY})  # never on argv
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/admin/health", p, {"Authorization": f"Bearer {ADMIN_KEY}"})
    return p, url


def _free_port_run(n: int) -> int:
    """A port p such that p .. p+n-1 are all free now (workers bind consecutive ports)."""
    for _ in range(100):
        base = free_port()
        try:
            socks = []
            for i in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", base + i))
                socks.append(s)
            for s in socks:
                s.close()
            return base
        except OSError:
            for s in socks:
                s.close()
    raise SystemExit("no run of free ports")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()


def tree(process: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The process and its children (gateway workers)."""
    p = psutil.Process(process.pid)
    return [p, *p.children(recursive=True)]


def cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        t = p.cpu_times()
        total += t.user + t.system
    return total


def ratio(a: float, b: float) -> float:
    """a / b; NaN when either is 0: a process that served calls used some CPU, so a 0 is a
    load too small for the CPU clock's 10 ms ticks, not a measurement."""
    return a / b if a and b else float("nan")


def rss_mb(procs: list[psutil.Process]) -> list[float]:
    return [p.memory_info().rss / 2**20 for p in procs]


# --- load ---------------------------------------------------------------------------------------


@dataclass
class Load:
    latencies: list[float]
    wall_s: float
    calls: int
    windows: list[tuple[float, float]] = field(default_factory=list)  # (start, end) per call

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1000

    @property
    def p99_ms(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000

    @property
    def rps(self) -> float:
        return self.calls / self.wall_s


async def open_sessions(url: str, n: int) -> list[dict[str, str]]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as h:
        sessions = []
        for i in range(n):
            async with h.post(f"{url}/admin/sessions", json={"run_id": "bench",
                                                             "task_id": f"t{i}"}) as r:
                sessions.append(await r.json())
        return sessions


async def drive(endpoints: list[str], tokens: list[str], turns: int, profile: str) -> Load:
    """One conversation per endpoint, all at once, each `turns` calls with a growing history
    (`next_turn`). The tools are the same in every session, as they are for one harness."""
    latencies: list[float] = []
    windows: list[tuple[float, float]] = []
    connector = aiohttp.TCPConnector(limit=0)

    async def conversation(h: aiohttp.ClientSession, endpoint: str, token: str, k: int) -> None:
        messages = first_messages(k)
        headers = {"Authorization": f"Bearer {token}"}
        for turn in range(turns):
            body = {"model": "policy", "messages": messages, "tools": [SHELL], "max_tokens": 128}
            t0 = time.perf_counter()
            async with h.post(endpoint, json=body, headers=headers) as r:
                data = await r.json()
                if r.status != 200:
                    raise SystemExit(f"benchmark request failed: {r.status} {data}")
            t1 = time.perf_counter()
            latencies.append(t1 - t0)
            windows.append((t0, t1))
            next_turn(messages, data["choices"][0]["message"], profile, turn, k)

    async with aiohttp.ClientSession(connector=connector) as h:
        t0 = time.perf_counter()
        await asyncio.gather(*(conversation(h, e, t, k)
                               for k, (e, t) in enumerate(zip(endpoints, tokens, strict=True))))
        wall = time.perf_counter() - t0
    return Load(latencies, wall, len(latencies), windows)


def run_big_sender(url: str, token: str) -> None:
    """Post 10 MB chat bodies back to back until stdin closes; print how many the gateway
    answered, how many failed and the first failure, as JSON. (Its own process: sending
    them must not slow down the load generator's loop.)"""
    big = json.dumps({"model": "policy", "max_tokens": 16, "messages": [
        {"role": "user", "content": "hello world, this is some text. " * (STALL_BODY_BYTES // 32)}]
    }).encode()

    async def send() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(None, sys.stdin.read)
        sent, failed, error = 0, 0, ""
        async with aiohttp.ClientSession() as h:
            while not done.done():
                try:
                    async with h.post(f"{url}/v1/chat/completions", data=big, headers={
                            "Authorization": f"Bearer {token}",
                            "content-type": "application/json"}) as r:
                        await r.read()
                        sent += 1
                except aiohttp.ClientError as exc:
                    failed += 1
                    error = error or f"{type(exc).__name__}: {exc}"
        return {"sent": sent, "failed": failed, "error": error}

    print(json.dumps(asyncio.run(send())), flush=True)


async def drive_with_big_bodies(url: str, sessions: list[dict[str, str]], big_token: str,
                                turns: int) -> tuple[Load, dict[str, Any]]:
    """`drive` while another process sends 10 MB bodies back to back; what the sender
    reported (`sent`, `failed`, `error`)."""
    sender = subprocess.Popen([sys.executable, __file__, "--big-sender", url, big_token],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    await asyncio.sleep(1.0)  # the sender is running (its first body on the way)
    try:
        load = await drive([f"{url}/v1/chat/completions"] * len(sessions),
                           [s["token"] for s in sessions], turns, "tools")
    finally:
        out, _ = await asyncio.to_thread(sender.communicate, b"", 120)
    try:
        report: dict[str, Any] = json.loads(out)
    except ValueError:  # it died: its traceback went to stderr
        report = {"sent": 0, "failed": 0, "error": f"the sender exited {sender.returncode}"}
    return load, report


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


async def health(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as h:
        async with h.get(f"{url}/admin/health") as r:
            return dict(await r.json())


def merge_rate(store: Path) -> float:
    """Recorded calls per training sample (1.0: every call its own sample)."""
    from openforge.store import Store
    from openforge.trajectory import run_metrics

    s = Store(store)
    try:
        m = run_metrics(s)
        return m.calls_used / m.samples if m.samples else 0.0
    finally:
        s.close()


@dataclass
class Phase:
    name: str
    load: Load
    cpu_ms: float  # CPU of the serving process(es) per call
    rss: list[float]
    merge: float | None = None
    cpu_range: tuple[float, float] | None = None  # lowest and highest round, when several
    # The gateway's own count over the phase (`GET /admin/health`, "served"): CPU ms per
    # recorded call, and the calls it recorded.
    own_ms: float | None = None
    own_calls: int = 0

    def line(self, baseline_ms: float) -> str:
        merge = f"{self.merge:5.1f}" if self.merge is not None else "    -"
        rss = "+".join(f"{r:.0f}" for r in self.rss)
        spread = (f"{self.cpu_range[0]:.2f}-{self.cpu_range[1]:.2f}" if self.cpu_range
                  else "-")
        return (f"  {self.name:<24} {self.load.calls:6d} {self.cpu_ms:8.2f} {spread:>11} "
                f"{ratio(self.cpu_ms, baseline_ms):6.2f} {self.load.p50_ms:8.1f} {self.load.p99_ms:8.1f} "
                f"{rss:>9} {merge}")


def combine(rounds: list[Phase]) -> Phase:
    """One phase measured in several rounds: the median round's CPU ms per call (the
    machine's other tenants move a single round's figure by a fifth), the range of the
    rounds, latencies of all calls, the largest RSS, the last round's merge rate."""
    cpu = [p.cpu_ms for p in rounds]
    load = Load([x for p in rounds for x in p.load.latencies],
                sum(p.load.wall_s for p in rounds), sum(p.load.calls for p in rounds))
    rss = [max(values) for values in zip(*(p.rss for p in rounds), strict=True)]
    own = [p.own_ms for p in rounds if p.own_ms is not None]
    return Phase(rounds[0].name, load, statistics.median(cpu), rss, rounds[-1].merge,
                 (min(cpu), max(cpu)) if len(rounds) > 1 else None,
                 statistics.median(own) if own else None, sum(p.own_calls for p in rounds))


async def gateway_phase(name: str, tmp: Path, standin_url: str, profile: str, n: int,
                        turns: int, prefix: str | None, policy: str = "append",
                        round_: int = 0) -> Phase:
    store = tmp / f"{name.replace(' ', '-')}-{round_}.sqlite"
    gw, url = start_gateway(store, standin_url, profile, policy)
    try:
        sessions = await open_sessions(url, n)
        await asyncio.sleep(0.5)  # let start-up work (gc, imports) settle
        procs = tree(gw)
        before = (await health(url))["served"]
        with Profiler(prefix, name.replace(" ", "-"), gw.pid):
            cpu0 = cpu_s(procs)
            load = await drive([f"{s['base_url']}/chat/completions" for s in sessions],
                               [s["token"] for s in sessions], turns, profile)
            used = cpu_s(procs) - cpu0
        after = (await health(url))["served"]
        rss = rss_mb(procs)
    finally:
        stop(gw)
    own_calls = after["ok"] + after["failed"] - before["ok"] - before["failed"]
    own_ms = (after["cpu_s"] - before["cpu_s"]) * 1000 / own_calls if own_calls else None
    return Phase(name, load, used * 1000 / load.calls, rss, merge_rate(store), None, own_ms,
                 own_calls)


@dataclass
class SideBySide:
    """One round of two gateways serving at once: CPU ms per recorded call of each, and
    the sessions B served."""

    a_ms: float
    b_ms: float
    b_sessions: list[dict[str, str]]

    @property
    def per_cpu(self) -> float:
        """B's recorded calls per CPU-second over A's (A's CPU ms per call / B's)."""
        return ratio(self.a_ms, self.b_ms)


async def side_by_side(a: subprocess.Popen[bytes], a_url: str, na: int,
                       b: subprocess.Popen[bytes], b_url: str, nb: int, turns: int,
                       profile: str, b_first: bool = False) -> SideBySide:
    """`na` fresh sessions on gateway A and `nb` on B, driven as one load whose sessions
    alternate between them (`b_first`: B's first), so that both see the same machine at
    every moment: their CPU per recorded call."""
    a_sessions, b_sessions = await open_sessions(a_url, na), await open_sessions(b_url, nb)
    first, second = (b_sessions, a_sessions) if b_first else (a_sessions, b_sessions)
    order = [s for i in range(max(na, nb)) for s in (first[i:i + 1] + second[i:i + 1])]
    a0, b0 = cpu_s(tree(a)), cpu_s(tree(b))
    # Every conversation runs all its turns, or drive() exits.
    await drive([f"{s['base_url']}/chat/completions" for s in order],
                [s["token"] for s in order], turns, profile)
    a_s, b_s = cpu_s(tree(a)) - a0, cpu_s(tree(b)) - b0
    return SideBySide(a_s * 1000 / (na * turns), b_s * 1000 / (nb * turns), b_sessions)


@dataclass
class WorkersPhase:
    """A 1-worker gateway (A) beside a 2-worker one (B), in two kinds of rounds: B carrying
    twice A's sessions (as many per worker as A's one worker), and B carrying as many as A
    (half per worker)."""

    sessions: int  # A's in every round
    per_worker: list[SideBySide]
    per_gateway: list[SideBySide]
    rss: list[float]  # of B's workers
    separate: bool  # every session served by its own worker only (`worker_checks`)
    checks: str

    def lines(self) -> str:
        def line(what: str, rounds: list[SideBySide]) -> str:
            ratios = [r.per_cpu for r in rounds]
            return (f"    {what}: CPU ms per call {statistics.median(r.a_ms for r in rounds):.2f}"
                    f" (1 worker), {statistics.median(r.b_ms for r in rounds):.2f} (2 workers); "
                    f"calls per CPU-second, 2 workers / 1: median {statistics.median(ratios):.3f}"
                    f" (rounds {min(ratios):.3f}-{max(ratios):.3f})")

        half = self.sessions
        return "\n".join([
            f"  workers: a 1-worker and a 2-worker gateway serving at once, sessions "
            f"alternating, {len(self.per_worker)} + {len(self.per_gateway)} rounds (medians)",
            line(f"the same sessions per worker ({half} and {2 * half})", self.per_worker),
            line(f"the same sessions per gateway ({half} and {half})", self.per_gateway),
            f"    RSS of the 2 workers {'+'.join(f'{r:.0f}' for r in self.rss)} MB; "
            f"{self.checks}"])


async def workers_phase(tmp: Path, standin_url: str, n: int, turns: int, rounds: int,
                        round_: int = 0) -> WorkersPhase:
    """`rounds` rounds of each kind of `WorkersPhase`, alternating, on fresh gateways."""
    one, one_url = start_gateway(tmp / f"workers-1-{round_}.sqlite", standin_url, "tools")
    two, two_url = start_gateway(tmp / f"workers-2-{round_}.sqlite", standin_url, "tools",
                                 workers=2)
    half = max(1, n // 2)
    per_worker: list[SideBySide] = []
    per_gateway: list[SideBySide] = []
    try:
        await asyncio.sleep(0.5)  # let start-up work (gc, imports) settle
        for r in range(rounds):
            per_worker.append(await side_by_side(one, one_url, half, two, two_url, 2 * half,
                                                 turns, "tools", b_first=r % 2 == 1))
            per_gateway.append(await side_by_side(one, one_url, half, two, two_url, half,
                                                  turns, "tools", b_first=r % 2 == 0))
        rss = rss_mb(tree(two)[1:])
        separate, checks = await worker_checks(
            [s for m in per_worker + per_gateway for s in m.b_sessions], 2)
    finally:
        stop(one)
        stop(two)
    return WorkersPhase(half, per_worker, per_gateway, rss, separate, checks)


async def worker_checks(sessions: list[dict[str, str]], workers: int) -> tuple[bool, str]:
    """Every session cached by the worker its base URL names, and refused by the others:
    whether that holds, and what was found."""
    roots = sorted({s["base_url"].split("/s/")[0] for s in sessions})
    cached = [(await health(root))["open_sessions_cached"] for root in roots]
    crossed = 0
    async with aiohttp.ClientSession() as h:
        for s in sessions:
            own = s["base_url"].split("/s/")[0]
            for root in roots:
                if root == own:
                    continue
                async with h.post(f"{root}/s/{s['token']}/v1/chat/completions", json={
                        "model": "m", "messages": [{"role": "user", "content": "hi"}]}) as r:
                    crossed += r.status != 421
    ok = sum(cached) == len(sessions) and crossed == 0 and len(roots) == workers
    return ok, (f"sessions per worker {cached} (of {len(sessions)}), requests served by a "
                f"foreign worker {crossed}: {'never crossed' if ok else 'CROSSED'}")


@dataclass
class Result:
    """One measured figure, its target and whether the target was met."""

    name: str
    value: float | None
    target: str
    met: bool | None  # None: reported, no target
    fmt: str = "{:.3f}"

    def line(self) -> str:
        if self.value is None:  # a figure with a target that this run could not measure
            return f"  {self.name:<44} {'-':>9}   target {self.target:<9} NOT measured"
        verdict = "" if self.met is None else "met" if self.met else "NOT met"
        return f"  {self.name:<44} {self.fmt.format(self.value):>9}   target {self.target:<9} {verdict}"


async def run(args: argparse.Namespace) -> None:
    n, turns = args.sessions, args.turns
    system = f", a system prompt {args.system_words} words longer" if args.system_words else ""
    system += f", {args.group} sessions per task" if args.group > 1 else ""
    print(f"bench_gateway: {n} sessions x {turns} turns{system}, engine latency "
          f"{args.latency_ms:g} ms, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at start")
    standin, standin_url = start_helper("--standin", "--latency-ms", str(args.latency_ms))
    passthrough, pass_url = start_helper("--passthrough", f"{standin_url}/v1/chat/completions")
    rounds: dict[str, list[Phase]] = {}
    try:
        with TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            direct = await drive([f"{standin_url}/v1/chat/completions"] * n, ["x"] * n, turns,
                                 "tools")
            workers: list[WorkersPhase] = []
            # Round after round of every phase, so that each phase sees the machine as the
            # others do (its other tenants come and go within a minute).
            for r in range(args.rounds):
                procs = tree(passthrough)
                cpu0 = cpu_s(procs)
                through = await drive([f"{pass_url}/v1/chat/completions"] * n, ["x"] * n,
                                      turns, "tools")
                rounds.setdefault("pass-through (tools)", []).append(Phase(
                    "pass-through (tools)", through,
                    (cpu_s(procs) - cpu0) * 1000 / through.calls, rss_mb(procs)))
                for name, profile, policy in (
                        ("tools", "tools", "append"), ("users", "users", "append"),
                        ("users (exact policy)", "users", "exact")):
                    if args.only and name not in args.only:
                        continue
                    rounds.setdefault(name, []).append(await gateway_phase(
                        name, tmp, standin_url, profile, n, turns,
                        args.profile if r == 0 else None, policy, round_=r))
                if not args.only or "workers" in args.only:
                    workers.append(await workers_phase(tmp, standin_url, n, turns,
                                                       WORKER_ROUNDS, round_=r))
            stall: tuple[str, float | None] = ("not run", None)
            if not args.only or "stall" in args.only:
                stall = await stall_phase(tmp, standin_url, min(n, 16), max(turns // 2, 3))
    finally:
        stop(passthrough)
        stop(standin)

    phases = [combine(measured) for measured in rounds.values()]
    baseline = phases[0].cpu_ms
    print(f"\ndirect to stand-in      : {direct.calls} calls, p50 {direct.p50_ms:.1f} ms, "
          f"{direct.rps:.0f} calls/s")
    print(f"  CPU ms per call: the median of {args.rounds} round(s), then the lowest and "
          "highest round")
    print("  phase                     calls  CPU ms  min-max      ratio   p50 ms   p99 ms"
          "   RSS MB  calls/sample")
    for phase in phases:
        print(phase.line(baseline))
    own = [p for p in phases if p.own_ms is not None]
    if own:
        # The figure `openforge serve` reports of itself, next to the one measured here.
        print("  the gateway's own count (GET /admin/health, \"served\"): " + "; ".join(
            f"{p.name} {p.own_ms:.2f} ms per recorded call, {p.own_calls} of "
            f"{p.load.calls} calls recorded" for p in own))
    both = WorkersPhase(workers[0].sessions, [m for w in workers for m in w.per_worker],
                        [m for w in workers for m in w.per_gateway],
                        [max(rss) for rss in zip(*(w.rss for w in workers), strict=True)],
                        all(w.separate for w in workers),
                        next((w.checks for w in workers if not w.separate),
                             workers[0].checks)) if workers else None
    print(both.lines() if both else "  workers: not run")
    print(f"  stall: {stall[0]}")
    if args.only or both is None:
        return
    by = {p.name: p for p in phases}
    one = by["tools"]
    per_worker = statistics.median(r.per_cpu for r in both.per_worker)
    per_gateway = statistics.median(r.per_cpu for r in both.per_gateway)
    crossed = not both.separate
    rss = max(max(p.rss) for p in [*phases[1:], both])
    results = [
        Result("CPU ms per call, tool-call turns", one.cpu_ms, "<= 1.0", one.cpu_ms <= 1.0,
               "{:.2f}"),
        Result("CPU ms per call, user-message turns", by["users"].cpu_ms, "<= 1.0",
               by["users"].cpu_ms <= 1.0, "{:.2f}"),
        Result("CPU ms per call, user turns, exact policy", by["users (exact policy)"].cpu_ms,
               "-", None, "{:.2f}"),
        Result("RSS MB of a gateway process (max of phases)", rss, "<= 250", rss <= 250,
               "{:.0f}"),
        Result("calls per CPU-second, 2 workers / 1", per_worker, ">= 0.90",
               per_worker >= 0.90),
        Result("  the same, half the sessions per worker", per_gateway, "-", None),
        Result("sessions crossing workers", int(crossed), "0", not crossed, "{:.0f}"),
        Result("stall: p99 of others, extra ms", stall[1], "<= 50",
               stall[1] is not None and stall[1] <= 50, "{:.1f}"),
        Result("merge rate (calls/sample), tools", one.merge or 0, "-", None, "{:.1f}"),
        Result("merge rate (calls/sample), users", by["users"].merge or 0, "-", None, "{:.1f}"),
    ]
    print(f"summary ({n} sessions x {turns} turns; one run on this machine, load average "
          f"{os.getloadavg()[0]:.1f} at the end):")
    for r in results:
        print(r.line())
    print("  (CPU ms per call is the figure that transfers between machines; the ratio is to "
          "the bare pass-through measured in this run)")
    if args.quick:
        print("  (--quick is a smoke run: a few hundred calls are too few for the CPU clock's "
              "10 ms ticks; judge the targets on a full run)")


async def stall_phase(tmp: Path, standin_url: str, n: int, turns: int,
                      rounds: int = 3) -> tuple[str, float | None]:
    """Others' tool turns alone and while 10 MB bodies arrive, `rounds` times each in
    turn (so both see the same machine): the difference of their p99 latencies, or None
    when no 10 MB body was answered meanwhile (nothing was measured)."""
    gw, url = start_gateway(tmp / "stall.sqlite", standin_url, "tools")
    alone, during = Load([], 0.0, 0), Load([], 0.0, 0)
    sent = failed = 0
    errors: list[str] = []
    try:
        big = (await open_sessions(url, 1))[0]
        for _ in range(rounds):
            a = await drive([f"{url}/v1/chat/completions"] * n,
                            [s["token"] for s in await open_sessions(url, n)], turns, "tools")
            d, report = await drive_with_big_bodies(url, await open_sessions(url, n),
                                                    big["token"], turns)
            alone.latencies += a.latencies
            during.latencies += d.latencies
            sent, failed = sent + report["sent"], failed + report["failed"]
            errors += [report["error"]] if report["error"] else []
        rss = max(rss_mb(tree(gw)))
    finally:
        stop(gw)
    failures = f" ({failed} failed; first: {errors[0]})" if errors else ""
    report_line = (
        f"{len(alone.latencies)} calls alone: p50 {alone.p50_ms:.1f} ms, p99 "
        f"{alone.p99_ms:.1f} ms; {len(during.latencies)} calls while {sent} bodies of "
        f"{STALL_BODY_BYTES >> 20} MB were answered{failures}: p50 {during.p50_ms:.1f} ms, "
        f"p99 {during.p99_ms:.1f} ms; RSS afterwards {rss:.0f} MB")
    return report_line, (during.p99_ms - alone.p99_ms) if sent else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 sessions x 5 turns (CI smoke run)")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--system-words", type=int, default=0, metavar="N",
                        help="make every session's system prompt N words longer")
    parser.add_argument("--group", type=int, default=1, metavar="K",
                        help="K sessions per task: they open with the same messages")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3,
                        help="measure every phase this many times, round after round, and "
                             "report the median (--quick: 1)")
    parser.add_argument("--profile", metavar="PREFIX",
                        help="record the gateway with py-spy during each phase "
                             "(PREFIX.PHASE.txt; collapsed stacks)")
    parser.add_argument("--only", action="append", metavar="PHASE",
                        help="run only this phase (repeatable): tools, users, "
                             "'users (exact policy)', workers, stall")
    parser.add_argument("--standin", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--passthrough", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--big-sender", help=argparse.SUPPRESS)
    parser.add_argument("upstream", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.standin:
        run_standin(args.standin, args.latency_ms / 1000)
        return
    if args.passthrough:
        run_passthrough(args.passthrough, args.upstream)
        return
    if args.big_sender:
        run_big_sender(args.big_sender, args.upstream)
        return
    if args.profile and shutil.which("py-spy") is None:
        raise SystemExit("--profile needs py-spy on PATH: pip install py-spy")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.quick:
        args.sessions, args.turns, args.rounds = 16, 5, 1
    use_system_words(args.system_words)
    use_group(args.group)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
