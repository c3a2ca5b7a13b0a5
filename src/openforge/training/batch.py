"""Samples -> padded tensors, and the policy's per-token logprobs on them.

A `Sample` is `prompt_ids + response_ids` with a response mask; the trainer only needs the
model's distribution at response positions, and only at the masked (generated) ones for the
loss. With a 150k-token vocabulary the logits of a whole sequence are the largest tensor
of a step by far, so the LM head is applied to the hidden states of the response positions
alone: a few dozen rows per sample instead of the full prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from openforge.training.algos import entropy_from_logits
from openforge.types import Sample


@dataclass
class ResponseBatch:
    """Right-padded per-token tensors of a list of samples, shape (batch, max_response_len)."""

    samples: list[Sample]
    mask: torch.Tensor  # float32, 1 on generated tokens
    old_logprobs: torch.Tensor  # float32, the engine's logprobs (0.0 elsewhere)
    rewards: torch.Tensor  # float32, one per sample (None -> 0.0)

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())


def pad_rows(rows: Sequence[Sequence[float]], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(list(row), dtype=dtype)
    return out


def make_batch(samples: Sequence[Sample]) -> ResponseBatch:
    width = max((len(s.response_ids) for s in samples), default=0)
    return ResponseBatch(
        samples=list(samples),
        mask=pad_rows([s.response_mask for s in samples], width, torch.float32),
        old_logprobs=pad_rows([s.response_logprobs for s in samples], width, torch.float32),
        rewards=torch.tensor([float(s.reward or 0.0) for s in samples], dtype=torch.float32),
    )


def _decoder_and_head(model: Any) -> tuple[Any, Any]:
    base = getattr(model, model.base_model_prefix, None)
    head = model.get_output_embeddings()
    if base is None or head is None:
        raise TypeError(f"{type(model).__name__} is not a causal LM with an output head")
    return base, head


def response_logprobs(model: Any, sample: Sample, temperature: float = 1.0,
                      with_entropy: bool = False,
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of `sample.response_ids` under `model` (length = response), and entropies.

    Positions with mask 0 get logprob 0.0 and no gradient; the logits are divided by
    `temperature` first, as the rollout engine did when it sampled (so that an unchanged
    policy reproduces the recorded logprobs). Entropies (detached) are returned at masked
    positions only, when asked.
    """
    base, head = _decoder_and_head(model)
    device = next(model.parameters()).device
    ids = torch.tensor([list(sample.prompt_ids) + list(sample.response_ids)], device=device)
    n_prompt, n_resp = len(sample.prompt_ids), len(sample.response_ids)
    mask = torch.tensor(list(sample.response_mask), dtype=torch.bool, device=device)
    out = torch.zeros(n_resp, device=device)
    if n_resp == 0 or not bool(mask.any()):
        return out, (torch.zeros(0) if with_entropy else None)
    hidden = base(input_ids=ids).last_hidden_state[0]
    # Token t of the response is predicted from the hidden state just before it.
    positions = torch.nonzero(mask).squeeze(-1)
    logits = head(hidden[n_prompt - 1 + positions]).float() / temperature
    targets = torch.tensor(list(sample.response_ids), device=device)[positions]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    out = out.index_put((positions,), logp)
    entropy = entropy_from_logits(logits.detach()) if with_entropy else None
    return out, entropy


def batch_logprobs(model: Any, samples: Sequence[Sample], width: int, temperature: float = 1.0,
                   with_entropy: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`response_logprobs` of several samples stacked into a (len(samples), width) tensor."""
    rows: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    for sample in samples:
        logp, ent = response_logprobs(model, sample, temperature, with_entropy)
        rows.append(torch.nn.functional.pad(logp, (0, width - logp.shape[0])))
        if ent is not None:
            entropies.append(ent)
    return torch.stack(rows) if rows else torch.zeros(0, width), entropies
