"""Every shipped harness gets the session URL and token through its environment or a file in
its own HOME, never through argv (which every process on the machine reads with `ps`), and
names the program paths the isolating sandboxes must map."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness_plugins import CLAUDE_CODE, CODEX, PLUGINS, import_sources

from openforge.builtin.mini import MiniHarness
from openforge.harness import Harness, HarnessContext
from openforge.npm import program_root
from openforge.types import Task

import_sources(CODEX, CLAUDE_CODE, PLUGINS / "openforge-openclaw", PLUGINS / "openforge-zeroclaw")

TOKEN = "tok-SECRET-4f1c9e"
URL = f"http://127.0.0.1:4321/s/{TOKEN}/v1"


def _program(tmp_path: Path, name: str) -> str:
    path = tmp_path / "pkg" / "node_modules" / ".bin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


def _mini(tmp_path: Path) -> Harness:
    return MiniHarness()


def _codex(tmp_path: Path) -> Harness:
    from openforge_codex.harness import CodexHarness

    return CodexHarness(bin=_program(tmp_path, "codex"))


def _claude_code(tmp_path: Path) -> Harness:
    from openforge_claude_code.harness import ClaudeCodeHarness

    return ClaudeCodeHarness(bin=_program(tmp_path, "claude"))


def _openclaw(tmp_path: Path) -> Harness:
    from openforge_openclaw import harness as oc

    return oc.create(bin=_program(tmp_path, "openclaw.mjs"), node=_program(tmp_path, "node"))


def _zeroclaw(tmp_path: Path) -> Harness:
    from openforge_zeroclaw import harness as zc

    return zc.ZeroClawHarness(bin=_program(tmp_path, "zeroclaw"))


HARNESSES: dict[str, Callable[[Path], Harness]] = {
    "mini": _mini, "codex": _codex, "claude-code": _claude_code, "openclaw": _openclaw,
    "zeroclaw": _zeroclaw}


def _files_under(home: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in home.rglob("*") if p.is_file())


@pytest.mark.parametrize("name", list(HARNESSES))
def test_the_token_never_reaches_argv(tmp_path: Path, name: str) -> None:
    harness = HARNESSES[name](tmp_path)
    (tmp_path / "home").mkdir()
    (tmp_path / "ws").mkdir()
    ctx = HarnessContext(task=Task(id="t", prompt="do it"), workspace=tmp_path / "ws",
                         home=tmp_path / "home", base_url=URL, api_key=TOKEN, model="policy")
    harness.prepare(ctx)
    command = harness.command(ctx)
    assert not [arg for arg in command.argv if TOKEN in arg], command.argv
    # ... and yet the harness gets it, in its environment or its own HOME.
    assert TOKEN in " ".join(command.env.values()) + _files_under(ctx.home)


@pytest.mark.parametrize("name", ["codex", "claude-code", "openclaw", "zeroclaw"])
def test_program_paths_name_the_installed_program(tmp_path: Path, name: str) -> None:
    harness = HARNESSES[name](tmp_path)
    paths: list[Any] = harness.program_paths()
    # npm programs: the whole package (its node_modules); a lone binary: the file.
    expected = (tmp_path / "pkg/node_modules/.bin/zeroclaw" if name == "zeroclaw"
                else tmp_path / "pkg").resolve()
    assert expected in paths, paths


def test_program_root_is_the_package_holding_node_modules(tmp_path: Path) -> None:
    program = Path(_program(tmp_path, "codex"))
    assert program_root(program) == (tmp_path / "pkg").resolve()
    assert program_root(sys.executable) == Path(os.path.realpath(sys.executable))
    assert MiniHarness().program_paths() == []  # the Python running openforge is mapped anyway
