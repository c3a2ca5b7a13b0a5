"""openforge x veRL 0.9.1 on CPU (the `verl` nox session; skipped where veRL does not import,
except where OPENFORGE_REQUIRE_VERL is set, as `nox -s verl` sets it: there a missing veRL fails).

1. The local trainer's math equals veRL's `core_algos` on the same batch (to 1e-6).
2. The agent loop end to end: a real gateway, the tiny model behind an
   `LLMServerClient`-compatible stand-in (`generate(request_id, prompt_ids=...,
   sampling_params=...)`), the `mini` harness, the demo environment; the outputs go through
   veRL's `AgentLoopWorker` post-processing into a `DataProto`, then GRPO advantages and the
   PPO loss with a backward pass on the tiny model.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

try:
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker
    from verl.trainer.ppo import core_algos
except Exception as exc:  # veRL (or one of its imports) is missing: this is the plain session
    if os.environ.get("OPENFORGE_REQUIRE_VERL"):
        raise  # the veRL session: a veRL that does not import is a failure, never a skip
    pytest.skip(f"verl is not importable ({type(exc).__name__}: {exc}); run `nox -s verl`",
                allow_module_level=True)

from openforge.training import algos


def _batch(seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    bs, length = 12, 9
    mask = (torch.rand(bs, length, generator=g) > 0.25).float()
    mask[:, 0] = 1.0  # every row has at least one generated token
    old = -torch.rand(bs, length, generator=g) * 3
    new = old + torch.randn(bs, length, generator=g) * 0.4
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 1.0, 1.0, 0.25, 0.0, 0.75, 1.0])
    groups = ["a", "a", "a", "a", "b", "b", "b", "c", "d", "d", "d", "d"]
    return {"mask": mask, "old": old, "new": new, "rewards": rewards, "groups": groups}


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_advantages_match_verl(norm_by_std: bool) -> None:
    b = _batch()
    mine = algos.grpo_advantages(b["rewards"], b["mask"], b["groups"], norm_by_std=norm_by_std,
                                 use_verl=False)
    token_rewards = torch.zeros_like(b["mask"])
    token_rewards[:, 0] = b["rewards"]
    theirs, _ = core_algos.compute_grpo_outcome_advantage(
        token_rewards, b["mask"], np.array(b["groups"], dtype=object),
        norm_adv_by_std_in_grpo=norm_by_std)
    assert torch.allclose(mine, theirs, atol=1e-6, rtol=0)
    via = algos.grpo_advantages(b["rewards"], b["mask"], b["groups"], norm_by_std=norm_by_std,
                                use_verl=True)
    assert torch.allclose(via, theirs, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_policy_loss_matches_verl_vanilla(mode: str) -> None:
    from omegaconf import OmegaConf

    b = _batch(1)
    adv = algos.grpo_advantages(b["rewards"], b["mask"], b["groups"], use_verl=False)
    cfg = algos.PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=mode)  # type: ignore[arg-type]
    new = b["new"].clone().requires_grad_(True)
    mine, mine_metrics = algos.policy_loss(b["old"], new, adv, b["mask"], cfg, use_verl=False)
    actor = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                              "clip_ratio_c": 3.0, "global_batch_info": {}})
    new_v = b["new"].clone().requires_grad_(True)
    theirs, their_metrics = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=b["old"], log_prob=new_v, advantages=adv, response_mask=b["mask"],
        loss_agg_mode=mode, config=actor)
    assert abs(mine.item() - theirs.item()) < 1e-6
    for key in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"):
        assert abs(mine_metrics[key] - their_metrics[f"actor/{key}"]) < 1e-6
    mine.backward()
    theirs.backward()
    assert new.grad is not None and new_v.grad is not None
    assert torch.allclose(new.grad, new_v.grad, atol=1e-6)
    via, _ = algos.policy_loss(b["old"], b["new"], adv, b["mask"], cfg, use_verl=True)
    assert abs(via.item() - theirs.item()) < 1e-6


@pytest.mark.parametrize("kind", ["k1", "k2", "low_var_kl", "abs"])
def test_kl_penalty_matches_verl(kind: str) -> None:
    b = _batch(2)
    mine = algos.kl_penalty(b["new"], b["old"], kind, use_verl=False)  # type: ignore[arg-type]
    theirs = core_algos.kl_penalty(b["new"], b["old"], kind)
    assert torch.allclose(mine, theirs, atol=1e-6)


def test_agg_loss_with_global_token_count_matches_verl() -> None:
    b = _batch(3)
    total = float(b["mask"].sum()) * 2
    mine = algos.agg_loss(b["new"], b["mask"], "token-mean", batch_num_tokens=total, use_verl=False)
    theirs = core_algos.agg_loss(b["new"], b["mask"], "token-mean", batch_num_tokens=total)
    assert math.isclose(mine.item(), theirs.item(), abs_tol=1e-6)


def test_local_trainer_defaults_to_verl_when_importable() -> None:
    assert algos.verl_core_algos() is core_algos


# -- the agent loop end to end ----------------------------------------------------------------


class TinyServerClient:
    """An `LLMServerClient` stand-in: veRL's `generate` signature, the tiny model behind it.

    Tokens and logprobs come from openforge's `local` engine (the tiny Qwen3); the reply is a
    veRL `TokenOutput` stamped with `global_steps`, as veRL's rollout servers do.
    """

    def __init__(self, engine: Any, global_steps: int) -> None:
        self.engine = engine
        self.global_steps = global_steps
        self.request_ids: list[str] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        from openforge.gateway.engines.base import GenerateRequest
        from openforge.types import SamplingParams

        self.request_ids.append(request_id)
        sampling = SamplingParams(temperature=sampling_params["temperature"],
                                  top_p=sampling_params.get("top_p", 1.0),
                                  max_tokens=sampling_params["max_tokens"],
                                  seed=len(self.request_ids))
        result = await self.engine.generate(GenerateRequest(
            prompt_ids=prompt_ids, sampling=sampling,
            stop_token_ids=sampling_params.get("stop_token_ids", [])))
        return TokenOutput(token_ids=result.completion_ids, log_probs=result.logprobs,
                           stop_reason="completed", extra_fields={"global_steps": self.global_steps})


def _trainer_config(model_path: str, prompt_length: int, response_length: int) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.create({
        "actor_rollout_ref": {"model": {"path": model_path},
                              "rollout": {"prompt_length": prompt_length,
                                          "response_length": response_length}},
        "data": {}})


async def test_agent_loop_end_to_end_into_grpo_and_a_backward_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The sandboxed rollout imports the test reward plugin through PYTHONPATH.
    import os

    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.protocol import DataProto

    from openforge.builtin.demo import DemoEnvironment
    from openforge.gateway.engines.local import LocalEngine
    from openforge.gateway.model import load_model_bundle
    from openforge.tinymodel import ensure_tiny_model
    from openforge.training.verl import (
        AGENT_NAME,
        OpenforgeAgentLoop,
        close_shared_rollouts,
        task_row,
    )

    tests_dir = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (tests_dir, os.environ.get("PYTHONPATH", "")) if p))
    model_dir = ensure_tiny_model()
    bundle = load_model_bundle(str(model_dir))
    client = TinyServerClient(LocalEngine(bundle), global_steps=7)
    run_file = tmp_path / "run.yaml"
    import yaml

    run_file.write_text(yaml.safe_dump({
        "harness": "mini", "harness_options": {"max_steps": 2, "max_tokens": 24},
        "environment": "demo", "reward": "training_plugins:AnswerParityReward",
        "sampling": {"max_tokens": 24}, "timeout_s": 120}))
    prompt_length, response_length = 1024, 128
    config = _trainer_config(str(model_dir), prompt_length, response_length)
    tokenizer = bundle.tokenizer
    tasks = [t for t in DemoEnvironment().tasks() if t.id in ("hello-file", "count-lines")]
    rows = [task_row(t, i, "train") for i, t in enumerate(tasks) for _ in range(4)]
    outputs: list[Any] = []
    try:
        for row in rows:
            loop = OpenforgeAgentLoop(
                trainer_config=DictConfigWrap(config), server_manager=client, tokenizer=tokenizer,
                processor=None, dataset_cls=None, data_config=DictConfigWrap(OmegaConf.create({})),
                run_config=str(run_file), work_dir=str(tmp_path / "work"))
            result = await loop.run({"temperature": 1.0, "top_p": 1.0}, raw_prompt=row["prompt"],
                                    **{k: v for k, v in row.items() if k != "prompt"})
            assert isinstance(result, list) and result
            outputs.append((row, result))
    finally:
        await close_shared_rollouts()

    statuses = [r[0].extra_fields["openforge_status"] for _, r in outputs]
    assert statuses == ["ok"] * len(rows), outputs[0][1][0].extra_fields["openforge_error"]
    # Sticky sessions: every call of one rollout used one request id (its session).
    assert len(set(client.request_ids)) == len(rows)
    engine_log = list(client.engine.log)
    for _row, result in outputs:
        for out in result:
            assert isinstance(out, AgentLoopOutput)
            assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
            assert out.extra_fields["min_global_steps"] == 7
            assert out.extra_fields["max_global_steps"] == 7
            assert out.reward_score in (0.0, 1.0)
            # Generated tokens carry exactly the logprobs the engine sampled them with.
            generated = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m]
            logps = [lp for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m]
            match = [e for e in engine_log if e.completion_ids == generated[:len(e.completion_ids)]]
            assert match and match[0].logprobs == pytest.approx(logps[:len(match[0].logprobs)])
            assert out.prompt_ids == match[0].prompt_ids
    rewards = [r[0].reward_score for _, r in outputs]
    assert 0.0 < sum(rewards) < len(rewards), f"want mixed rewards for a GRPO signal: {rewards}"

    # veRL's own post-processing: padding, masks, rm_scores, into one DataProto.
    worker = object.__new__(AgentLoopWorker)
    worker.tokenizer = tokenizer
    worker.processor = None
    worker.rollout_config = OmegaConf.create({"prompt_length": prompt_length,
                                              "response_length": response_length})
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    worker.mm_processor_kwargs = {}
    worker.teacher_server_manager = None
    internal = []
    for row, result in outputs:
        kwargs = {"raw_prompt": row["prompt"], **{k: v for k, v in row.items() if k != "prompt"}}
        internal.append(await worker._agent_loop_postprocess(result[-1], validate=False, **kwargs))
    batch: DataProto = worker._postprocess(internal)
    assert batch.batch["responses"].shape == (len(rows), response_length)
    assert batch.batch["input_ids"].shape == (len(rows), prompt_length + response_length)
    rm = batch.batch["rm_scores"]
    assert torch.equal(rm.sum(-1), torch.tensor(rewards))
    mask = batch.batch["response_mask"].float()
    assert bool(mask.any())

    # GRPO advantages (veRL) grouped by task, then veRL's PPO loss and a backward pass.
    index = np.array([row["extra_info"]["task_id"] for row, _ in outputs], dtype=object)
    adv, _ = core_algos.compute_grpo_outcome_advantage(rm, mask, index)
    assert bool((adv != 0).any())
    mine = algos.grpo_advantages(torch.tensor(rewards), mask, list(index), use_verl=False)
    assert torch.allclose(adv, mine, atol=1e-6)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    # Per-row forward on the unpadded tokens, as veRL's actor does with remove-padding.
    rows_logp = []
    for i in range(len(rows)):
        keep = batch.batch["attention_mask"][i].bool()
        ids = batch.batch["input_ids"][i][keep]
        n_prompt = int(batch.batch["attention_mask"][i, :prompt_length].sum())
        n_resp = len(ids) - n_prompt
        logits = model(input_ids=ids.unsqueeze(0)).logits[0, n_prompt - 1:-1].float()
        row_logp = torch.log_softmax(logits, -1).gather(-1, ids[n_prompt:].unsqueeze(-1)).squeeze(-1)
        rows_logp.append(torch.nn.functional.pad(row_logp, (0, response_length - n_resp)))
    logp = torch.stack(rows_logp)
    old = batch.batch["rollout_log_probs"]
    # The recorded logprobs are the tiny model's own: the trainer's forward agrees.
    assert torch.allclose((logp.detach() - old) * mask, torch.zeros_like(old), atol=1e-4)
    actor = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                              "clip_ratio_c": 3.0, "global_batch_info": {}})
    loss, _ = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
        loss_agg_mode="token-mean", config=actor)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    assert AGENT_NAME == rows[0]["agent_name"]


def test_launcher_writes_dataset_agent_loop_yaml_and_overrides(tmp_path: Path) -> None:
    import pyarrow.parquet as pq
    import yaml

    from openforge.config import TrainConfig
    from openforge.training.verl import AGENT_LOOP_TARGET, VerlTrainer

    config = TrainConfig.model_validate({
        "backend": "verl", "steps": 3, "learning_rate": 1e-6,
        "run": {"environment": "demo", "engine": {"model": "/models/Qwen3-0.6B"}},
        "options": {"output_dir": str(tmp_path / "out"), "n": 4, "dry_run": True}})
    command, _ = VerlTrainer().prepare(config)
    out = tmp_path / "out"
    rows = pq.read_table(out / "train.parquet").to_pylist()
    assert len(rows) == 12 and rows[0]["agent_name"] == "openforge_agent"
    assert rows[0]["prompt"][0]["role"] == "user" and rows[0]["extra_info"]["task_json"]
    loops = yaml.safe_load((out / "agent_loops.yaml").read_text())
    assert loops[0]["_target_"] == AGENT_LOOP_TARGET
    assert command[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert "actor_rollout_ref.rollout.n=4" in command
    assert "actor_rollout_ref.model.path=/models/Qwen3-0.6B" in command
    assert "trainer.total_training_steps=3" in command
    # demo has no split: no val.parquet (it would only repeat train.parquet), validation off
    assert not (out / "val.parquet").exists()
    assert f"data.val_files={out / 'train.parquet'}" in command
    assert "trainer.val_before_train=false" in command and "trainer.test_freq=-1" in command
    # Every override names a key that exists in veRL's own PPO config.
    import verl.trainer.config as verl_config
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(verl_config.__file__).parent), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=command[3:])
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "openforge_agent"
