"""The online-mind2web environment and the mind2web-judge reward: task loading, the `sites`
mapping, the benchmark's result layout, and one task end to end through the real
`openforge run --harness gui-agent --env online-mind2web --reward mind2web-judge --engine
scripted` against a stand-in website (tests/site, served locally) and a stand-in judge server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import HERE, JudgeServer
from harness_plugins import pip_install
from openforge_gui.webtasks import TaskFileError
from openforge_mind2web.environment import OnlineMind2WebEnvironment, write_result
from openforge_mind2web.judge import Mind2WebJudgeReward

from openforge.types import Task

PLUGIN = HERE.parent
GUI = PLUGIN.parents[1] / "openforge_gui"


def test_tasks_load_from_json_and_jsonl(tmp_path: Path) -> None:
    tasks = list(OnlineMind2WebEnvironment(path=str(HERE / "tasks.json")).tasks())
    assert [t.id for t in tasks] == ["mugshop-blue-price", "mugshop-red-price"]
    assert {t.environment for t in tasks} == {"online-mind2web"}
    assert tasks[0].data["reference_length"] == 2 and tasks[0].data["level"] == "easy"
    assert tasks[0].prompt.startswith("Find the price of the blue mug")
    assert "Start at https://www.mugshop.example/" in tasks[0].prompt
    rows = json.loads((HERE / "tasks.json").read_text())
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert list(OnlineMind2WebEnvironment(path=str(jsonl)).tasks()) == tasks


def test_a_task_without_its_website_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('[{"task_id": "x", "confirmed_task": "do it"}]')
    with pytest.raises(TaskFileError, match=r"bad.json: task 1: website: Field required"):
        list(OnlineMind2WebEnvironment(path=str(bad)).tasks())


def _task(website: str) -> Task:
    return Task(id="t", environment="online-mind2web", prompt="p",
                data={"start_url": website, "task_text": "Find the mug."})


def test_the_sites_option_maps_a_website_with_or_without_its_slash() -> None:
    env = OnlineMind2WebEnvironment(path="tasks.json",
                                    sites={"https://www.mugshop.example": "http://127.0.0.1:1/"})
    assert env.start_url(_task("https://www.mugshop.example/")) == "http://127.0.0.1:1/"
    assert env.start_url(_task("https://other.example/")) == "https://other.example/"


def test_the_result_layout_keeps_the_answer_out_of_the_action_history(tmp_path: Path) -> None:
    shot = tmp_path / "s.png"
    shot.write_bytes(b"\x89PNG not really")
    episode = {"answer": "$12", "failed": False, "history": [
        {"step": 1, "action": {"type": "click"}, "action_text": "click(1, 2)",
         "screenshot": str(shot)},
        {"step": 2, "action": {"type": "answer"}, "action_text": 'answer("$12")',
         "screenshot": str(shot)}]}
    folder = write_result(_task("https://www.mugshop.example/"), episode, tmp_path)
    result = json.loads((folder / "result.json").read_text())
    assert result["action_history"] == ["click(1, 2)"] and result["final_result_response"] == "$12"
    assert result["task"] == "Find the mug." and result["website"] == "https://www.mugshop.example/"
    assert sorted(p.name for p in (folder / "trajectory").iterdir()) == [
        "0_full_screenshot.png", "1_full_screenshot.png"]


def test_what_the_agent_left_in_the_result_folder_is_not_the_benchmarks_input(
        tmp_path: Path) -> None:
    """An agent that can write its workspace plants a screenshot in its result folder (the
    benchmark's scripts would judge it), and links the folder's parent out of the workspace
    (the result would be written onto the host): neither survives `write_result`."""
    shot = tmp_path / "s.png"
    shot.write_bytes(b"\x89PNG captured")
    episode = {"answer": "$12", "failed": False, "history": [
        {"step": 1, "action": {"type": "click"}, "action_text": "click(1, 2)",
         "screenshot": str(shot)}]}
    workspace = tmp_path / "ws"
    planted = workspace / ".openforge" / "mind2web" / "t" / "trajectory"
    planted.mkdir(parents=True)
    (planted / "7_full_screenshot.png").write_bytes(b"\x89PNG forged success page")
    folder = write_result(_task("https://www.mugshop.example/"), episode, workspace)
    assert [p.name for p in (folder / "trajectory").iterdir()] == ["0_full_screenshot.png"]
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / ".openforge" / "mind2web").rename(tmp_path / "old")
    (workspace / ".openforge" / "mind2web").symlink_to(outside)
    folder = write_result(_task("https://www.mugshop.example/"), episode, workspace)
    assert list(outside.iterdir()) == [] and not folder.resolve().is_relative_to(outside)
    assert (workspace / ".openforge" / "mind2web" / "t" / "result.json").is_file()


def test_mind2web_judge_is_webjudge_with_the_benchmarks_default_model() -> None:
    assert Mind2WebJudgeReward().model == "openai/o4-mini"
    assert Mind2WebJudgeReward(model="openai/judge").model == "openai/judge"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site-packages")
    pip_install(target, GUI, PLUGIN)
    return target


@pytest.mark.parametrize(("solution", "passed"), [("right.yaml", True), ("wrong.yaml", False)])
def test_one_task_end_to_end(installed: Path, site: str, judge: JudgeServer, tmp_path: Path,
                             solution: str, passed: bool) -> None:
    judge_log = tmp_path / "judge.jsonl"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "environment_options": {"path": str(HERE / "tasks.json"), "width": 800,
                                "height": 600, "sites": {"https://www.mugshop.example/": site}},
        "reward_options": {"model": "openai/judge", "api_base": judge.url, "api_key": "judge-key",
                           "log": str(judge_log)},
        "harness_options": {"max_steps": 4, "history": 1},
        "executor_options": {"sandbox": "none"},  # the judge log is under this test's /tmp
    }))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(installed), os.environ.get("PYTHONPATH")])))
    out = subprocess.run(
        [sys.executable, "-m", "openforge.cli", "run", "--config", str(config),
         "--harness", "gui-agent", "--env", "online-mind2web", "--reward", "mind2web-judge",
         "--engine", "scripted", "--model", "tiny-vl", "--script",
         str(HERE / "solutions" / solution), "--task", "mugshop-blue-price",
         "--runs-dir", str(tmp_path / "runs"), "--timeout", "180"],
        capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    [run_dir] = (tmp_path / "runs").iterdir()
    [record] = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert record["status"] == "ok", record.get("error")
    assert record["passed"] is passed and record["reward"] == float(passed)
    details = record["reward_details"]
    # Key points, one rating per screenshot, the verdict: all through litellm to the stand-in.
    stages = [json.loads(line)["stage"] for line in judge_log.read_text().splitlines()]
    steps = 2 if passed else 1
    assert stages == ["key_points"] + ["screenshot"] * steps + ["verdict"]
    assert details["judge_calls"] == len(judge.requests) == len(stages)
    verdict_request = judge.requests[-1]["messages"][-1]["content"]
    images = [p for p in verdict_request if p["type"] == "image_url"]
    assert len(images) == steps  # every screenshot scored 4 >= 3 was kept
    if passed:
        assert "click_element" in verdict_request[0]["text"]
    # The judge's calls are not training data: the store holds the agent's calls only.
    from openforge.store import Store

    with Store(run_dir / "store.sqlite") as store:
        calls = store.list_calls(record["session_id"])
    assert len(calls) == steps
    assert all("Status:" not in json.dumps(c.response) for c in calls)
