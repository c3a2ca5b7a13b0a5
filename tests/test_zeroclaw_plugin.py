"""Unit tests of the `zeroclaw` harness plugin: generated config (read back with tomllib),
command line, output parsing, and the missing-binary message.

The plugin distribution lives in plugins/openforge-zeroclaw; its source folder is put on
sys.path here. The end-to-end test (tests/e2e/test_zeroclaw.py) needs a real binary.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins/openforge-zeroclaw/src"))

from openforge_zeroclaw import harness as zc  # noqa: E402

from openforge.errors import OpenforgeError  # noqa: E402
from openforge.harness import HarnessContext, HarnessMissingError, ProcessOutput, drop_none  # noqa: E402
from openforge.types import Task  # noqa: E402

URL = "http://127.0.0.1:4321/s/tok123/v1"


def _ctx(tmp_path: Path, prompt: str = "Create hello.txt") -> HarnessContext:
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "ws").mkdir(exist_ok=True)
    return HarnessContext(task=Task(id="t", prompt=prompt), workspace=tmp_path / "ws",
                          home=tmp_path / "home", base_url=URL, api_key="tok123", model="policy")


@pytest.fixture()
def binary(tmp_path: Path) -> Path:
    path = tmp_path / "zeroclaw"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def _written(h: zc.ZeroClawHarness, ctx: HarnessContext) -> dict:
    h.prepare(ctx)
    return tomllib.loads((ctx.home / ".zeroclaw" / "config.toml").read_text())


def test_chat_config_uses_the_custom_slot(tmp_path: Path, binary: Path) -> None:
    h = zc.create(bin=str(binary))
    assert h.wire_api == "chat"
    config = _written(h, _ctx(tmp_path))
    assert config["schema_version"] == 3
    assert config["providers"]["models"] == {"custom": {"of": {
        "uri": URL, "model": "policy", "api_key": "tok123", "timeout_secs": 300}}}
    agent = config["agents"]["of"]
    assert agent["model_provider"] == "custom.of"
    assert agent["risk_profile"] == "of" and agent["runtime_profile"] == "of"
    assert agent["workspace"]["path"] == str(tmp_path / "ws")
    assert config["risk_profiles"]["of"]["level"] == "full"
    assert config["risk_profiles"]["of"]["sandbox_enabled"] is False
    assert config["runtime_profiles"]["of"]["max_tool_iterations"] == 20


def test_responses_opts_in_on_the_custom_slot(tmp_path: Path, binary: Path) -> None:
    h = zc.create(bin=str(binary), api="responses", max_tokens=512, temperature=0.3)
    assert h.wire_api == "responses"
    provider = _written(h, _ctx(tmp_path))["providers"]["models"]["custom"]["of"]
    assert provider["wire_api"] == "responses"
    assert provider["max_tokens"] == 512 and provider["temperature"] == 0.3


def test_messages_uses_the_anthropic_slot_without_v1(tmp_path: Path, binary: Path) -> None:
    h = zc.create(bin=str(binary), api="messages")
    assert h.wire_api == "messages"
    config = _written(h, _ctx(tmp_path))
    provider = config["providers"]["models"]["anthropic"]["of"]
    assert provider["uri"] == "http://127.0.0.1:4321/s/tok123"
    assert "wire_api" not in provider
    assert config["agents"]["of"]["model_provider"] == "anthropic.of"


def test_extra_config_is_merged_last(tmp_path: Path, binary: Path) -> None:
    h = zc.create(bin=str(binary), config={"risk_profiles": {"of": {"allowed_roots": ["/data"]}},
                                           "memory": {"backend": "none"}})
    config = _written(h, _ctx(tmp_path))
    assert config["risk_profiles"]["of"]["allowed_roots"] == ["/data"]
    assert config["risk_profiles"]["of"]["level"] == "full"
    assert config["memory"] == {"auto_save": False, "backend": "none"}


def test_toml_writer_round_trips_awkward_strings() -> None:
    data = {"a": {"weird key": {"s": 'quote " back\\ nl\n tab\t ünï', "n": 3, "f": 0.5,
                                "b": True, "l": ["x", "y"], "skip": None}}, "top": 1}
    assert tomllib.loads(tomli_w.dumps(drop_none(data))) == {
        "top": 1, "a": {"weird key": {"s": 'quote " back\\ nl\n tab\t ünï', "n": 3, "f": 0.5,
                                      "b": True, "l": ["x", "y"]}}}


def test_command(tmp_path: Path, binary: Path) -> None:
    h = zc.create(bin=str(binary))
    ctx = _ctx(tmp_path, prompt="-m looks like a flag")
    cmd = h.command(ctx)
    assert cmd.argv == [str(binary.resolve()), "agent", "-a", "of", "--message=-m looks like a flag"]
    assert cmd.env["HOME"] == str(ctx.home)
    assert cmd.env["ZEROCLAW_CONFIG_DIR"] == str(ctx.home / ".zeroclaw")
    assert cmd.cwd == ctx.workspace


def test_binary_from_env_then_path(tmp_path: Path, binary: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEROCLAW_BIN", str(binary))
    assert zc.create().install() == {"bin": str(binary.resolve())}
    monkeypatch.delenv("ZEROCLAW_BIN")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert zc.create().install() == {"bin": str(binary.resolve())}


def test_missing_binary_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZEROCLAW_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(HarnessMissingError, match="not installed.*releases.*ZEROCLAW_BIN"):
        zc.create().check()
    monkeypatch.setenv("ZEROCLAW_BIN", str(tmp_path / "missing"))
    with pytest.raises(HarnessMissingError, match="ZEROCLAW_BIN=.*not an executable"):
        zc.create().check()


def test_bad_options_are_one_line_errors() -> None:
    with pytest.raises(OpenforgeError, match="harness 'zeroclaw' option api"):
        zc.create(api="websocket")
    with pytest.raises(OpenforgeError, match="option max_tool_iterations"):
        zc.create(max_tool_iterations=0)


def _proc(stdout: str = "", code: int | None = 0, stderr: str = "", timed_out: bool = False) -> ProcessOutput:
    return ProcessOutput(returncode=code, stdout=stdout, stderr=stderr, timed_out=timed_out)


def test_output_mapping() -> None:
    out = zc.to_output(_proc("\x1b[1mCreated hello.txt.\x1b[0m\n"))
    assert out.status == "completed" and out.final_answer == "Created hello.txt."
    failed = zc.to_output(_proc(code=1, stderr="warn: x\nError: tool loop exceeded 20 iterations"))
    assert failed.status == "failed" and failed.error == "Error: tool loop exceeded 20 iterations"
    down = zc.to_output(_proc(code=1, stderr="Error: error sending request for url (http://127.0.0.1)"))
    assert down.status == "crashed"
    assert zc.to_output(_proc(code=None, timed_out=True)).status == "timeout"
    assert zc.to_output(_proc(code=-9)).status == "crashed"
