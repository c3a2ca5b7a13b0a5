"""claw-judge through litellm against a real local OpenAI-compatible HTTP server (the
judge's calls recorded apart, never via a session URL), and the `claw` recipe's configs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from conftest import SOLUTIONS, JudgeStandIn, apply_script
from openforge.config import TrainConfig
from openforge.errors import OpenforgeError
from openforge.training.recipes import run_recipe
from rich.console import Console

from openforge_claw.environment import ClawEnvironment
from openforge_claw.rewards import JudgeReward, parse_score

# litellm would otherwise try to download its price list (no network in CI sandboxes).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _graded(tmp_path: Path, script: Path | None, reward: JudgeReward):
    env = ClawEnvironment()
    task = next(t for t in env.tasks() if t.id == "files-greeting")
    ws = tmp_path / "ws"
    ws.mkdir(parents=True)
    env.prepare(task, ws)
    answer = apply_script(script, task, ws) if script else ""
    state = {**env.final_state(task, ws), "final_answer": answer}
    env.close()
    return reward.score(task, env, ws, state)


def test_judge_scores_through_litellm_and_logs_apart(tmp_path: Path, judge: JudgeStandIn) -> None:
    pytest.importorskip("litellm", reason="pip install 'openforge-claw[judge]' (nox -s claw does)")
    log = tmp_path / "judge.jsonl"
    reward = JudgeReward(model="openai/judge", api_base=judge.url, api_key_env="NO_SUCH_KEY",
                         log=str(log))
    judge.answer = json.dumps({"score": 0.9, "reason": "ok"})
    good = _graded(tmp_path / "a", SOLUTIONS / "mini.yaml", reward)
    assert good.passed and good.details["judge"] == 0.9
    assert good.score == pytest.approx(0.5 * 1.0 + 0.5 * 0.9)
    assert "Rubric:" in judge.requests[-1]["body"]["messages"][1]["content"]
    record = json.loads(log.read_text().splitlines()[-1])
    assert record["task_id"] == "files-greeting" and record["score"] == 0.9
    # A failed automated part gates the judge's share off (QwenClawBench's hybrid rule).
    bad = _graded(tmp_path / "b", SOLUTIONS / "wrong_mini.yaml", reward)
    assert not bad.passed and bad.details["judge"] == 0.9 and bad.score < 0.2


def test_judge_refuses_a_session_url_and_unreadable_answers() -> None:
    with pytest.raises(OpenforgeError, match="session URL"):
        JudgeReward(model="m", api_base="http://127.0.0.1:9/s/tok123/v1")
    with pytest.raises(OpenforgeError, match="options"):
        JudgeReward()
    assert parse_score('sure: {"score": 0.25, "reason": "x"}') == 0.25
    assert parse_score("Score: 1") == 1.0
    with pytest.raises(OpenforgeError, match="no score"):
        parse_score("looks fine")


def test_claw_recipe_writes_verl_and_local_configs(tmp_path: Path) -> None:
    out = tmp_path / "claw"
    summary = run_recipe("claw", None, [f"output_dir={out}", "launch=false", "backend=local"],
                         Console(file=open("/dev/null", "w")))
    assert summary["launched"] is False
    verl = TrainConfig.model_validate(yaml.safe_load((out / "verl.yaml").read_text()))
    assert verl.backend == "verl" and verl.run.environment == "claw"
    assert verl.run.reward == "claw-grader" and verl.run.split == "train"
    assert verl.options["model_path"].startswith("Qwen/") and verl.run.harness == "openclaw"
    local = TrainConfig.model_validate(yaml.safe_load((out / "local.yaml").read_text()))
    assert local.backend == "local" and local.run.engine.name == "local"
    assert local.run.harness == "mini" and local.run.k >= 2


def test_claw_recipe_prepares_verl_without_launching(tmp_path: Path) -> None:
    out = tmp_path / "claw"
    run_recipe("claw", None, [f"output_dir={out}", "launch=false"],
               Console(file=open("/dev/null", "w")))
    command = (out / "verl/command.sh").read_text()
    assert "actor_rollout_ref.model.path=Qwen/Qwen3-4B-Instruct-2507" in command
    assert "algorithm.adv_estimator=grpo" in command
    assert (out / "verl/train.parquet").exists() and (out / "verl/val.parquet").exists()


def test_unknown_recipe_lists_the_registered_ones() -> None:
    with pytest.raises(OpenforgeError, match="unknown recipe 'nope'.*claw.*demo"):
        run_recipe("nope")
