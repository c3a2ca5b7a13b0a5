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
    logp, entropies = batch_logprobs(model, [sample], len(sample.response_ids), temperature,
                                     with_entropy)
    return logp[0], (entropies[0] if with_entropy else None)


def batch_logprobs(model: Any, samples: Sequence[Sample], width: int, temperature: float = 1.0,
                   with_entropy: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`response_logprobs` of several samples as a (len(samples), width) tensor.

    One forward pass over the right-padded sequences (the attention mask hides the padding,
    and causal attention keeps it from reaching real positions), then one LM-head product
    over the masked response positions of all samples together.
    """
    base, head = _decoder_and_head(model)
    device = next(model.parameters()).device
    out = torch.zeros(len(samples), width, device=device)
    sequences = [list(s.prompt_ids) + list(s.response_ids) for s in samples]
    rows: list[int] = []
    columns: list[int] = []  # index into the sequence of the hidden state that predicts
    slots: list[int] = []  # index into the response
    targets: list[int] = []
    counts: list[int] = []
    for i, sample in enumerate(samples):
        positions = [t for t, m in enumerate(sample.response_mask) if m]
        counts.append(len(positions))
        # Token t of the response is predicted from the hidden state just before it.
        rows += [i] * len(positions)
        columns += [len(sample.prompt_ids) - 1 + t for t in positions]
        slots += positions
        targets += [sample.response_ids[t] for t in positions]
    if not targets:
        return out, [torch.zeros(0) for _ in samples] if with_entropy else []
    length = max(len(seq) for seq in sequences)
    ids = torch.zeros(len(samples), length, dtype=torch.long)
    attention = torch.zeros(len(samples), length, dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
    hidden = base(input_ids=ids.to(device), attention_mask=attention.to(device)).last_hidden_state
    row_index, column_index = torch.tensor(rows, device=device), torch.tensor(columns, device=device)
    logits = head(hidden[row_index, column_index]).float() / temperature
    target_index = torch.tensor(targets, device=device).unsqueeze(-1)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, target_index).squeeze(-1)
    out = out.index_put((row_index, torch.tensor(slots, device=device)), logp)
    entropies: list[torch.Tensor] = []
    if with_entropy:
        entropies = list(torch.split(entropy_from_logits(logits.detach()).cpu(), counts))
    return out, entropies
