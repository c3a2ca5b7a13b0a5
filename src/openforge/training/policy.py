"""The policy being trained: a transformers causal LM, its optimizer, SFT and GRPO updates.

`PolicyOptimizer` knows nothing about gateways or rollouts: it takes `Sample`s (token ids,
response mask, recorded logprobs, reward) and returns the step's metrics. Checkpoints are
ordinary model folders (`save_pretrained` + the tokenizer files of the source model), so a
checkpoint can be served by the `local` engine or loaded by veRL as is.
"""

from __future__ import annotations

import copy
import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from openforge.training import algos
from openforge.training.batch import batch_logprobs, make_batch
from openforge.types import Sample

TRAINER_STATE = "trainer_state.pt"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


class PolicyOptions(BaseModel):
    """Optimization knobs shared by SFT and GRPO (defaults follow veRL's GRPO examples)."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch_size: int = Field(default=8, ge=1)
    temperature: float = Field(default=1.0, gt=0)  # the rollout's sampling temperature
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: algos.LossAggMode = "token-mean"
    norm_adv_by_std: bool = True
    kl_coef: float = 0.0  # > 0: penalize KL to the frozen initial policy
    kl_kind: algos.KLKind = "low_var_kl"
    use_verl: bool | None = None  # None: veRL's core_algos when importable
    # GRPO: passes over each step's rollouts, in mini-batches of whole rollouts; each
    # mini-batch is one optimizer update (veRL's actor.ppo_epochs / ppo_mini_batch_size).
    # After the first update the clipped ratio against the recorded logprobs bounds how far
    # the later updates may move the policy.
    ppo_epochs: int = Field(default=1, ge=1)
    ppo_mini_batches: int = Field(default=1, ge=1)
    # False: the token embedding (and the output head, when tied to it) is frozen. On a small
    # model it is most of the parameters, and Adam scales the near-zero gradients of the rows
    # of tokens the policy never samples up to full-size steps: RL's noise then moves
    # every row of the vocabulary and entropy rises (measured: docs/training.md).
    train_embeddings: bool = True
    device: str = "cpu"
    seed: int = 0


def rollout_rewards(samples: Sequence[Sample]) -> tuple[list[str], list[float]]:
    """Group label and reward of each sample, for GRPO.

    All samples of one rollout (its branches) share the rollout's reward and advantage; the
    group is the task, so a rollout is compared with the other attempts at the same task.
    """
    return [s.task_id or s.rollout_id for s in samples], [float(s.reward or 0.0) for s in samples]


def per_rollout_advantages(samples: Sequence[Sample], mask: torch.Tensor, norm_by_std: bool,
                           use_verl: bool | None) -> torch.Tensor:
    """GRPO advantages with one score per rollout (not per branch), broadcast to its samples.

    A rollout split into several samples (a history rewrite, a side call) must count once in
    its group's statistics; its advantage then applies to each of its samples, as veRL's v1
    trainer does for multi-output trajectories.
    """
    first_of: dict[str, int] = {}
    for i, s in enumerate(samples):
        first_of.setdefault(s.rollout_id or s.sample_id, i)
    leaders = list(first_of.values())
    groups, rewards = rollout_rewards([samples[i] for i in leaders])
    ones = torch.ones(len(leaders), 1)
    scores = algos.grpo_advantages(torch.tensor(rewards), ones, groups,
                                   norm_by_std=norm_by_std, use_verl=use_verl)[:, 0]
    by_rollout = {key: scores[j] for j, key in enumerate(first_of)}
    row_scores = torch.stack([by_rollout[s.rollout_id or s.sample_id] for s in samples])
    return row_scores.unsqueeze(-1) * mask


class PolicyOptimizer:
    """A causal LM under optimization, with SFT and GRPO steps and checkpoints."""

    def __init__(self, model_dir: Path, options: PolicyOptions) -> None:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(options.seed)
        self.options = options
        self.source_dir = Path(model_dir)
        model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model: Any = model.to(options.device)
        self.model.train()
        if not options.train_embeddings:
            self.model.get_input_embeddings().requires_grad_(False)
            self.model.get_output_embeddings().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=options.learning_rate,
            weight_decay=options.weight_decay)
        self.reference: Any = None
        if options.kl_coef > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.step = 0

    # -- updates -------------------------------------------------------------------------

    def _micro_batches(self, rows: Sequence[int]) -> list[torch.Tensor]:
        """`rows` (indices into a batch) in chunks of `micro_batch_size`."""
        size = self.options.micro_batch_size
        return [torch.tensor(list(rows[i:i + size])) for i in range(0, len(rows), size)]

    def _apply_update(self) -> float:
        """Clip and apply the accumulated gradients; their norm (0.0: nothing applied)."""
        if all(p.grad is None for p in self.model.parameters()):
            # No generated token in the batch: leave the weights alone. Stepping Adam on a
            # zero gradient would still move them along its momentum.
            return 0.0
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.options.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _finish_step(self) -> float:
        norm = self._apply_update()
        self.step += 1
        return norm

    def sft_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One optimizer step of token-mean NLL on the generated (mask 1) tokens."""
        batch = make_batch(samples)
        total = max(batch.num_tokens, 1)
        loss_sum = 0.0
        width = batch.mask.shape[1]
        for chunk in self._micro_batches(range(len(samples))):
            mask = batch.mask[chunk]
            if not bool(mask.any()):
                continue
            logp, _ = batch_logprobs(self.model, [samples[int(i)] for i in chunk], width)
            loss = -algos.masked_sum(logp, mask) / total
            loss.backward()
            loss_sum += float(loss.detach())
        grad_norm = self._finish_step()
        return {"sft_loss": loss_sum, "grad_norm": grad_norm, "tokens": float(batch.num_tokens),
                "samples": float(len(samples))}

    def grpo_step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One GRPO training step on a batch of rollouts' samples (several tasks x k).

        Advantages come from the whole batch's groups; then `ppo_epochs` passes over the
        batch, each in `ppo_mini_batches` mini-batches of whole rollouts, one optimizer update
        per mini-batch. The recorded engine logprobs are the old (behaviour) policy of the
        clipped ratio; each update's loss is normalized over its mini-batch's tokens however
        it is micro-batched. Loss metrics are means over the updates; `entropy` is that of
        the policy that generated the batch (measured in the first pass).
        """
        opts = self.options
        batch = make_batch(samples)
        advantages = per_rollout_advantages(samples, batch.mask, opts.norm_adv_by_std,
                                            opts.use_verl)
        no_signal = not bool(advantages.abs().sum() > 0) and self.reference is None
        rows_of: dict[str, list[int]] = {}
        for i, s in enumerate(samples):
            rows_of.setdefault(s.rollout_id or s.sample_id, []).append(i)
        rollouts = list(rows_of.values())
        parts = min(opts.ppo_mini_batches, len(rollouts))
        shuffle = random.Random(opts.seed * 1_000_003 + self.step)
        sums: dict[str, float] = {}
        entropies: list[torch.Tensor] = []
        grad_norms: list[float] = []
        updates = 0
        for epoch in range(1 if no_signal else opts.ppo_epochs):
            order = rollouts[:]
            if epoch > 0 or parts > 1:
                shuffle.shuffle(order)
            for part in range(parts):
                rows = sorted(i for rollout in order[part::parts] for i in rollout)
                metrics, row_entropies = self._policy_update(samples, batch, advantages, rows)
                if epoch == 0:
                    entropies.extend(row_entropies)
                if not no_signal:
                    grad_norms.append(self._apply_update())
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
                updates += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        ent = torch.cat(entropies) if entropies else torch.zeros(0)
        groups, rewards = rollout_rewards(samples)
        means = {key: value / max(updates, 1) for key, value in sums.items()}
        return {**means, "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else 0.0,
                "updates": float(len(grad_norms)),
                "entropy": float(ent.mean()) if ent.numel() else 0.0,
                "adv_abs_mean": float(algos.masked_mean(advantages.abs(), batch.mask)),
                "tokens": float(batch.num_tokens), "samples": float(len(samples)),
                "groups_with_signal": float(_groups_with_signal(groups, rewards)),
                "skipped": float(no_signal)}

    def _policy_update(self, samples: Sequence[Sample], batch: Any, advantages: torch.Tensor,
                       rows: list[int]) -> tuple[dict[str, float], list[torch.Tensor]]:
        """Forward and backward of the clipped policy loss (+ KL) on `rows` of the batch;
        gradients are left in the parameters for `_apply_update`."""
        opts = self.options
        cfg = algos.PolicyLossConfig(opts.clip_ratio_low, opts.clip_ratio_high, opts.clip_ratio_c,
                                     opts.loss_agg_mode)
        width = batch.mask.shape[1]
        index = torch.tensor(rows)
        mask_all = batch.mask[index]
        total_tokens = float(max(int(mask_all.sum()), 1))
        total_seqs = float(max(int((mask_all.sum(-1) > 0).sum()), 1))
        sums: dict[str, float] = {"pg_loss": 0.0, "kl_ref": 0.0, "pg_clipfrac": 0.0,
                                  "ppo_kl": 0.0, "pg_clipfrac_lower": 0.0}
        entropies: list[torch.Tensor] = []
        for chunk in self._micro_batches(rows):
            micro = [samples[int(i)] for i in chunk]
            mask = batch.mask[chunk]
            if not bool(mask.any()):
                continue
            logp, row_entropies = batch_logprobs(self.model, micro, width, opts.temperature,
                                                 with_entropy=True)
            entropies.extend(row_entropies)
            loss, metrics = algos.policy_loss(
                batch.old_logprobs[chunk], logp, advantages[chunk], mask, cfg,
                batch_num_tokens=total_tokens, global_batch_size=total_seqs,
                use_verl=opts.use_verl)
            share = float(mask.sum()) / total_tokens
            for key, value in metrics.items():
                sums[key] += value * share
            if self.reference is not None:
                with torch.no_grad():
                    ref_logp, _ = batch_logprobs(self.reference, micro, width, opts.temperature)
                kl = algos.kl_penalty(logp, ref_logp, opts.kl_kind, use_verl=opts.use_verl)
                kl_loss = algos.agg_loss(kl, mask, opts.loss_agg_mode, total_tokens, total_seqs,
                                         use_verl=opts.use_verl)
                loss = loss + opts.kl_coef * kl_loss
                sums["kl_ref"] += float(kl_loss.detach())
            loss.backward()
            sums["pg_loss"] += float(loss.detach())
        return sums, entropies

    # -- weights and checkpoints -----------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Detached copies of the weights, for the rollout engine."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def save(self, directory: Path, extra: dict[str, Any] | None = None) -> Path:
        """Write a servable model folder plus the optimizer state; atomically replaced."""
        directory = Path(directory)
        staging = directory.with_name(directory.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        self.model.save_pretrained(str(staging))
        for item in self.source_dir.iterdir():
            # Tokenizer files and the renderer marker: everything that is not weights/config.
            if (item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES)
                    and item.name not in ("config.json", "generation_config.json", TRAINER_STATE)
                    and not (staging / item.name).exists()):
                shutil.copy2(item, staging / item.name)
        torch.save({"step": self.step, "optimizer": self.optimizer.state_dict(),
                    "torch_rng": torch.get_rng_state(), "extra": extra or {}},
                   staging / TRAINER_STATE)
        shutil.rmtree(directory, ignore_errors=True)
        staging.rename(directory)
        return directory

    def load_trainer_state(self, directory: Path) -> dict[str, Any]:
        """Restore step, optimizer and RNG from a checkpoint made by `save` (weights are
        loaded by building the optimizer on the checkpoint folder)."""
        state = torch.load(Path(directory) / TRAINER_STATE, weights_only=False)
        self.step = int(state["step"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        extra: dict[str, Any] = state.get("extra", {})
        return extra


    def adopt_second_moments(self, directory: Path) -> None:
        """Start Adam from the second-moment estimates of an earlier phase's checkpoint
        (its SFT), with zero momentum and that phase's bias correction.

        A fresh Adam's first updates are about `lr * sign(grad)` for every parameter, whatever
        the gradient's size: on RL's noisy gradients that is a random walk of full steps
        (measured here: held-out reward falling, entropy rising). With the SFT's variance
        estimates the step is proportional to the gradient, and momentum starts at zero so
        nothing of the SFT direction carries over.
        """
        state = torch.load(Path(directory) / TRAINER_STATE, weights_only=False)["optimizer"]
        theirs = sum(len(g["params"]) for g in state["param_groups"])
        ours = sum(len(g["params"]) for g in self.optimizer.param_groups)
        if theirs != ours:
            raise ValueError(f"{directory}: its optimizer covers {theirs} parameter tensors, this "
                             f"one {ours} (train_embeddings differs?); Adam's moments can only "
                             "be adopted for the same parameters")
        for group in state["param_groups"]:
            group.update({k: v for k, v in self.optimizer.param_groups[0].items()
                          if k != "params"})
        for entry in state["state"].values():
            if "exp_avg" in entry:
                entry["exp_avg"] = torch.zeros_like(entry["exp_avg"])
        self.optimizer.load_state_dict(state)


def _groups_with_signal(groups: list[str], rewards: list[float]) -> float:
    """Fraction of groups whose rewards differ: only those produce a GRPO gradient."""
    by_group: dict[str, set[float]] = {}
    for g, r in zip(groups, rewards, strict=True):
        by_group.setdefault(g, set()).add(r)
    if not by_group:
        return 0.0
    return sum(len(v) > 1 for v in by_group.values()) / len(by_group)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest `step-N` folder under `root` that holds a complete checkpoint."""
    if not root.is_dir():
        return None
    best: tuple[int, Path] | None = None
    for child in root.iterdir():
        if child.name.startswith("step-") and (child / TRAINER_STATE).exists():
            try:
                n = int(child.name.split("-", 1)[1])
            except ValueError:
                continue
            if best is None or n > best[0]:
                best = (n, child)
    return best[1] if best else None

