"""Each sequence's log-probability of its completion, from a transformers causal LM, without full-vocabulary
logits: the output layer is applied to the completion's positions only (a prompt's tokens need no logits), a chunk
of them at a time (lmhead.ChunkedNLL, the one function the fused LM loss uses too, summed per sequence), and the
backward pass recomputes each chunk's logits rather than keeping them. A model whose logits lmhead.py cannot take
from its output layer (rescaled logits, a sharded layer) gets them from its own forward.

`install(model, reference)` gives the model a forward that, given `labels` (the completion's token ids, -100
elsewhere) and `sequence_ids` (each token's sequence in the batch), returns one row per sequence: (log-probability
of its completion, completion tokens, the reference's log-probability or NaN). `reference` computes the last
column for the batch (a frozen copy, or the model with its adapter off); None leaves it NaN (cached or none).
Without labels it is the model's own forward (generation).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from ... import lmhead
from ...shape import IGNORE


def sequence_table(token_logps: torch.Tensor, sequences: torch.Tensor, count: int) -> torch.Tensor:
    """(count, 2): each sequence's summed log-probability and its number of completion tokens, from the
    completion tokens' log-probabilities and their sequence ids."""
    table = torch.zeros(count, 2, dtype=torch.float32, device=token_logps.device)
    table[:, 0] = table[:, 0].index_add(0, sequences, token_logps)
    table[:, 1] = table[:, 1].index_add(0, sequences, torch.ones_like(token_logps))
    return table


def completion_logps(model: nn.Module, own_forward: Callable, fused: bool, kwargs: dict, labels, sequences):
    """(sequences, 2) for one batch: the completion tokens' log-probabilities, through the fused output layer
    where lmhead.py can take it (`fused`, decided once per model), else from the model's own logits."""
    targets, where = labels[:, 1:], sequences[:, 1:]  # position t predicts token t + 1
    picked = targets != IGNORE
    count = int(sequences.max()) + 1
    m = cast(Any, model)  # a transformers causal LM
    inputs = {**kwargs, "use_cache": False}
    if fused:
        hidden = getattr(m, m.base_model_prefix)(**inputs).last_hidden_state[:, :-1][picked]
        head = m.get_output_embeddings()
        chunk = lmhead.chunk_tokens(head.weight.shape[0])
        nll = lmhead.ChunkedNLL.apply(hidden, head.weight, head.bias, targets[picked], where[picked], count, chunk)
        counts = torch.zeros(count, dtype=torch.float32, device=nll.device)
        return torch.stack(
            [-nll, counts.index_add(0, where[picked], torch.ones_like(where[picked], dtype=counts.dtype))], 1
        )
    logits = own_forward(model, **inputs).logits[:, :-1][picked].float()
    logps = logits.log_softmax(-1).gather(1, targets[picked][:, None]).squeeze(1)
    return sequence_table(logps, where[picked], count)


def install(model: nn.Module, reference: Callable | None) -> None:
    """Give the model the pairs' forward (with labels); its own forward otherwise."""
    own, fused = type(model).forward, lmhead.why_not(model) is None

    def forward(self, *args, labels=None, sequence_ids=None, **kwargs):
        if labels is None:
            return own(self, *args, **kwargs)
        if args:
            kwargs["input_ids"] = args[0]
        table = completion_logps(self, own, fused, kwargs, labels, sequence_ids)
        ref = torch.full_like(table[:, :1], float("nan"))
        if reference is not None:
            with torch.no_grad():
                ref = reference(kwargs, labels, sequence_ids)[:, :1]
        return torch.cat([table, ref], 1)

    model.forward = types.MethodType(forward, model)


def adapter_off(model: nn.Module) -> Callable:
    """The reference of a LoRA run: the same model with its adapters off (peft's tuner layers), for one batch."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    own, fused = type(model).forward, lmhead.why_not(model) is None

    def reference(kwargs: dict, labels, sequences) -> torch.Tensor:
        layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
        for layer in layers:
            layer.enable_adapters(False)
        try:
            return completion_logps(model, own, fused, kwargs, labels, sequences)
        finally:
            for layer in layers:
                layer.enable_adapters(True)

    return reference


def frozen_copy(model: nn.Module) -> Callable:
    """The reference of `--reference live`: a frozen copy of the model as it starts, moved to the batch's device."""
    import copy

    copied = copy.deepcopy(model).eval().requires_grad_(False)
    own, fused = type(copied).forward, lmhead.why_not(copied) is None

    def reference(kwargs: dict, labels, sequences) -> torch.Tensor:
        device = labels.device
        if next(copied.parameters()).device != device:
            copied.to(device)
        return completion_logps(copied, own, fused, kwargs, labels, sequences)

    return reference
