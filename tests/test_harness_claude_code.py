"""The `claude-code` harness plugin without the Claude Code binary: config, command, parsing.

The end-to-end run against the real binary is tests/e2e/test_real_harnesses.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness_plugins import CLAUDE_CODE, import_sources, pip_install, with_path

from openforge.errors import OpenforgeError
from openforge.harness import HarnessContext, HarnessMissingError, McpServer, ProcessOutput
from openforge.types import Task

import_sources(CLAUDE_CODE)

from openforge_claude_code.harness import (  # noqa: E402
    BIN_ENV,
    ClaudeCodeHarness,
    anthropic_base_url,
)
from openforge_claude_code.stream import parse_stream  # noqa: E402

URL = "http://127.0.0.1:4321/s/tok-123/v1"


@pytest.fixture
def ctx(tmp_path: Path) -> HarnessContext:
    (tmp_path / "home").mkdir()
    (tmp_path / "ws").mkdir()
    return HarnessContext(task=Task(id="t", prompt="--help me create hello.txt"),
                          workspace=tmp_path / "ws", home=tmp_path / "home", base_url=URL,
                          api_key="tok-123", model="policy")


@pytest.fixture
def fake_claude(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "bin" / "claude"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    monkeypatch.setenv(BIN_ENV, str(path))
    return path


def test_base_url_drops_v1_because_claude_appends_it() -> None:
    assert anthropic_base_url(URL) == "http://127.0.0.1:4321/s/tok-123"
    assert anthropic_base_url(URL + "/") == "http://127.0.0.1:4321/s/tok-123"
    assert anthropic_base_url("http://h:1/s/t") == "http://h:1/s/t"


def test_environment_points_at_the_session(ctx: HarnessContext, fake_claude: Path) -> None:
    cmd = ClaudeCodeHarness().command(ctx)
    env = cmd.env
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:4321/s/tok-123"
    assert env["ANTHROPIC_API_KEY"] == "tok-123"
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_SMALL_FAST_MODEL"] == "policy"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CONFIG_DIR"] == str(ctx.home / ".claude")
    assert env["IS_SANDBOX"] == "1"  # --dangerously-skip-permissions as root needs it
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS" not in env


def test_command_is_headless_and_unattended(ctx: HarnessContext, fake_claude: Path) -> None:
    cmd = ClaudeCodeHarness(max_turns=8, max_output_tokens=256).command(ctx)
    argv = cmd.argv
    assert argv[0] == str(fake_claude.resolve())
    assert argv[1:5] == ["-p", "--output-format", "stream-json", "--verbose"]
    assert argv[argv.index("--model") + 1] == "policy"
    assert "--dangerously-skip-permissions" in argv
    assert argv[argv.index("--disallowedTools") + 1] == "WebFetch,WebSearch"
    assert argv[argv.index("--max-turns") + 1] == "8"
    assert cmd.env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "256"
    # The prompt goes on stdin, never as an argument that could be read as a flag.
    assert cmd.stdin == "--help me create hello.txt" and cmd.stdin not in argv
    assert cmd.cwd == ctx.workspace


def test_allowed_tools_mode(ctx: HarnessContext, fake_claude: Path) -> None:
    argv = ClaudeCodeHarness(permissions="allowed", allowed_tools=["Bash", "Write"],
                             disallowed_tools=[]).command(ctx).argv
    assert argv[argv.index("--allowedTools") + 1] == "Bash,Write"
    assert "--dangerously-skip-permissions" not in argv and "--disallowedTools" not in argv


def test_the_tasks_mcp_servers_are_passed_with_mcp_config(ctx: HarnessContext,
                                                         fake_claude: Path) -> None:
    harness = ClaudeCodeHarness()
    harness.prepare(ctx)
    assert "--mcp-config" not in harness.command(ctx).argv
    ctx.mcp_servers = [McpServer(name="claw-eval", command="/usr/bin/python3", args=["-m", "b"])]
    harness.prepare(ctx)
    argv = harness.command(ctx).argv
    path = Path(argv[argv.index("--mcp-config") + 1])
    assert path == ctx.home / ".claude/mcp.json" and "--strict-mcp-config" in argv
    assert json.loads(path.read_text()) == {"mcpServers": {"claw-eval": {
        "type": "stdio", "command": "/usr/bin/python3", "args": ["-m", "b"], "env": {}}}}
    allowed = ClaudeCodeHarness(permissions="allowed").command(ctx).argv
    assert "mcp__claw-eval" in allowed[allowed.index("--allowedTools") + 1].split(",")


def test_settings_written_in_the_isolated_home(ctx: HarnessContext) -> None:
    ClaudeCodeHarness(settings={"model": "x"}).prepare(ctx)
    settings = json.loads((ctx.home / ".claude" / "settings.json").read_text())
    assert settings["autoUpdates"] is False
    assert settings["permissions"] == {"deny": ["WebFetch", "WebSearch"]}
    assert settings["env"]["DISABLE_TELEMETRY"] == "1"
    assert settings["model"] == "x"


def test_bad_option_is_one_line() -> None:
    with pytest.raises(OpenforgeError, match="claude-code harness option permissions: Input should be"):
        ClaudeCodeHarness(permissions="ask")


def test_install_and_missing(tmp_path: Path, fake_claude: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    options = ClaudeCodeHarness().install(log=lambda _line: None)
    assert options == {"bin": str(fake_claude.resolve())}
    ClaudeCodeHarness(**options).check()
    monkeypatch.delenv(BIN_ENV)
    monkeypatch.setenv("OPENFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(HarnessMissingError, match=r"npm install -g @anthropic-ai/claude-code@2\.1\.332"):
        ClaudeCodeHarness().check()


def _line(kind: str, **fields: object) -> str:
    return json.dumps({"type": kind, **fields})


def _assistant(message_id: str, block: dict, model: str = "policy") -> str:
    return _line("assistant", message={"id": message_id, "model": model, "content": [block]})


# A stream as Claude Code 2.1.332 printed it (trimmed): a Bash call then an answer; the
# first response has two content blocks, printed as two lines with one message id.
SUCCESS = "\n".join([
    _line("system", subtype="init", tools=["Bash", "Write"], model="policy"),
    _assistant("msg_1", {"type": "thinking", "thinking": "Make the file."}),
    _assistant("msg_1", {"type": "tool_use", "id": "call_1", "name": "Bash",
                         "input": {"command": "echo hi > hello.txt"}}),
    _line("user", message={"content": [{"type": "tool_result", "tool_use_id": "call_1"}]}),
    _assistant("msg_2", {"type": "text", "text": "Created hello.txt."}),
    _line("result", subtype="success", is_error=False, result="Created hello.txt.", num_turns=2,
          terminal_reason="completed"),
])
API_ERROR = "\n".join([
    _line("system", subtype="init"),
    _assistant("msg_1", {"type": "text", "text": "partial"}),
    _assistant("uuid-1", {"type": "text", "text": "API Error: response exceeded 64 tokens"},
               model="<synthetic>"),
    _line("result", subtype="success", is_error=True, api_error="max_output_tokens",
          terminal_reason="api_error", result="API Error: response exceeded 64 tokens"),
])


def test_parse_success(ctx: HarnessContext) -> None:
    out = ClaudeCodeHarness().parse_output(ctx, ProcessOutput(returncode=0, stdout=SUCCESS))
    assert out.status == "completed" and out.final_answer == "Created hello.txt."
    assert out.transcript["model_requests"] == 2
    assert out.transcript["tool_uses"] == [{"name": "Bash", "input": {"command": "echo hi > hello.txt"}}]


def test_parse_api_error_is_the_harness_own_failure(ctx: HarnessContext) -> None:
    out = ClaudeCodeHarness().parse_output(ctx, ProcessOutput(returncode=1, stdout=API_ERROR))
    assert out.status == "failed"
    assert out.error == "max_output_tokens: API Error: response exceeded 64 tokens"
    assert out.transcript["model_requests"] == 1  # the <synthetic> message is not a response


def test_parse_json_output_format_result_only(ctx: HarnessContext) -> None:
    stdout = _line("result", subtype="success", is_error=False, result="ok")
    out = ClaudeCodeHarness().parse_output(ctx, ProcessOutput(returncode=0, stdout=stdout))
    assert out.status == "completed" and out.final_answer == "ok"


def test_parse_crash_timeout_signal(ctx: HarnessContext) -> None:
    harness = ClaudeCodeHarness()
    crashed = harness.parse_output(ctx, ProcessOutput(returncode=1, stderr="Error: boom"))
    assert crashed.status == "crashed" and "boom" in (crashed.error or "")
    assert harness.parse_output(ctx, ProcessOutput(returncode=None, timed_out=True)).status == "timeout"
    assert harness.parse_output(ctx, ProcessOutput(returncode=-11)).status == "crashed"


def test_parse_stream_skips_junk() -> None:
    run = parse_stream("[claude-code:unrecognized_model] {...}\n{bad json\n" + SUCCESS)
    assert run.succeeded and run.init is not None and run.assistant_message_ids == ["msg_1", "msg_2"]


def test_installed_alone_it_is_listed(tmp_path: Path) -> None:
    # importlib.metadata lists each distribution once (the first on the path), so this copy
    # shadows any other installed one instead of registering the harness twice.
    pip_install(tmp_path / "site", CLAUDE_CODE)
    out = subprocess.run([sys.executable, "-m", "openforge.cli", "plugins"], capture_output=True,
                         text=True, env=with_path(tmp_path / "site"), timeout=120)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if " claude-code " in line)
    assert "openforge-claude-code" in row and "harness" in row
