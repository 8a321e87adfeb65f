"""Per-token log-probabilities of a transformers causal LM at a temperature, the one way the causal-LM tasks take
them (grpo's policy, old and reference log-probabilities; dpo's sequence sums): through the model's forward as
lmhead.install gives it (given `labels` and `temperature` it returns lmhead.TokenLogps: the chunked fused output
layer, no full logits), so that a call through DDP's or FSDP's wrapper synchronises the gradients.

log p_T(y_t | y_<t) = z[y_t] / T - logsumexp(z / T), z the logits: TRL's GRPOTrainer divides the logits by the
sampling temperature before its log-softmax (`_get_per_token_logps_and_entropies`), so that the policy trained is
the one that sampled."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...shape import IGNORE
from .generation import Completions


def labels_from(ids: torch.Tensor, learned: torch.Tensor) -> torch.Tensor:
    """The ids where `learned` (bool, same shape), IGNORE elsewhere: the positions whose log-probability is taken."""
    return ids.masked_fill(~learned, IGNORE)


def completion_logps(call: Callable, rows: Completions, temperature: float) -> torch.Tensor:
    """(rows, max_new_tokens) float32: each completion token's log-probability under softmax(logits / T), 0 at the
    padding after a completion's stop. `call(inputs)` calls the model: the loop's ctx.forward (its wrappers), or the
    bare model for no-gradient passes (old and reference log-probabilities)."""
    learned = torch.zeros_like(rows.mask, dtype=torch.bool)
    learned[:, rows.width :] = rows.completion
    inputs = {"input_ids": rows.ids, "attention_mask": rows.mask, "position_ids": rows.positions}
    out = call({**inputs, "labels": labels_from(rows.ids, learned), "temperature": temperature})
    return out.logps[:, rows.width :]


def sequence_logps(call: Callable, inputs: dict, temperature: float = 1.0) -> torch.Tensor:
    """(sequences, 2) float32 for a batch whose inputs hold `labels` (the learned tokens, IGNORE elsewhere) and
    `sequence_ids` (each token's sequence, several to a row when packed): each sequence's summed log-probability of
    its learned tokens and their count (dpo's π and its lengths)."""
    given = {k: v for k, v in inputs.items() if k != "sequence_ids"}
    logps = call({**given, "temperature": temperature}).logps
    picked = inputs["labels"] != IGNORE
    where = inputs["sequence_ids"][picked]
    count = int(inputs["sequence_ids"].max()) + 1
    sums = torch.zeros(count, dtype=torch.float32, device=logps.device).index_add(0, where, logps[picked])
    counts = torch.zeros(count, dtype=torch.float32, device=logps.device).index_add_(
        0, where, torch.ones_like(where, dtype=torch.float32)
    )
    return torch.stack([sums, counts], 1)
