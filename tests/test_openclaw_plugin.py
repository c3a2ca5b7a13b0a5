"""Unit tests of the `openclaw` harness plugin: config, command line, envelope parsing.

The plugin distribution lives in plugins/openforge-openclaw; its source folder is put on
sys.path here (the e2e tests install it for real).
"""

# ruff: noqa: F811  (the tiny_bundle fixture imported from fixtures_model is re-bound as an argument)

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest
import zstandard  # openforge's own dependency since its store writes zstd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins/openforge-openclaw/src"))

from fixtures_model import tiny_bundle  # noqa: E402, F401
from openforge_openclaw import harness as oc  # noqa: E402
from openforge_openclaw.config import build_config, provider_base_url  # noqa: E402
from openforge_openclaw.envelope import model_requests, parse_envelope, to_output  # noqa: E402

from openforge.errors import OpenforgeError  # noqa: E402
from openforge.gateway.branches import (  # noqa: E402
    BRANCH_HISTORY_REWRITTEN,
    BRANCH_TRANSIENT_CONTEXT,
    SessionTokens,
)
from openforge.gateway.conversation import ChatRequest, Message, Tool, ToolCall  # noqa: E402
from openforge.gateway.model import ModelBundle  # noqa: E402
from openforge.gateway.render import assistant_turn_ids  # noqa: E402
from openforge.harness import (  # noqa: E402
    HarnessContext,
    HarnessMissingError,
    McpServer,
    ProcessOutput,
)
from openforge.types import Task  # noqa: E402

URL = "http://127.0.0.1:4321/s/tok123/v1"


def _ctx(tmp_path: Path, prompt: str = "Create hello.txt", timeout_s: float = 300.0) -> HarnessContext:
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "ws").mkdir(exist_ok=True)
    return HarnessContext(task=Task(id="t", prompt=prompt), workspace=tmp_path / "ws",
                          home=tmp_path / "home", base_url=URL, api_key="tok123",
                          model="policy", timeout_s=timeout_s)


def _fake_install(tmp_path: Path) -> dict[str, str]:
    entry = tmp_path / "openclaw.mjs"
    node = tmp_path / "node"
    for path in (entry, node):
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return {"bin": str(entry), "node": str(node)}


@pytest.mark.parametrize(("api", "wire", "provider_api", "base"), [
    ("chat", "chat", "openai-completions", URL),
    ("responses", "responses", "openai-responses", URL),
    ("messages", "messages", "anthropic-messages", URL[: -len("/v1")]),
])
def test_config_points_the_provider_at_the_session(tmp_path: Path, api: str, wire: str,
                                                   provider_api: str, base: str) -> None:
    h = oc.create(api=api, **_fake_install(tmp_path))
    assert h.wire_api == wire
    ctx = _ctx(tmp_path)
    h.prepare(ctx)
    written = ctx.home / ".openclaw" / "openforge.json5"
    config = json.loads(written.read_text())
    provider = config["models"]["providers"]["of"]
    assert provider["baseUrl"] == base
    assert provider["apiKey"] == "tok123"
    assert provider["api"] == provider_api
    assert [m["id"] for m in provider["models"]] == ["policy"]
    assert config["models"]["mode"] == "replace"
    assert config["agents"]["defaults"]["model"]["primary"] == "of/policy"
    assert (ctx.home / ".openclaw" / "task.md").read_text() == "Create hello.txt"


