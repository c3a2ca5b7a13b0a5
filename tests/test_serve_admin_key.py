"""`openforge serve`: the admin key comes from the environment, never from (or into) argv."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from openforge.cli import cli
from openforge.config import RunConfig
from openforge.gateway.server import GatewayError, admin_key, refuse_key_on_argv


def test_the_key_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENFORGE_ADMIN_KEY", "from-env")
    config, where = admin_key(RunConfig(), tmp_path / "gw.sqlite")
    assert config.gateway.admin_key == "from-env" and where == "from $OPENFORGE_ADMIN_KEY"
    assert not (tmp_path / "gw.sqlite.admin-key").exists()


def test_without_one_a_random_key_goes_to_a_private_file(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENFORGE_ADMIN_KEY", raising=False)
    config, where = admin_key(RunConfig(), tmp_path / "gw.sqlite")
    path = tmp_path / "gw.sqlite.admin-key"
    key = config.gateway.admin_key
    assert key and path.read_text().strip() == key
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert key not in where and str(path) in where  # the line names the file, not the key


def test_a_key_on_the_command_line_is_refused(tmp_path: Path) -> None:
    with pytest.raises(GatewayError, match=r"visible to every process \(ps\)"):
        refuse_key_on_argv(["engine.name=scripted", "gateway.admin_key=oops"])
    result = CliRunner().invoke(cli, ["serve", "--set", "gateway.admin_key=oops",
                                      "--store", str(tmp_path / "s.sqlite")])
    assert result.exit_code != 0 and "OPENFORGE_ADMIN_KEY" in result.output
    assert "--admin-key" not in CliRunner().invoke(cli, ["serve", "--help"]).output
