"""End to end: a real ZeroClaw binary against the real gateway, when there is one.

ZeroClaw is not published on npm, PyPI or crates.io, so it cannot be installed here:
these runs need `ZEROCLAW_BIN=/path/to/zeroclaw` and are skipped otherwise. Listing the
plugin after `pip install` needs no binary and always runs.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from openforge.store import Store

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("zeroclaw_script.yaml")
needs_binary = pytest.mark.skipif(
    not os.environ.get("ZEROCLAW_BIN"),
    reason="ZEROCLAW_BIN is not set: ZeroClaw cannot be installed here (no npm/PyPI/crates.io "
           "release); point ZEROCLAW_BIN at a zeroclaw binary to run this test")


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The openforge-zeroclaw distribution, installed into a folder of its own (None when the
    environment already has it, e.g. the nox session installed it: a second copy on
    PYTHONPATH would register the harness twice)."""
    try:
        importlib.metadata.distribution("openforge-zeroclaw")
        return None
    except importlib.metadata.PackageNotFoundError:
        pass
    target = tmp_path_factory.mktemp("zeroclaw-plugin")
    src = tmp_path_factory.mktemp("zeroclaw-build") / "openforge-zeroclaw"
    shutil.copytree(ROOT / "plugins/openforge-zeroclaw", src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(src)], check=True)
    return target


def _env(plugin_path: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if plugin_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugin_path), env.get("PYTHONPATH")]))
    return env


def test_installed_plugin_is_listed(plugin_path: Path | None) -> None:
    proc = subprocess.run([sys.executable, "-m", "openforge.cli", "plugins"], env=_env(plugin_path),
                          capture_output=True, text=True, timeout=120, check=True)
    line = next(ln for ln in proc.stdout.splitlines() if " zeroclaw " in ln)
    assert "harness" in line and "openforge-zeroclaw" in line


@needs_binary
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_scripted_task_passes(plugin_path: Path | None, tmp_path: Path, api: str) -> None:
    argv = [sys.executable, "-m", "openforge.cli", "run", "--harness", "zeroclaw", "--env", "demo",
            "--task", "hello-file", "--engine", "scripted", "--script", str(SCRIPT),
            "--timeout", "180", "--runs-dir", str(tmp_path), "--set", f"harness_options.api={api}"]
    proc = subprocess.run(argv, env=_env(plugin_path), capture_output=True, text=True,
                          timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    (record,) = [json.loads(ln) for ln in (run_dir / "results.jsonl").read_text().splitlines()]
    assert record["status"] == "ok" and record["passed"], record
    with Store(run_dir / "store.sqlite") as store:
        ((session, _result),) = store.list_results()
        calls = store.list_calls(session.id)
    assert len(calls) >= 2 and all(c.status == "ok" for c in calls)
    assert {c.dialect for c in calls} == {api}
