"""The `codex` harness plugin without the Codex binary: config, command, output parsing.

The end-to-end run against the real binary is tests/e2e/test_real_harnesses.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w
from harness_plugins import CODEX, import_sources, pip_install, with_path
from hypothesis import given, settings
from hypothesis import strategies as st

from openforge.errors import OpenforgeError
from openforge.harness import (
    HarnessContext,
    HarnessMissingError,
    McpServer,
    ProcessOutput,
    drop_none,
)
from openforge.types import Task

import_sources(CODEX)

from openforge_codex.events import parse_events  # noqa: E402
from openforge_codex.harness import BIN_ENV, KEY_ENV, CodexHarness  # noqa: E402

URL = "http://127.0.0.1:4321/s/tok-123/v1"


@pytest.fixture
def ctx(tmp_path: Path) -> HarnessContext:
    (tmp_path / "home").mkdir()
    (tmp_path / "ws").mkdir()
    return HarnessContext(task=Task(id="t", prompt="-n create hello.txt"), workspace=tmp_path / "ws",
                          home=tmp_path / "home", base_url=URL, api_key="tok-123", model="policy")


@pytest.fixture
def fake_codex(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "bin" / "codex"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    monkeypatch.setenv(BIN_ENV, str(path))
    return path


def test_config_points_at_the_session_and_nothing_else(ctx: HarnessContext) -> None:
    harness = CodexHarness()
    harness.prepare(ctx)
    config = tomllib.loads((ctx.home / ".codex" / "config.toml").read_text())
    assert config["model"] == "policy" and config["model_provider"] == "openforge"
    provider = config["model_providers"]["openforge"]
    assert provider == {"name": "openforge", "base_url": URL, "env_key": KEY_ENV,
                        "wire_api": "responses", "request_max_retries": 0,
                        "stream_max_retries": 0, "stream_idle_timeout_ms": 600_000}
    assert config["approval_policy"] == "never"
    assert config["check_for_update_on_startup"] is False
    assert config["analytics"] == {"enabled": False}


def test_the_tasks_mcp_servers_go_into_the_config(ctx: HarnessContext) -> None:
    harness = CodexHarness()
    harness.prepare(ctx)
    assert "mcp_servers" not in tomllib.loads((ctx.home / ".codex/config.toml").read_text())
    ctx.mcp_servers = [McpServer(name="claw-eval", command="/usr/bin/python3",
                                 args=["-m", "bridge", "mcp"], env={"A": "1"})]
    harness.prepare(ctx)
    config = tomllib.loads((ctx.home / ".codex/config.toml").read_text())
    # required: `codex exec` waits for the server's tools before its first request.
    assert config["mcp_servers"] == {"claw-eval": {
        "command": "/usr/bin/python3", "args": ["-m", "bridge", "mcp"], "env": {"A": "1"},
        "required": True, "startup_timeout_sec": 60}}


def test_extra_config_is_merged_last(ctx: HarnessContext) -> None:
    harness = CodexHarness(config={"model_providers": {"openforge": {"request_max_retries": 2}},
                                   "tools": {"view_image": False}}, reasoning_effort="low")
    config = tomllib.loads(tomli_w.dumps(drop_none(harness.config_dict(ctx))))
    assert config["model_providers"]["openforge"]["request_max_retries"] == 2
    assert config["model_providers"]["openforge"]["base_url"] == URL
    assert config["tools"] == {"view_image": False}
    assert config["model_reasoning_effort"] == "low"


def test_instructions_replace_codexs_own_and_live_in_the_rollouts_home(
        ctx: HarnessContext) -> None:
    """`instructions` is written into the rollout's CODEX_HOME (the sandbox sees it there)
    and named by `model_instructions_file`; without it Codex keeps its own."""
    CodexHarness().prepare(ctx)
    assert "model_instructions_file" not in tomllib.loads(
        (ctx.home / ".codex/config.toml").read_text())
    CodexHarness(instructions="Do the task with one command.").prepare(ctx)
    config = tomllib.loads((ctx.home / ".codex/config.toml").read_text())
    path = Path(config["model_instructions_file"])
    assert path.parent == ctx.home / ".codex"
    assert path.read_text() == "Do the task with one command."


def test_command_is_headless_and_isolated(ctx: HarnessContext, fake_codex: Path) -> None:
    cmd = CodexHarness().command(ctx)
    assert cmd.argv[0] == str(fake_codex.resolve())
    assert cmd.argv[1:4] == ["exec", "--json", "--skip-git-repo-check"]
    assert cmd.argv[cmd.argv.index("-C") + 1] == str(ctx.workspace)
    assert cmd.argv[cmd.argv.index("-m") + 1] == "policy"
    assert "--dangerously-bypass-approvals-and-sandbox" in cmd.argv
    # The prompt goes on stdin, so one starting with '-' is never read as a flag.
    assert cmd.argv[-1] == "-" and cmd.stdin == "-n create hello.txt"
    assert cmd.env["CODEX_HOME"] == str(ctx.home / ".codex")
    assert cmd.env[KEY_ENV] == "tok-123"
    assert cmd.cwd == ctx.workspace


def test_codex_own_sandbox_mode(ctx: HarnessContext, fake_codex: Path) -> None:
    harness = CodexHarness(sandbox="workspace-write")
    argv = harness.command(ctx).argv
    assert argv[argv.index("-s") + 1] == "workspace-write"
    assert "--dangerously-bypass-approvals-and-sandbox" not in argv
    assert harness.config_dict(ctx)["sandbox_mode"] == "workspace-write"


def test_bad_option_is_one_line() -> None:
    with pytest.raises(OpenforgeError, match="harness CodexHarness option sandbox: Input should be"):
        CodexHarness(sandbox="docker")
    with pytest.raises(OpenforgeError, match=r"option colour: not a known option \(valid: .*sandbox"):
        CodexHarness(colour=True)


def test_install_returns_the_program_for_the_rollouts(fake_codex: Path) -> None:
    options = CodexHarness().install(log=lambda _line: None)
    assert options == {"bin": str(fake_codex.resolve())}
    CodexHarness(**options).check()


def test_missing_program_says_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BIN_ENV, raising=False)
    monkeypatch.setenv("OPENFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(HarnessMissingError, match=r"npm install -g @openai/codex@0\.171\.0"):
        CodexHarness().check()
    with pytest.raises(HarnessMissingError, match="bin=/nope is not an executable"):
        CodexHarness(bin="/nope").check()


# Event streams as Codex 0.171 printed them (trimmed), for a run that completed and one
# whose model endpoint failed.
COMPLETED = "\n".join(json.dumps(e) for e in [
    {"type": "thread.started", "thread_id": "th-1"},
    {"type": "item.completed", "item": {"id": "item_0", "type": "error",
                                        "message": "Model metadata for `policy` not found."}},
    {"type": "turn.started"},
    {"type": "item.completed", "item": {"id": "item_1", "type": "command_execution",
                                        "command": "/bin/bash -lc ls", "aggregated_output": "",
                                        "exit_code": 0, "status": "completed"}},
    {"type": "item.completed", "item": {"id": "item_2", "type": "agent_message", "text": "Done."}},
    {"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 3}},
])
FAILED = "\n".join(json.dumps(e) for e in [
    {"type": "thread.started", "thread_id": "th-2"},
    {"type": "turn.started"},
    {"type": "error", "message": "unexpected status 502 Bad Gateway: engine error"},
    {"type": "turn.failed", "error": {"message": "unexpected status 502 Bad Gateway: engine error"}},
])


def _session_file(ctx: HarnessContext, responses: int) -> None:
    folder = ctx.home / ".codex" / "sessions" / "2026" / "11" / "30"
    folder.mkdir(parents=True)
    items = [{"type": "session_meta", "payload": {"id": "th-1"}}]
    for _ in range(responses):
        items.append({"type": "response_item", "payload": {"type": "message"}})
        items.append({"type": "event_msg", "payload": {"type": "token_count", "info": {"x": 1}}})
    items.append({"type": "event_msg", "payload": {"type": "token_count", "info": None}})
    (folder / "rollout-2026-11-30T10-00-00-th-1.jsonl").write_text(
        "\n".join(json.dumps(i) for i in items) + "\n")


def test_parse_completed_run(ctx: HarnessContext) -> None:
    _session_file(ctx, responses=2)
    out = CodexHarness().parse_output(ctx, ProcessOutput(returncode=0, stdout="warning\n" + COMPLETED))
    assert out.status == "completed" and out.final_answer == "Done."
    assert out.transcript["model_requests"] == 2
    assert out.transcript["commands"][0]["exit_code"] == 0
    assert out.transcript["usage"]["output_tokens"] == 3


def test_a_session_file_the_agent_grew_is_read_bounded(
        ctx: HarnessContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session file is in the agent's HOME, as large as the agent makes it: only its
    first SESSION_MAX bytes are read, and the line they cut is skipped."""
    import openforge_codex.harness as codex

    _session_file(ctx, responses=2)
    [path] = (ctx.home / ".codex" / "sessions").glob("**/*.jsonl")
    whole = len(CodexHarness().read_session(ctx))
    with open(path, "a") as f:
        f.write(json.dumps({"type": "event_msg", "payload": {"pad": "x" * 5000}}) + "\n")
    monkeypatch.setattr(codex, "SESSION_MAX", path.stat().st_size - 100)
    assert len(CodexHarness().read_session(ctx)) == whole  # the cut line is left out
    monkeypatch.setattr(codex, "SESSION_MAX", 1 << 20)
    assert len(CodexHarness().read_session(ctx)) == whole + 1


