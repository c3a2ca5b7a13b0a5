"""Exports: token-level samples, veRL rows and SFT rows, round-tripped through `datasets`."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import datasets
import openai
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from fixtures_model import tiny_bundle  # noqa: F401  (pytest fixture)

from openforge import export as export_mod
from openforge import plugins
from openforge.cli import cli
from openforge.config import EngineConfig, GatewayConfig
from openforge.export import (
    AGENT_NAME,
    SAMPLES_SCHEMA,
    SFT_SCHEMA,
    VERL_SCHEMA,
    ExportError,
    export_run,
    final_conversation,
    iter_rows,
)
from openforge.gateway.model import ModelBundle
from openforge.gateway.server import Gateway
from openforge.store import Store
from openforge.trajectory import build_samples
from openforge.types import Call, RewardResult, RolloutResult, Session, Task

IM_END = 151645
SYS = [151644, 8948, 198, 5, IM_END, 198]


def load(path: Path) -> datasets.Dataset:
    return datasets.load_dataset("parquet", data_files=str(path), split="train")


def synthetic_session(store: Store, sid: str, *, turns: int = 3, run_id: str = "run",
                      reward: float | None = None, metadata: dict[str, Any] | None = None,
                      side_call: bool = False) -> list[Call]:
    """A linear tool session of `turns` calls (+ an optional side call), with chat requests."""
    store.create_session(Session(id=sid, token=f"tok-{sid}", run_id=run_id, rollout_id=f"r-{sid}",
                                 task_id=f"task-{sid}", metadata=metadata or {}))
    calls: list[Call] = []
    prompt = SYS + [151644, 872, 198, 40, IM_END, 198, 151644, 77091, 198]
    for i in range(turns):
        completion = [1000 + i, 1001 + i, IM_END]
        c = Call(id=f"{sid}-{i}", session_id=sid, index=i, prompt_ids=list(prompt),
                 completion_ids=completion, logprobs=[-0.5, -0.25, -0.125], finish_reason="stop",
                 weight_version="w1",
                 request={"model": "policy", "messages": [
                     {"role": "system", "content": "be brief"},
                     {"role": "user", "content": f"task of {sid}"}]},
                 response={"choices": [{"index": 0, "finish_reason": "stop", "message": {
                     "role": "assistant", "content": f"answer {i}"}}]})
        store.add_call(c)
        calls.append(c)
        prompt = prompt + completion + [198, 151644, 872, 198, 50 + i, IM_END, 198]
    if side_call:
        c = Call(id=f"{sid}-side", session_id=sid, index=turns, prompt_ids=[151644, 7, IM_END],
                 completion_ids=[8, IM_END], logprobs=[-1.0, -2.0])
        store.add_call(c)
        calls.append(c)
    if reward is not None:
        store.set_reward(sid, reward)
    return calls


# -- samples -------------------------------------------------------------------------------


def test_samples_export_round_trips_through_datasets(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with Store(run / "store.sqlite") as store:
        calls_a = synthetic_session(store, "a", turns=4, reward=1.0, side_call=True)
        calls_b = synthetic_session(store, "b", turns=2, reward=0.0)
        synthetic_session(store, "c", turns=1)
        store.save_result("c", RolloutResult(rollout_id="r-c", status="infra_error"))
        expected = (build_samples(calls_a, store.get_session("a")).samples
                    + build_samples(calls_b, store.get_session("b")).samples)
    written = export_run(run, "samples", tmp_path / "out")
    assert written == tmp_path / "out" / "data.parquet"
    assert pq.read_schema(written).equals(SAMPLES_SCHEMA)
    ds = load(written)
    assert len(ds) == 3  # a: main + side call, b: main; c is an infra failure: left out
    rows = list(ds)
    for row, sample in zip(rows, expected, strict=True):
        assert row["sample_id"] == sample.sample_id
        assert row["prompt_ids"] == sample.prompt_ids
        assert row["response_ids"] == sample.response_ids
        assert row["response_mask"] == sample.response_mask
        assert row["response_logprobs"] == pytest.approx(sample.response_logprobs)
        assert row["call_ids"] == sample.call_ids
        assert row["reward"] == sample.reward
        assert row["branch_reason"] == sample.branch_reason
        assert row["exact_tokens"] is True
    assert rows[1]["branch_reason"] == "side_call"
    assert sum(rows[0]["response_mask"]) == 12
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "response_mask" in readme and "Rows: 3" in readme
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["sessions"] == 2 and metrics["samples"] == 3


def test_samples_are_written_in_several_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store(tmp_path / "s.sqlite") as store:
        for i in range(7):
            synthetic_session(store, f"s{i}", turns=2)
    monkeypatch.setattr(export_mod, "BATCH_ROWS", 2)
    path = export_run(tmp_path / "s.sqlite", "samples", tmp_path / "out")
    assert pq.ParquetFile(path).num_row_groups == 4  # 2+2+2+1 rows: streamed, not one table
    assert [r["sample_id"] for r in iter_rows(path, batch_size=3)] == [f"s{i}/0" for i in range(7)]


def test_empty_store_exports_an_empty_file(tmp_path: Path) -> None:
    Store(tmp_path / "e.sqlite").close()
    for fmt in ("samples", "verl", "sft"):
        path = export_run(tmp_path / "e.sqlite", fmt, tmp_path / fmt)
        assert pq.ParquetFile(path).metadata.num_rows == 0


# -- verl ----------------------------------------------------------------------------------


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_verl_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    with Store(run / "store.sqlite") as store:
        synthetic_session(store, "a", reward=1.0, metadata={
            "prompt": "Fix the failing test.", "ground_truth": {"tests": ["t1"]},
            "data_source": "claw", "ability": "coding"})
        store.save_result("a", RolloutResult(rollout_id="r-a", status="ok",
                                             reward=RewardResult(score=1.0, passed=True)))
        synthetic_session(store, "b")  # no metadata: prompt from the first call's request
        synthetic_session(store, "c")
        store.save_result("c", RolloutResult(rollout_id="r-c", status="timeout"))
        store.create_session(Session(id="d", token="tok-d", run_id="run"))  # nothing asked
    return run


def test_verl_rows_have_the_documented_layout(tmp_path: Path) -> None:
    path = export_run(make_verl_run(tmp_path), "verl", tmp_path / "out")
    assert pq.read_schema(path).equals(VERL_SCHEMA)
    rows = list(load(path))
    assert len(rows) == 2
    a, b = rows
    assert a["data_source"] == "claw" and a["ability"] == "coding"
    assert a["prompt"] == [{"role": "user", "content": "Fix the failing test."}]
    assert a["reward_model"] == {"style": "rule", "ground_truth": '{"tests": ["t1"]}'}
    assert a["agent_name"] == AGENT_NAME
    task_json = Task(id="task-a", prompt="Fix the failing test.").model_dump_json()
    assert a["extra_info"] == {"index": 0, "task_id": "task-a", "rollout_id": "r-a",
                               "session_id": "a", "run_id": "run", "reward": 1.0,
                               "passed": True, "status": "ok", "split": None,
                               "task_json": task_json}
    assert b["prompt"] == [{"role": "user", "content": "task of b"}]
    assert b["data_source"] == "openforge" and b["ability"] == "agent"
    assert b["extra_info"]["index"] == 1 and b["extra_info"]["reward"] is None
    assert b["reward_model"]["ground_truth"] == ""


@pytest.mark.skipif(importlib.util.find_spec("verl") is None
                    and not os.environ.get("OPENFORGE_REQUIRE_VERL"),
                    reason="verl is not installed (pip install 'openforge[verl]'); run `nox -s verl`")
def test_verl_rows_load_with_verls_own_dataset(tmp_path: Path) -> None:
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from openforge.tinymodel import ensure_tiny_model

    path = export_run(make_verl_run(tmp_path), "verl", tmp_path / "out")
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 256,
                               "filter_overlong_prompts": True,
                               "filter_overlong_prompts_workers": 1,
                               "cache_dir": str(tmp_path / "verl-cache")})
    # verl measures prompts with the tokenizer's own chat template; the tiny model's tokenizer
    # has none (openforge renders with `renderers`), so give it plain ChatML.
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model())
    tokenizer.chat_template = CHATML
    dataset = RLHFDataset(data_files=str(path), tokenizer=tokenizer, config=config)
    assert len(dataset) == 2
    item = dataset[0]
    assert item["raw_prompt"] == [{"role": "user", "content": "Fix the failing test."}]
    assert item["agent_name"] == AGENT_NAME
    assert item["index"] == 0 and item["extra_info"]["session_id"] == "a"
    assert item["reward_model"]["style"] == "rule"


# -- sft from a real recorded gateway run ---------------------------------------------------

SHELL = {"type": "function", "function": {
    "name": "shell", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                   "required": ["cmd"]}}}


@pytest.fixture
async def recorded_run(tmp_path: Path, tiny_bundle: ModelBundle  # noqa: F811
                       ) -> AsyncIterator[tuple[Path, dict[str, Session]]]:
    """A run recorded through the real gateway: chat, Messages and Responses sessions."""
    run = tmp_path / "run"
    run.mkdir()
    store = Store(run / "store.sqlite")
    replies = [{"tool_calls": [{"name": "shell", "arguments": {"cmd": "ls"}}]},
               {"content": "Done: two files."}] * 3
    engine = plugins.create("engine", "scripted", model=tiny_bundle, replies=replies)
    gw = Gateway(GatewayConfig(), EngineConfig(name="scripted"), store, engine=engine,
                 bundle=tiny_bundle)
    await gw.start()
    sessions: dict[str, Session] = {}
    try:
        # OpenAI chat, a tool loop
        s = sessions["chat"] = gw.open_session(run_id="run", rollout_id="r-chat", task_id="t")
        c = openai.AsyncOpenAI(base_url=gw.session_url(s), api_key=s.token)
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                                          {"role": "user", "content": "list the files"}]
        r = await c.chat.completions.create(model="policy", messages=messages, tools=[SHELL])
        tc = r.choices[0].message.tool_calls[0]
        messages += [{"role": "assistant", "content": "", "tool_calls": [tc.model_dump()]},
                     {"role": "tool", "tool_call_id": tc.id, "content": "a.txt b.txt"}]
        await c.chat.completions.create(model="policy", messages=messages, tools=[SHELL])
        await c.close()
        # Anthropic Messages, streaming
        s = sessions["messages"] = gw.open_session(run_id="run", rollout_id="r-msg", task_id="t")
        a = anthropic.AsyncAnthropic(base_url=gw.url + f"/s/{s.token}", api_key=s.token)
        tool = {"name": "shell", "description": "Run a shell command.",
                "input_schema": SHELL["function"]["parameters"]}
        history: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
        async with a.messages.stream(model="policy", max_tokens=64, system="You are an agent.",
                                     messages=history, tools=[tool]) as stream:
            first = await stream.get_final_message()
        use = next(b for b in first.content if b.type == "tool_use")
        history += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                  "content": "a.txt b.txt"}]}]
        await a.messages.create(model="policy", max_tokens=64, system="You are an agent.",
                                messages=history, tools=[tool])
        await a.close()
        # OpenAI Responses, failing task (not exported as SFT)
        s = sessions["responses"] = gw.open_session(run_id="run", rollout_id="r-resp", task_id="t")
        c = openai.AsyncOpenAI(base_url=gw.session_url(s), api_key=s.token)
        await c.responses.create(model="policy", input="list the files",
                                 instructions="You are an agent.")
        await c.close()
    finally:
        await gw.stop()
    store.save_result(sessions["chat"].id, RolloutResult(
        rollout_id="r-chat", reward=RewardResult(score=1.0, passed=True)))
    store.save_result(sessions["messages"].id, RolloutResult(
        rollout_id="r-msg", reward=RewardResult(score=0.9, passed=True)))
    store.set_reward(sessions["messages"].id, 0.9)
    store.save_result(sessions["responses"].id, RolloutResult(
        rollout_id="r-resp", reward=RewardResult(score=0.0, passed=False)))
    store.close()
    yield run, sessions


async def test_sft_rows_rebuild_the_final_conversation(recorded_run: tuple[Path, dict[str, Session]],
                                                       tmp_path: Path) -> None:
    run, sessions = recorded_run
    path = export_run(run, "sft", tmp_path / "sft")
    assert pq.read_schema(path).equals(SFT_SCHEMA)
    rows = {r["session_id"]: r for r in load(path)}
    assert set(rows) == {sessions["chat"].id, sessions["messages"].id}  # the passing ones

    chat = rows[sessions["chat"].id]
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert chat["messages"][1]["content"] == "list the files"
    call = chat["messages"][2]["tool_calls"][0]
    assert call["function"]["name"] == "shell"
    assert json.loads(call["function"]["arguments"]) == {"cmd": "ls"}
    assert chat["messages"][3]["tool_call_id"] == call["id"]
    assert chat["messages"][-1]["content"] == "Done: two files."
    assert json.loads(chat["tools"])[0]["function"]["name"] == "shell"
    assert chat["num_turns"] == 2 and chat["reward"] == 1.0

    # the failing Responses session is left out, but its conversation rebuilds all the same
    with Store(run / "store.sqlite") as store:
        [resp_call] = store.list_calls(sessions["responses"].id)
    conversation = final_conversation(resp_call)
    assert [m.role for m in conversation.messages] == ["system", "user", "assistant"]
    assert conversation.messages[1].content == "list the files"
    assert conversation.messages[2].tool_calls[0].name == "shell"

    msg = rows[sessions["messages"].id]
    assert [m["role"] for m in msg["messages"]] == ["system", "user", "assistant", "tool",
                                                     "assistant"]
    assert msg["messages"][0]["content"] == "You are an agent."
    assert msg["messages"][-1]["content"] == "Done: two files."
    assert msg["reward"] == 0.9


async def test_recorded_run_exports_samples_and_verl(recorded_run: tuple[Path, dict[str, Session]],
                                                     tmp_path: Path) -> None:
    run, sessions = recorded_run
    samples = {r["session_id"]: r for r in load(export_run(run, "samples", tmp_path / "s"))}
    # each tool session merged into one sample; the generated ids carry the engine's logprobs
    assert len(samples) == 3
    chat = samples[sessions["chat"].id]
    assert chat["num_turns"] == 2 and chat["branch_reason"] is None
    assert 0 in chat["response_mask"] and 1 in chat["response_mask"]
    verl = {r["extra_info"]["session_id"]: r for r in load(export_run(run, "verl", tmp_path / "v"))}
    assert verl[sessions["chat"].id]["prompt"] == [{"role": "user", "content": "list the files"}]
    assert verl[sessions["messages"].id]["prompt"][0]["content"] == "list the files"
    assert verl[sessions["responses"].id]["prompt"][0]["content"] == "list the files"


# -- errors --------------------------------------------------------------------------------


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="has no store.sqlite"):
        export_run(tmp_path, "samples", tmp_path / "out")
    with pytest.raises(ExportError, match="does not exist"):
        export_run(tmp_path / "missing", "samples", tmp_path / "out")
    Store(tmp_path / "store.sqlite").close()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ExportError, match="is a file"):
        export_run(tmp_path, "samples", tmp_path / "file")
    with pytest.raises(ExportError, match="unknown export format"):
        export_run(tmp_path, "csv", tmp_path / "out")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(ExportError, match="not an openforge store"):
        export_run(junk, "samples", tmp_path / "out")
    assert not (tmp_path / "out" / ".data.parquet.partial").exists()


def test_cli_export(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with Store(run / "store.sqlite") as store:
        synthetic_session(store, "a")
    runner = CliRunner()
    result = runner.invoke(cli, ["export", str(run), "--format", "samples", "--out",
                                 str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "data.parquet" in result.output
    assert len(load(tmp_path / "out" / "data.parquet")) == 1
    direct = runner.invoke(cli, ["export", str(run / "store.sqlite"), "--format", "verl",
                                 "--out", str(tmp_path / "o3")])
    assert direct.exit_code == 0, direct.output
    assert len(load(tmp_path / "o3" / "data.parquet")) == 1
    missing = runner.invoke(cli, ["export", str(tmp_path), "--out", str(tmp_path / "o2")])
    assert missing.exit_code == 2
    assert "error:" in missing.output and "Traceback" not in missing.output


# -- from a real run: the Task travels whole; the ground truth comes from it -----------------


def test_verl_export_rows_carry_the_task_like_train_writes_them(tmp_path: Path) -> None:
    from openforge.config import RunConfig
    from openforge.runner import run_from_config
    from openforge.training.verl import row_task, task_row

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "hello", "prompt": "Create hello.txt saying hi.",
                                 "split": "train", "ground_truth": {"hello.txt": "hi"},
                                 "check": {"files": {"hello.txt": "hi"}}}) + "\n")
    config = RunConfig(environment="tasks", environment_options={"path": str(tasks)},
                       engine=EngineConfig(name="scripted", options={"replies": [
                           {"tool_calls": [{"name": "write_file", "arguments": {
                               "path": "hello.txt", "content": "hi"}}]}, {"content": "Done."}]}),
                       runs_dir=tmp_path / "runs")
    summary = run_from_config(config)
    [row] = load(export_run(summary.run_dir, "verl", tmp_path / "verl"))
    [task] = plugins.create("environment", "tasks", path=str(tasks)).tasks()
    # The same row `openforge train --backend verl` writes for this task, but for the run's
    # own figures: the veRL agent loop rebuilds the very same Task from either.
    written = task_row(task, 0, "train")
    assert row["extra_info"]["task_json"] == written["extra_info"]["task_json"]
    assert row_task(row) == task
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["passed"] is True
    assert row["reward_model"] == written["reward_model"] == {
        "style": "rule", "ground_truth": '{"hello.txt": "hi"}'}
    assert row["data_source"] == "tasks"


def test_verl_launcher_holds_out_test_tasks_only(tmp_path: Path) -> None:
    from openforge.config import TrainConfig
    from openforge.training.verl import VerlTrainer

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "prompt": "p", "split": split}) + "\n"
                             for i, split in enumerate(["train", "train", "test"])))
    split = TrainConfig.model_validate({
        "backend": "verl", "run": {"environment": "tasks",
                                   "environment_options": {"path": str(tasks)}},
        "options": {"output_dir": str(tmp_path / "split"), "dry_run": True}})
    command, _ = VerlTrainer().prepare(split)
    out = tmp_path / "split"
    assert [r["extra_info"]["task_id"] for r in pq.read_table(out / "train.parquet").to_pylist()] \
        == ["t0", "t1"]
    assert [r["extra_info"]["task_id"] for r in pq.read_table(out / "val.parquet").to_pylist()] \
        == ["t2"]
    assert f"data.val_files={out / 'val.parquet'}" in command
    unsplit = TrainConfig.model_validate({
        "backend": "verl", "run": {"environment": "demo"},
        "options": {"output_dir": str(tmp_path / "demo"), "dry_run": True}})
    command, _ = VerlTrainer().prepare(unsplit)
    out = tmp_path / "demo"
    assert len(pq.read_table(out / "train.parquet")) == 12
    assert not (out / "val.parquet").exists()  # it would only repeat train.parquet
    assert f"data.val_files={out / 'train.parquet'}" in command
    assert "trainer.val_before_train=false" in command and "trainer.test_freq=-1" in command


def test_an_export_of_zero_rows_says_why(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with Store(run / "store.sqlite") as store:
        synthetic_session(store, "a", reward=0.0)
        store.save_result("a", RolloutResult(rollout_id="r-a", status="ok",
                                             reward=RewardResult(score=0.0, passed=False)))
        synthetic_session(store, "b")
        store.save_result("b", RolloutResult(rollout_id="r-b", status="timeout"))
    result = CliRunner().invoke(cli, ["export", str(run), "--format", "sft", "--out",
                                      str(tmp_path / "sft")])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"wrote {tmp_path / 'sft' / 'data.parquet'} (0 rows)",
        "note: 0 rows: every session was left out (did not pass (SFT rows come from passing "
        "rollouts only): 1; infrastructure failures: 1)"]
    some = CliRunner().invoke(cli, ["export", str(run), "--format", "samples", "--out",
                                    str(tmp_path / "samples")])
    assert some.output.splitlines() == [f"wrote {tmp_path / 'samples' / 'data.parquet'} (1 rows)"]
