"""The RL math of the local trainer: GRPO advantages, the clipped policy loss, KL, aggregation.

When veRL is importable (`pip install 'openforge[verl]'`) every function here calls veRL's own
`verl.trainer.ppo.core_algos`, so that a run on one machine computes exactly what a veRL
cluster run computes. Without veRL the same formulas are evaluated here (vectorized torch);
`tests/test_training_verl.py` checks both paths agree to 1e-6 on the same batch.

Shapes follow veRL: per-token tensors are `(batch, response_length)` and `mask` is the
response mask (1 on generated tokens, 0 on observations and padding).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import torch

LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean"]
KLKind = Literal["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"]


@functools.cache
def verl_core_algos() -> ModuleType | None:
    """veRL's `core_algos` module, or None when veRL (or one of its imports) is missing."""
    try:
        from verl.trainer.ppo import core_algos
    except Exception:  # any import failure means: use the formulas below
        return None
    return core_algos


def _use_verl(use_verl: bool | None) -> ModuleType | None:
    if use_verl is False:
        return None
    algos = verl_core_algos()
    if use_verl and algos is None:
        raise RuntimeError("veRL was requested but `verl.trainer.ppo.core_algos` does not import")
    return algos


@dataclass(frozen=True)
class PolicyLossConfig:
    """The clipped-objective knobs, named as in veRL's `actor_rollout_ref.actor` config."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages
    loss_agg_mode: LossAggMode = "token-mean"


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # where() rather than a product: NaN outside the mask must not leak into the sum.
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_sum(values, mask) / (mask.sum() + 1e-8)


def group_ids(groups: Sequence[str]) -> list[int]:
    """Map group labels (task ids) to small ints, in order of first appearance."""
    seen: dict[str, int] = {}
    return [seen.setdefault(g, len(seen)) for g in groups]


def grpo_advantages(rewards: torch.Tensor, mask: torch.Tensor, groups: Sequence[str],
                    epsilon: float = 1e-6, norm_by_std: bool = True,
                    use_verl: bool | None = None) -> torch.Tensor:
    """Group-normalized outcome advantages, broadcast over each row's response tokens.

    `rewards` is one scalar per row, `groups` one label per row (rows of the same task form
    a group). A row's advantage is `(r - mean_group) / (std_group + epsilon)` with the
    unbiased std (veRL's choice), or `r - mean_group` without std normalization (Dr. GRPO);
    a group of one gets mean 0 and std 1, as in veRL.
    """
    rewards = rewards.to(torch.float32)
    mask = mask.to(torch.float32)
    algos = _use_verl(use_verl)
    if algos is not None:
        import numpy as np

        token_rewards = torch.zeros_like(mask)
        last = (mask.cumsum(-1) * mask).argmax(-1)  # the last response token carries the reward
        token_rewards[torch.arange(len(rewards)), last] = rewards
        advantages, _ = algos.compute_grpo_outcome_advantage(
            token_level_rewards=token_rewards, response_mask=mask,
            index=np.array(list(groups), dtype=object), epsilon=epsilon,
            norm_adv_by_std_in_grpo=norm_by_std)
        return advantages
    ids = torch.tensor(group_ids(groups), dtype=torch.long)
    n_groups = int(ids.max()) + 1 if len(ids) else 0
    count = torch.zeros(n_groups).index_add_(0, ids, torch.ones_like(rewards))
    mean = torch.zeros(n_groups).index_add_(0, ids, rewards) / count
    centered = rewards - mean[ids]
    sq = torch.zeros(n_groups).index_add_(0, ids, centered**2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    single = count[ids] == 1
    # A lone row keeps its raw reward (group mean 0, std 1), exactly as veRL does.
    scores = torch.where(single, rewards, centered)
    if norm_by_std:
        scores = scores / (torch.where(single, torch.ones_like(rewards), std[ids]) + epsilon)
    return scores.unsqueeze(-1) * mask


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: LossAggMode = "token-mean",
             batch_num_tokens: float | None = None, global_batch_size: float | None = None,
             use_verl: bool | None = None) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    `batch_num_tokens` / `global_batch_size` let a micro-batch be normalized by the whole
    batch's token / sequence count, so that micro-batch losses add up to the batch loss.
    """
    algos = _use_verl(use_verl)
    if algos is not None:
        return algos.agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=mode,
                              batch_num_tokens=batch_num_tokens,
                              global_batch_size=global_batch_size)
    mask = mask.to(loss_mat.dtype)
    if mode == "token-mean":
        denom = mask.sum() if batch_num_tokens is None else batch_num_tokens
        return masked_sum(loss_mat, mask) / denom
    if mode == "token-sum":
        return masked_sum(loss_mat, mask)
    token_counts = mask.sum(-1)
    seq_present = (token_counts > 0).to(loss_mat.dtype)
    seq_losses = (loss_mat * mask).sum(-1)
    if mode == "seq-mean-token-mean":
        seq_losses = seq_losses / (token_counts + 1e-8)
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown loss_agg_mode {mode!r}")
    denom = seq_present.sum() if global_batch_size is None else global_batch_size
    return masked_sum(seq_losses, seq_present) / denom