def test_parse_failed_run(ctx: HarnessContext) -> None:
    out = CodexHarness().parse_output(ctx, ProcessOutput(returncode=1, stdout=FAILED))
    assert out.status == "failed"
    assert "502 Bad Gateway" in (out.error or "")


def test_parse_crash_timeout_and_signal(ctx: HarnessContext) -> None:
    harness = CodexHarness()
    crashed = harness.parse_output(ctx, ProcessOutput(returncode=101, stderr="thread 'main' panicked"))
    assert crashed.status == "crashed" and "panicked" in (crashed.error or "")
    assert harness.parse_output(ctx, ProcessOutput(returncode=None, timed_out=True)).status == "timeout"
    assert harness.parse_output(ctx, ProcessOutput(returncode=-9)).status == "crashed"
    # Events that stop before the turn ends (killed mid-turn) are a crash, not a success.
    partial = "\n".join(COMPLETED.splitlines()[:3])
    assert harness.parse_output(ctx, ProcessOutput(returncode=0, stdout=partial)).status == "crashed"


def test_last_message_file_is_the_fallback_answer(ctx: HarnessContext) -> None:
    (ctx.home / "codex-last-message.txt").write_text("From the file.\n")
    stdout = "\n".join(line for line in COMPLETED.splitlines() if "agent_message" not in line)
    out = CodexHarness().parse_output(ctx, ProcessOutput(returncode=0, stdout=stdout))
    assert out.final_answer == "From the file."


