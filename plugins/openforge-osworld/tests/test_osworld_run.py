"""`openforge run --harness gui-agent --env osworld --reward osworld --engine scripted`, for real.

openforge-gui and openforge-osworld are installed with pip into a private folder (the
distributions as users get them, entry points included) and the real `openforge` CLI runs
one task end to end: the gui-agent harness process reads the stand-in VM's screen through
the computer API, the scripted policy's replies become pyautogui actions that DesktopEnv
sends into the VM, and DesktopEnv's evaluator scores the result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import HERE, StandinVM
from harness_plugins import pip_install

PLUGIN = HERE.parent
GUI = PLUGIN.parents[1] / "openforge_gui"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    pip_install(target, GUI, PLUGIN)
    return target


def openforge(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "openforge.cli", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_both_plugins_are_listed_from_their_distributions(site: Path) -> None:
    out = openforge(site, "plugins")
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if "openforge-osworld" in line]
    assert any("environment" in r and "osworld" in r for r in rows)
    assert any("reward" in r and "osworld" in r for r in rows)


@pytest.mark.parametrize(("solution", "score"), [("right.yaml", 1.0), ("wrong.yaml", 0.0)])
def test_one_task_end_to_end(site: Path, standin_vm: StandinVM, tmp_path: Path,
                             solution: str, score: float) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "environment_options": standin_vm.environment_options(index="test_all.json"),
        "harness_options": {"max_steps": 6, "history": 1},
        # The stand-in VM's folders are under this test's /tmp, which bubblewrap's private
        # /tmp would hide from the rollout (a docker or cloud VM is reached over the network).
        "executor_options": {"sandbox": "none"},
    }))
    out = openforge(site, "run", "--config", str(config), "--harness", "gui-agent",
                    "--env", "osworld", "--reward", "osworld", "--engine", "scripted",
                    "--model", "tiny-vl",
                    "--script", str(HERE / "solutions" / solution),
                    "--task", "standin-notes-save", "--runs-dir", str(tmp_path / "runs"),
                    "--timeout", "240")
    assert out.returncode == 0, out.stderr[-3000:]
    [run_dir] = (tmp_path / "runs").iterdir()
    [record] = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert record["status"] == "ok", record.get("error")
    assert record["reward"] == score and record["passed"] is (score == 1.0)
    assert record["reward_details"]["evaluator"] == "check_include_exclude"
    saved = (standin_vm.home / "notes.txt").read_text()
    assert saved == ("hello world" if score else "")