def test_the_tasks_mcp_servers_are_direct_tools(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    options = oc.OpenClawOptions()
    assert "mcp" not in build_config(ctx, options) and "tools" not in build_config(ctx, options)
    ctx.mcp_servers = [McpServer(name="claw-eval", command="/usr/bin/python3", args=["-m", "b"])]
    config = build_config(ctx, options)
    assert config["mcp"] == {"servers": {"claw-eval": {
        "transport": "stdio", "command": "/usr/bin/python3", "args": ["-m", "b"], "env": {},
        "enabled": True}}}
    # Tool Search off: the MCP tools reach the model directly (claw-eval__<tool>).
    assert config["tools"] == {"toolSearch": False}


def test_extra_config_is_merged_last(tmp_path: Path) -> None:
    h = oc.create(config={"models": {"providers": {"of": {"headers": {"X": "1"}}}},
                          "tools": {"profile": "coding"}}, **_fake_install(tmp_path))
    config = build_config(_ctx(tmp_path), h.options)
    assert config["models"]["providers"]["of"]["headers"] == {"X": "1"}
    assert config["models"]["providers"]["of"]["apiKey"] == "tok123"
    assert config["tools"] == {"profile": "coding"}


def test_provider_base_url_keeps_v1_except_for_messages() -> None:
    assert provider_base_url(URL + "/", "chat") == URL
    assert provider_base_url(URL, "messages") == "http://127.0.0.1:4321/s/tok123"


def test_command_runs_openclaw_mjs_with_the_given_node(tmp_path: Path) -> None:
    paths = _fake_install(tmp_path)
    h = oc.create(thinking="off", **paths)
    ctx = _ctx(tmp_path, prompt="--help is not a flag here", timeout_s=300)
    h.prepare(ctx)
    cmd = h.command(ctx)
    assert cmd.argv[:4] == [paths["node"], str(Path(paths["bin"]).resolve()), "agent", "exec"]
    args = cmd.argv[4:]

    def value(flag: str) -> str:
        return args[args.index(flag) + 1]

    assert value("--config") == str(ctx.home / ".openclaw" / "openforge.json5")
    assert value("--model") == "of/policy"
    assert value("--cwd") == str(ctx.workspace)
    assert value("--state-dir") == str(ctx.home / ".openclaw" / "state")
    assert Path(value("--state-dir")).is_dir()  # OpenClaw refuses a missing one
    assert value("--thinking") == "off"
    assert "--json" in args
    # 300 s rollout - 10 s rollout reserve - 20 s margin: OpenClaw times out first.
    assert value("--timeout") == "270"
    assert Path(value("--message-file")).read_text() == "--help is not a flag here"
    assert "--help is not a flag here" not in args
    assert cmd.env["HOME"] == str(ctx.home)
    assert cmd.env["PATH"].split(":")[0] == str(tmp_path)
    assert cmd.cwd == ctx.workspace


def test_short_timeouts_keep_a_floor(tmp_path: Path) -> None:
    h = oc.create(**_fake_install(tmp_path))
    assert h.agent_timeout_s(_ctx(tmp_path, timeout_s=20)) == 30


def test_bad_options_are_one_line_errors() -> None:
    with pytest.raises(OpenforgeError, match="harness 'openclaw' option api"):
        oc.create(api="grpc")
    with pytest.raises(OpenforgeError, match="harness 'openclaw' option colour: not a known option"):
        oc.create(colour=True)


def test_missing_program_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENFORGE_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("OPENFORGE_OPENCLAW_BIN", raising=False)
    with pytest.raises(HarnessMissingError, match=r"openclaw@2026.9.6\) is not installed.*npm install .*--ignore-scripts openclaw@2026.9.6"):
        oc.create().check()
    with pytest.raises(HarnessMissingError, match="bin=.*is not a file"):
        oc.create(bin=str(tmp_path / "nope.mjs")).check()


OK = {"ok": True, "status": "ok", "final": "Created hello.txt.",
      "payloads": [{"text": "Created hello.txt."}], "usage": {"input": 120, "output": 8},
      "assistantTurns": 2, "toolSummary": {"calls": 1, "tools": ["exec"]},
      "model": "policy", "provider": "of", "sessionId": "019x"}


def _proc(stdout: str, code: int | None = 0, timed_out: bool = False, stderr: str = "") -> ProcessOutput:
    return ProcessOutput(returncode=code, stdout=stdout, stderr=stderr, timed_out=timed_out)


def test_ok_envelope_is_completed_with_the_final_answer() -> None:
    out = to_output(_proc(json.dumps(OK, indent=2)))
    assert out.status == "completed"
    assert out.final_answer == "Created hello.txt."
    assert out.transcript["assistantTurns"] == 2
    assert model_requests(parse_envelope(json.dumps(OK))) == 2


def test_envelope_after_diagnostic_lines_is_found() -> None:
    stdout = "[openclaw] warming up\n" + json.dumps(OK) + "\n"
    env = parse_envelope(stdout)
    assert env is not None and env.final_text == "Created hello.txt."


def test_final_falls_back_to_payload_texts() -> None:
    env = parse_envelope(json.dumps({**OK, "final": None, "payloads": [{"text": "a"}, {"text": "b"}]}))
    assert env is not None and env.final_text == "a\nb"


def test_error_envelope_is_a_harness_failure() -> None:
    body = {"ok": False, "status": "error", "error": {"message": "model returned an empty reply",
                                                      "kind": "result"}}
    out = to_output(_proc(json.dumps(body), code=1))
    assert out.status == "failed"
    assert out.error == "model returned an empty reply"
    assert model_requests(parse_envelope(json.dumps(body))) == 0


def test_endpoint_errors_are_infrastructure_failures() -> None:
    body = {"ok": False, "status": "error", "error": {"message": "503 Service Unavailable"}}
    out = to_output(_proc(json.dumps(body), code=1))
    assert out.status == "crashed" and "503" in (out.error or "")


def test_timeouts_by_status_exit_code_or_kill() -> None:
    body = {"ok": False, "status": "timeout", "error": {"message": "deadline exceeded"}}
    assert to_output(_proc(json.dumps(body), code=2)).status == "timeout"
    assert to_output(_proc("", code=None, timed_out=True)).status == "timeout"


def test_no_envelope_is_a_crash_with_the_stderr_tail() -> None:
    out = to_output(_proc("not json", code=1, stderr="Error: requires Node >=24.16.0"))
    assert out.status == "crashed"
    assert "requires Node" in (out.error or "")
    assert to_output(_proc("", code=-9)).error.startswith("openclaw killed by signal 9")


def test_parse_output_adds_the_request_count_and_api(tmp_path: Path) -> None:
    h = oc.create(api="responses", **_fake_install(tmp_path))
    out = h.parse_output(_ctx(tmp_path), _proc(json.dumps(OK)))
    assert out.transcript["model_requests"] == 2
    assert out.transcript["api"] == "responses"
    assert out.transcript["session_events"] is None  # OpenClaw stored no session


def _agent_db(state: Path) -> sqlite3.Connection:
    """An agent database laid out as OpenClaw 2026.9 keeps it (the columns it reads)."""
    db = state / "agents" / "main" / "agent" / "openclaw-agent.sqlite"
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE transcript_events (session_id TEXT NOT NULL, seq INTEGER NOT "
                 "NULL, event_json TEXT, created_at INTEGER NOT NULL, event_zstd BLOB, "
                 "event_utf8_bytes INTEGER, navigation_json TEXT, "
                 "PRIMARY KEY (session_id, seq))")
    return conn


def test_parse_output_reads_openclaws_session_events(tmp_path: Path) -> None:
    h = oc.create(**_fake_install(tmp_path))
    ctx = _ctx(tmp_path)
    h.prepare(ctx)
    header = {"type": "session", "version": 4, "id": "s-1", "cwd": str(ctx.workspace)}
    user = {"type": "message", "message": {"role": "user", "content": "Create hello.txt"}}
    # OpenClaw compresses an event of 1 KiB or more.
    big = {"type": "message", "message": {"role": "toolResult", "toolCallId": "c1",
                                          "toolName": "exec", "isError": False,
                                          "content": [{"type": "text", "text": "x" * 3000}]}}
    raw = json.dumps(big).encode()
    conn = _agent_db(oc.state_path(ctx))
    other = {"type": "session", "version": 4, "id": "s-0"}
    rows = [("s-0", 0, json.dumps(other), None, None), ("s-1", 0, json.dumps(header), None, None),
            ("s-1", 1, json.dumps(user), None, None),
            ("s-1", 2, None, zstandard.ZstdCompressor().compress(raw), len(raw))]
    conn.executemany("INSERT INTO transcript_events (session_id, seq, event_json, created_at, "
                     "event_zstd, event_utf8_bytes) VALUES (?, ?, ?, 0, ?, ?)", rows)
    conn.commit()
    conn.close()
    out = h.parse_output(ctx, _proc(json.dumps({**OK, "sessionId": "s-1"})))
    assert out.transcript["session_events"] == [header, user, big]


# -- the gateway and OpenClaw's per-request context note ------------------------------------

NOTE = Message(role="user", content="<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nActive exec sessions: none\n"
                                    "<<<END_OPENCLAW_INTERNAL_CONTEXT>>>")
EXEC = Tool(name="exec", description="Run shell", parameters={
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]})


