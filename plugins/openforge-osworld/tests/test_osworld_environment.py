"""The osworld environment against DesktopEnv and a stand-in VM, over the real computer API.

Each test prepares a rollout exactly as `openforge.rollout` does (prepare -> harness acts
through .openforge/computer.json -> final_state -> reward -> close) and checks what reached
the VM and what DesktopEnv's evaluator made of it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import StandinVM
from openforge_gui.computer import ComputerClient
from openforge_osworld.desktop import DesktopError
from openforge_osworld.environment import OSWorldEnvironment, png_size
from openforge_osworld.reward import OSWorldReward

from openforge.types import Task


def task_named(env: OSWorldEnvironment, task_id: str) -> Task:
    return next(t for t in env.tasks() if t.id == task_id)


def events(vm: StandinVM) -> list[dict]:
    return json.loads((vm.vmx.parent / "disk" / "state.json").read_text())["events"]


def run_episode(vm: StandinVM, tmp_path: Path, task_id: str, actions: list[dict],
                **options: object) -> tuple[OSWorldEnvironment, dict, object]:
    env = OSWorldEnvironment(**vm.environment_options(**options))
    task = task_named(env, task_id)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env.prepare(task, workspace)
    try:
        client = ComputerClient.from_workspace(workspace)
        first = client.observation()
        assert first.step == 0 and not first.done
        assert (first.width, first.height) == (640, 400)
        for action in actions:
            client.act(action)
        final = env.final_state(task, workspace)
        verdict = OSWorldReward().score(task, env, workspace, final)
    finally:
        env.close()
    return env, final, verdict


SOLVE = [{"type": "click", "x": 300, "y": 200}, {"type": "type", "text": "hello world"},
         {"type": "key", "keys": "Control+s"}, {"type": "answer", "text": "saved"}]


def test_a_solved_task_scores_one_with_the_tasks_own_evaluator(standin_vm: StandinVM,
                                                                tmp_path: Path) -> None:
    _, final, verdict = run_episode(standin_vm, tmp_path, "standin-notes-save", SOLVE)
    assert verdict.score == 1.0 and verdict.passed
    assert verdict.details["evaluator"] == "check_include_exclude"
    assert (standin_vm.home / "notes.txt").read_text() == "hello world"
    # What the VM ran: exactly the pyautogui calls the actions map to, then DONE.
    calls = [(e["call"], e["args"]) for e in events(standin_vm)]
    assert calls == [("click", [300, 200]), ("typewrite", ["hello world"]),
                     ("hotkey", ["ctrl", "s"])]
    assert final["osworld"]["last_action"] == "DONE"
    assert final["episode"]["answer"] == "saved" and final["episode"]["steps"] == 4


def test_a_wrong_solution_scores_zero(standin_vm: StandinVM, tmp_path: Path) -> None:
    # Typed without focusing the editor first: the text is lost, the saved note is empty.
    wrong = [{"type": "type", "text": "hello world"}, {"type": "key", "keys": "Control+s"},
             {"type": "answer", "text": "saved"}]
    _, _, verdict = run_episode(standin_vm, tmp_path, "standin-notes-save", wrong)
    assert verdict.score == 0.0 and not verdict.passed
    assert (standin_vm.home / "notes.txt").read_text() == ""


def test_giving_up_on_a_feasible_task_scores_zero(standin_vm: StandinVM, tmp_path: Path) -> None:
    actions = SOLVE[:3] + [{"type": "fail", "reason": "cannot"}]
    _, final, verdict = run_episode(standin_vm, tmp_path, "standin-notes-save", actions)
    assert final["osworld"]["last_action"] == "FAIL"
    assert verdict.score == 0.0  # DesktopEnv: FAIL as last action fails a feasible task


@pytest.mark.parametrize(("end", "score"), [({"type": "fail", "reason": "no printer"}, 1.0),
                                            ({"type": "answer", "text": "printed"}, 0.0)])
def test_an_infeasible_task_passes_only_on_fail(standin_vm: StandinVM, tmp_path: Path,
                                                end: dict, score: float) -> None:
    _, _, verdict = run_episode(standin_vm, tmp_path, "standin-infeasible", [end])
    assert verdict.score == score
    assert verdict.details["evaluator"] == "infeasible"


def test_computer_13_action_space(standin_vm: StandinVM, tmp_path: Path) -> None:
    _, _, verdict = run_episode(standin_vm, tmp_path, "standin-notes-save", SOLVE,
                                action_space="computer_13")
    assert verdict.score == 1.0
    assert [e["call"] for e in events(standin_vm)] == ["click", "typewrite", "hotkey"]


def _prepared(standin_vm: StandinVM, tmp_path: Path
              ) -> tuple[OSWorldEnvironment, Task, Path]:
    """The notes task prepared in a fresh workspace (the VM running, its screen served)."""
    env = OSWorldEnvironment(**standin_vm.environment_options())
    task = task_named(env, "standin-notes-save")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env.prepare(task, workspace)
    return env, task, workspace


def test_screenshots_follow_the_vm_and_desktop_only_actions_are_refused(
        standin_vm: StandinVM, tmp_path: Path) -> None:
    env, task, workspace = _prepared(standin_vm, tmp_path)
    try:
        client = ComputerClient.from_workspace(workspace)
        before = client.observation().screenshot
        assert client.act({"type": "click", "x": 100, "y": 100}).ok
        after = client.observation().screenshot
        assert after != before  # the focused editor is drawn differently
        refused = client.act({"type": "goto", "url": "https://example.com"})
        assert not refused.ok and "browser" in (refused.error or "")
        # The kept screenshots reach the workspace with the final state, once the agent is
        # gone (openforge-gui's ComputerEnvironment).
        env.final_state(task, workspace)
        kept = sorted(p.name for p in (workspace / ".openforge" / "screens").iterdir())
        assert kept == ["step-1.png", "step-2.png"]
        png = (workspace / ".openforge" / "screens" / "step-1.png").read_bytes()
        assert png_size(png) == (640, 400)
    finally:
        env.close()
    # close() stopped the VM through the provider.
    assert not (standin_vm.vmx.parent / "run").exists()


def test_a_worker_without_desktop_env_is_a_clear_error(standin_vm: StandinVM,
                                                       tmp_path: Path) -> None:
    options = standin_vm.environment_options(python=sys.executable,
                                             worker_env={"PYTHONPATH": str(tmp_path)})
    env = OSWorldEnvironment(**options)
    task = task_named(env, "standin-notes-save")
    with pytest.raises(DesktopError, match="start failed: ModuleNotFoundError"):
        env.prepare(task, tmp_path)
    env.close()


def test_desktop_envs_cache_is_out_of_the_agents_reach(standin_vm: StandinVM,
                                                       tmp_path: Path) -> None:
    """DesktopEnv's getters take a file already in its cache for the download (OSWorld's
    `get_cloud_file` fetches the expected file only when it is not there): by default the
    cache is the rollout's own folder outside the workspace, and goes with the rollout."""
    env, task, workspace = _prepared(standin_vm, tmp_path)
    try:
        cache = Path(env.desktop_options(workspace)["cache_dir"])
        assert not cache.resolve().is_relative_to(workspace.resolve())
        assert (cache / task.id).is_dir()  # DesktopEnv.reset made the task's cache there
        assert not list(workspace.rglob("*cache*"))
    finally:
        env.close()
    assert not cache.exists()