class _VerlActorConfig(dict):
    """The attributes veRL's vanilla policy loss reads from its ActorConfig, nothing more."""

    def __init__(self, cfg: PolicyLossConfig, global_batch_info: dict[str, Any]) -> None:
        super().__init__(clip_ratio_c=cfg.clip_ratio_c)
        self.clip_ratio = cfg.clip_ratio_low
        self.clip_ratio_low = cfg.clip_ratio_low
        self.clip_ratio_high = cfg.clip_ratio_high
        self.global_batch_info = global_batch_info


def policy_loss(old_logprob: torch.Tensor, logprob: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, cfg: PolicyLossConfig = PolicyLossConfig(),
                batch_num_tokens: float | None = None, global_batch_size: float | None = None,
                use_verl: bool | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate with dual clip (veRL "vanilla"); returns (loss, metrics).

    `old_logprob` are the logprobs the rollout engine recorded when it sampled each token:
    the behaviour policy. Metrics: `pg_clipfrac` (tokens where the clip was active),
    `ppo_kl` (mean old - new logprob), `pg_clipfrac_lower` (dual-clip active).
    """
    algos = _use_verl(use_verl)
    if algos is not None:
        info = {k: v for k, v in (("batch_num_tokens", batch_num_tokens),
                                  ("global_batch_size", global_batch_size)) if v is not None}
        loss, metrics = algos.compute_policy_loss_vanilla(
            old_log_prob=old_logprob, log_prob=logprob, advantages=advantages,
            response_mask=mask, loss_agg_mode=cfg.loss_agg_mode,
            config=_VerlActorConfig(cfg, info))
        return loss, {k.split("/")[-1]: float(v) for k, v in metrics.items()}
    log_ratio = torch.clamp(logprob - old_logprob, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    pessimistic = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * cfg.clip_ratio_c
    per_token = torch.where(advantages < 0, torch.minimum(dual_bound, pessimistic), pessimistic)
    loss = agg_loss(per_token, mask, cfg.loss_agg_mode, batch_num_tokens, global_batch_size,
                    use_verl=False)
    log_ratio, advantages = log_ratio.detach(), advantages.detach()
    clipped, unclipped, pessimistic = clipped.detach(), unclipped.detach(), pessimistic.detach()
    dual_bound = dual_bound.detach()
    metrics = {
        "pg_clipfrac": float(masked_mean((clipped > unclipped).float(), mask)),
        "ppo_kl": float(masked_mean(-log_ratio, mask)),
        "pg_clipfrac_lower": float(masked_mean(
            (pessimistic > dual_bound).float() * (advantages < 0).float(), mask)),
    }
    return loss, metrics


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: KLKind = "low_var_kl",
               use_verl: bool | None = None) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference (Schulman's k1/k2/k3)."""
    algos = _use_verl(use_verl)
    if algos is not None:
        return algos.kl_penalty(logprob, ref_logprob, kind)
    if kind in ("kl", "k1"):
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kind in ("low_var_kl", "k3"):
        log_ratio = torch.clamp(ref_logprob - logprob, -20.0, 20.0)
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, -10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; use k1, k2, k3 (low_var_kl) or abs")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of the softmax of `logits`, over the last dimension."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)
