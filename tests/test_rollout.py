"""The rollout supervisor (`python -m openforge.rollout SPEC`): statuses, the signed result line,
and the mini harness on a real gateway in every sandbox mode."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import sys
import threading
import urllib.error
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from sandbox_modes import ALL_MODES

from openforge import rollout
from openforge.config import EngineConfig, GatewayConfig
from openforge.gateway.server import Gateway
from openforge.rollout import execute
from openforge.sandbox.protocol import RESULT_PREFIX, new_result_key, parse_result
from openforge.store import Store
from openforge.types import RolloutResult, RolloutSpec, Task

# A tool command that sends a model call of its own with the harness's session token, one
# the scripted engine refuses (400), and then kills the harness.
_POST = ("import json, os, urllib.request as u; r = u.Request(os.environ['OPENAI_BASE_URL'] + "
         "'/chat/completions', json.dumps({'model': 'm', 'messages': [{'role': 'user', "
         "'content': 'refuse me'}]}).encode(), {'Content-Type': 'application/json', "
         "'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})\n"
         "try: u.urlopen(r)\nexcept Exception as e: print(e)")
SELF_REFUSED_CALL = f"{shlex.quote(sys.executable)} -c {shlex.quote(_POST)}; kill -9 $PPID"

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def _plugins_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(HERE))


def spec_for(harness: str, **extra: object) -> RolloutSpec:
    return RolloutSpec(run_id="run", rollout_id="r", task=Task(id="only", prompt="write ok.txt"),
                       harness=harness, environment="executor_plugins:OneTaskEnv", reward="checker",
                       gateway_url="http://127.0.0.1:9", session_token="tok", session_id="sid",
                       timeout_s=30, **extra)  # type: ignore[arg-type]


def run_rollout(tmp_path: Path, spec: RolloutSpec, key: bytes | None = None,
                sandbox: str = "none") -> tuple[subprocess.CompletedProcess[str], RolloutResult]:
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json())
    argv = [sys.executable, "-m", "openforge.rollout", "--sandbox", sandbox, str(path)]
    proc = subprocess.run(argv + (["--key-on-stdin"] if key else []), capture_output=True,
                          text=True, timeout=60, input=key.hex() + "\n" if key else "")
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(RESULT_PREFIX), proc.stdout + proc.stderr
    return proc, parse_result(proc.stdout, key)


def test_the_result_is_the_last_line_signed_with_the_key_from_stdin(tmp_path: Path) -> None:
    key = new_result_key()
    proc, result = run_rollout(tmp_path, spec_for("executor_plugins:OkHarness"), key)
    assert result.status == "ok" and result.reward is not None and result.reward.passed
    assert result.session_id == "sid" and result.sandbox == "none"
    assert key.hex() not in proc.stdout + proc.stderr


@pytest.mark.parametrize("harness, expected", [
    ("executor_plugins:MissingHarness", "harness missing"),
    ("executor_plugins:NoSuchThing", "loading the plugins failed"),
    ("executor_plugins:CrashHarness", "signal"),
])
def test_infra_failures_are_not_scored(tmp_path: Path, harness: str, expected: str) -> None:
    _, result = run_rollout(tmp_path, spec_for(harness))
    assert result.status == "infra_error" and result.reward is None
    assert expected in (result.error or "")


def test_a_result_line_in_the_agents_output_is_a_violation(tmp_path: Path) -> None:
    # The task is done, but the harness also printed a result line: an attempt to forge one.
    _, result = run_rollout(tmp_path, spec_for("executor_plugins:ForgeHarness"))
    assert result.status == "violation" and not result.is_retried
    assert result.reward is not None and (result.reward.score, result.reward.passed) == (0.0, False)
    assert result.reward.details["violation"] == "forged result line"
    assert result.reward.details["forged_lines"] == 1
    assert (result.error or "").startswith(
        "violation: forged result line in the agent's output (harness.stdout): "
        'OPENFORGE_RESULT {"rollout_id": "r"')
    assert result.final_answer == "all done"  # the harness's account is kept


def test_what_scrub_removed_is_counted_in_the_rewards_details(tmp_path: Path) -> None:
    # A passing attempt that left a link out of its view (the real HOME) and a FIFO.
    spec = spec_for("executor_plugins:ShellHarness").model_copy(update={"task": Task(
        id="only", prompt=f"ln -s {Path.home()}/x home-link && mkfifo f && echo ok > ok.txt")})
    _, result = run_rollout(tmp_path, spec)
    assert result.status == "ok" and result.reward is not None and result.reward.passed
    assert result.reward.details == {"scrubbed_links": 1, "scrubbed_special_files": 1}
    removed = result.harness_output["removed_files"]
    assert len(removed) == 2 and any("home-link" in r for r in removed)


def test_unreadable_spec_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "openforge.rollout", str(tmp_path / "missing.json")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: cannot read rollout spec") and "Traceback" not in proc.stderr


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump([
        {"match": "loop forever", "replies": [
            {"tool_calls": [{"name": "shell", "arguments": {"command": "echo again"}}]}]},
        {"match": "engine down", "replies": [{"error": "engine exploded", "status": 503}]},
        {"match": "kill your harness", "replies": [
            {"tool_calls": [{"name": "shell", "arguments": {"command": "kill -9 $PPID"}}]}]},
        {"match": "stall", "replies": [
            {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 25"}}]}]},
        {"match": "engine fails later", "replies": [
            {"tool_calls": [{"name": "shell", "arguments": {"command": "echo hi"}}]},
            {"error": "engine exploded", "status": 503}]},
        # A prompt the engine refuses as the request's own fault (vLLM's answer to a prompt
        # beyond its context window).
        {"match": "refuse me", "replies": [
            {"error": "This model's maximum context length is 4096 tokens", "status": 400}]},
        {"match": "refused and killed", "replies": [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "ok.txt",
                                                                   "content": "ok"}}]},
            {"tool_calls": [{"name": "shell", "arguments": {"command": SELF_REFUSED_CALL}}]}]},
        {"replies": [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "ok.txt", "content": "ok"}}]},
            {"content": "Wrote it.\nDone: ok.txt"}]},
    ]))
    store = Store(tmp_path / "store.sqlite")
    gw = Gateway(GatewayConfig(), EngineConfig(name="scripted", options={"script": str(script)}), store)
    await gw.start()
    yield gw
    await gw.stop()
    store.close()


async def _mini(gateway: Gateway, tmp_path: Path, prompt: str, name: str,
                reward: str = "checker", mode: str = "none",
                timeout_s: float = 60) -> RolloutResult:
    session = gateway.open_session("run", name, "only")
    spec = RolloutSpec(run_id="run", rollout_id=name, task=Task(id="only", prompt=prompt),
                       harness="mini", harness_options={"max_steps": 3},
                       environment="executor_plugins:OneTaskEnv", reward=reward,
                       gateway_url=gateway.url, session_token=session.token,
                       session_id=session.id, scoring_token=session.scoring_token,
                       timeout_s=timeout_s)
    root = tmp_path / name
    root.mkdir()
    # In a thread: the gateway serves the harness from this very event loop.
    return await asyncio.to_thread(execute, spec, root, mode)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ALL_MODES)
async def test_mini_solves_through_the_gateway(gateway: Gateway, tmp_path: Path, mode: str) -> None:
    result = await _mini(gateway, tmp_path, "write ok.txt please", "solve", mode=mode)
    assert result.status == "ok", result.error
    assert result.sandbox == mode
    assert result.reward is not None and result.reward.passed
    assert result.final_answer == "Done: ok.txt"
    transcript = result.harness_output["transcript"]
    assert [m["role"] for m in transcript["messages"]] == ["system", "user", "assistant", "tool", "assistant"]


async def test_mini_step_limit_is_a_scored_harness_error(gateway: Gateway, tmp_path: Path) -> None:
    result = await _mini(gateway, tmp_path, "loop forever", "loop")
    assert result.status == "harness_error"
    assert result.reward is not None and result.reward.score == 0.0
    assert "step limit" in (result.error or "")


async def test_mini_with_engine_down_is_an_infra_failure(gateway: Gateway, tmp_path: Path) -> None:
    result = await _mini(gateway, tmp_path, "engine down", "down")
    assert result.status == "infra_error" and result.reward is None


@pytest.mark.parametrize("mode", ALL_MODES)
async def test_an_agent_that_kills_its_own_harness_is_scored(
        gateway: Gateway, tmp_path: Path, mode: str) -> None:
    # The harness dies by a signal, which alone would read as an infrastructure failure
    # (retried, never scored): a policy about to fail would learn to drop its 0 that way.
    result = await _mini(gateway, tmp_path, "kill your harness", "killer", mode=mode)
    assert result.status == "harness_error" and not result.is_retried
    assert result.reward is not None and result.reward.score == 0.0
    assert "code -9" in (result.error or "")
    assert "crashed after the model answered 1 call(s)" in (result.error or "")


async def test_an_agent_that_stalls_until_its_time_is_up_is_scored(
        gateway: Gateway, tmp_path: Path) -> None:
    result = await _mini(gateway, tmp_path, "stall", "staller", timeout_s=10)
    assert result.status == "harness_error" and not result.is_retried, result.error
    assert result.reward is not None and result.reward.score == 0.0
    assert "ran out of time after the model answered 1 call(s)" in (result.error or "")
    assert result.harness_output["status"] == "timeout"  # the harness's own account stays


async def test_a_crash_on_a_failed_engine_call_stays_an_infra_failure(
        gateway: Gateway, tmp_path: Path) -> None:
    # The model answered once, then the engine failed the call the harness waited on.
    result = await _mini(gateway, tmp_path, "engine fails later", "later")
    assert result.status == "infra_error" and result.is_retried and result.reward is None
    assert "scored" not in (result.error or "")


async def test_an_engine_refusal_of_the_agents_own_request_then_a_crash_is_scored(
        gateway: Gateway, tmp_path: Path) -> None:
    # The agent sends a call of its own with the session's token (its commands see the
    # harness's env), one the engine refuses as the request's fault, then kills its harness:
    # the last recorded call failed, but not for the infrastructure's reasons.
    result = await _mini(gateway, tmp_path, "refused and killed", "refused")
    assert result.status == "harness_error" and not result.is_retried, result.error
    assert result.reward is not None and result.reward.passed  # scored: ok.txt was written
    assert "the engine refused the last one as the request's own fault (400)" in \
        (result.error or "")
    session, = [s for s in gateway.store.list_sessions("run") if s.rollout_id == "refused"]
    calls = gateway.store.list_calls(session.id)
    assert [(c.status, c.http_status) for c in calls] == [("ok", 200), ("ok", 200),
                                                          ("failed", 400)]


async def test_a_reward_that_wants_calls_gets_its_own_sessions_trajectory(
        gateway: Gateway, tmp_path: Path) -> None:
    other = await _mini(gateway, tmp_path, "write ok.txt please", "other")
    assert other.status == "ok"
    result = await _mini(gateway, tmp_path, "write ok.txt please", "mine",
                         reward="executor_plugins:CallsReward")
    assert result.status == "ok", result.error
    assert result.reward is not None and result.reward.passed
    mine = gateway.store.get_session(result.reward.details["sessions"][0])
    assert mine is not None and mine.rollout_id == "mine"
    assert result.reward.details["calls"] == 2 and result.reward.details["tools"] == ["write_file"]


class _ScoringRoutes(BaseHTTPRequestHandler):
    """Answers each request with the next of `answers` (status, body) and keeps what it saw."""

    answers: list[tuple[int, bytes]] = []
    seen: list[tuple[str, str, str | None]] = []

    def _answer(self) -> None:
        self.seen.append((self.command, self.path, self.headers.get("Authorization")))
        status, body = self.answers.pop(0)
        self.send_response(status)
        if status == 302:
            self.send_header("Location", "http://127.0.0.1:9/elsewhere")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def test_scoring_routes_send_the_credential_and_raise_a_refusal_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ScoringRoutes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec = spec_for("executor_plugins:OkHarness").model_copy(update={
            "gateway_url": f"http://127.0.0.1:{server.server_port}/", "session_id": "s1",
            "scoring_token": "score-me"})
        _ScoringRoutes.answers = [(200, b'{"calls": []}'), (401, b'{"error": "no"}'),
                                  (302, b"")]
        _ScoringRoutes.seen = []
        assert rollout._scoring(spec, "GET", "calls") == {"calls": []}
        with pytest.raises(urllib.error.HTTPError, match="401"):
            rollout._scoring(spec, "POST", "seal")
        with pytest.raises(urllib.error.HTTPError, match="302"):  # the credential stays here
            rollout._scoring(spec, "GET", "calls")
        assert _ScoringRoutes.seen == [
            ("GET", "/scoring/sessions/s1/calls", "Bearer score-me"),
            ("POST", "/scoring/sessions/s1/seal", "Bearer score-me"),  # the 401: not retried
            ("GET", "/scoring/sessions/s1/calls", "Bearer score-me")]
    finally:
        server.shutdown()
        server.server_close()
    # No gateway at all: three tries, then the connection's error.
    sleeps: list[float] = []
    monkeypatch.setattr(rollout.time, "sleep", sleeps.append)
    with pytest.raises(OSError):
        rollout._scoring(spec, "POST", "seal")
    assert sleeps == [0.5, 1.0]