def test_parse_events_skips_junk() -> None:
    run = parse_events("not json\n{broken\n[1,2]\n" + COMPLETED)
    assert run.completed and run.thread_id == "th-1" and len(run.events) == 6


_TOML_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=10).filter(lambda k: "\x00" not in k),
                       st.one_of(_TOML_TEXT, st.integers(-2**62, 2**62), st.booleans(),
                                 st.lists(_TOML_TEXT, max_size=3),
                                 st.dictionaries(st.sampled_from(["a", "b-c", "d e"]), _TOML_TEXT)),
                       max_size=6))
def test_toml_writer_round_trips(data: dict) -> None:
    assert tomllib.loads(tomli_w.dumps(drop_none(data))) == data


def test_installed_alone_it_is_listed(tmp_path: Path) -> None:
    """`pip install ./plugins/openforge-codex` adds `codex` to `openforge plugins`."""
    # importlib.metadata lists each distribution once (the first on the path), so this copy
    # shadows any other installed one instead of registering the harness twice.
    pip_install(tmp_path / "site", CODEX)
    out = subprocess.run([sys.executable, "-m", "openforge.cli", "plugins"], capture_output=True,
                         text=True, env=with_path(tmp_path / "site"), timeout=120)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if " codex " in line)
    assert "openforge-codex" in row and "harness" in row