def _call(tokens: SessionTokens, bundle: ModelBundle, messages: list[Message], reply: Message):
    request = ChatRequest(model="tiny", messages=messages, tools=[EXEC])
    rendered = tokens.render(request)
    completion = assistant_turn_ids(bundle, messages, reply, [EXEC])
    assistant, _ = tokens.parse(request, rendered.prompt_ids, completion)
    tokens.commit(request, rendered, completion, assistant)
    return rendered, assistant


def test_gateway_explains_the_dropped_context_note_as_a_branch(tiny_bundle: ModelBundle) -> None:
    """OpenClaw ends every request with an internal-context user message and drops it
    from the history of the next one: each call opens a `transient_context` branch."""
    tokens = SessionTokens(tiny_bundle)
    system = Message(role="system", content="You are a personal assistant running inside OpenClaw.")
    task = Message(role="user", content="Create hello.txt")
    call = ToolCall(id="c1", name="exec", arguments=json.dumps({"command": "touch hello.txt"}))
    first, reply = _call(tokens, tiny_bundle, [system, task, NOTE],
                         Message(role="assistant", content="", tool_calls=[call]))
    assert (first.branch, first.branch_reason) == (0, None)
    history = [system, task, reply, Message(role="tool", content="(no output)", tool_call_id="c1")]
    second, _ = _call(tokens, tiny_bundle, [*history, NOTE], Message(role="assistant", content="Done."))
    assert (second.branch, second.branch_reason) == (1, BRANCH_TRANSIENT_CONTEXT)
    # A plain edit of the history is still told apart.
    edited = [system, task, Message(role="user", content="Create bye.txt too."), NOTE]
    third = tokens.render(ChatRequest(model="tiny", messages=edited, tools=[EXEC]))
    assert third.branch_reason == BRANCH_HISTORY_REWRITTEN
