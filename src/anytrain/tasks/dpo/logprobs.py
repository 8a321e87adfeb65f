"""Each sequence's log-probability of its completion, from a transformers causal LM, without full-vocabulary
logits: the output layer is applied to the completion's positions only (a prompt's tokens need no logits), a chunk
of them at a time (lmhead.py's chunking), and the backward pass recomputes each chunk's logits rather than keeping
them. A model whose logits lmhead.py cannot take from its output layer (rescaled logits, a sharded layer) gets them
from its own forward.

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
from torch.nn import functional as F

from ... import lmhead
from ...shape import IGNORE


class LinearLogProbs(torch.autograd.Function):
    """log_softmax(hidden @ weight.T + bias)[labels], hidden (N, H), labels (N,), a chunk of rows at a time; the
    backward pass recomputes each chunk's logits (in the dtype the forward pass used)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk: int):  # type: ignore[override]
        dtype = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled() else weight.dtype
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            logits = logits_of(hidden[start : start + chunk], weight, bias, dtype)
            picked = logits.gather(1, labels[start : start + chunk, None]).squeeze(1)
            out[start : start + chunk] = picked - logits.logsumexp(-1)
        ctx.save_for_backward(hidden, weight, bias, labels)
        ctx.chunk, ctx.dtype = chunk, dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        hidden, weight, bias, labels = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad_hidden = torch.empty_like(hidden) if needs[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if needs[1] else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if bias is not None and needs[2] else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            h, y = hidden[start : start + ctx.chunk], labels[start : start + ctx.chunk]
            logits = logits_of(h, weight, bias, ctx.dtype)
            g = logits.softmax(-1).neg_()  # d log p_y / d logits = onehot(y) - softmax
            g[torch.arange(len(y), device=y.device), y] += 1.0
            g.mul_(grad_out[start : start + ctx.chunk, None])
            if grad_hidden is not None:
                grad_hidden[start : start + ctx.chunk] = (g.to(ctx.dtype) @ weight.to(ctx.dtype)).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight += g.T @ h.float()
            if grad_bias is not None:
                grad_bias += g.sum(0)
        grads = (grad_hidden, grad_weight, grad_bias)
        dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return *(None if g is None else g.to(d) for g, d in zip(grads, dtypes)), None, None


def logits_of(hidden: torch.Tensor, weight: torch.Tensor, bias, dtype: torch.dtype) -> torch.Tensor:
    """A chunk's logits in float32 (the matrix product in `dtype`, autocast's when it is on)."""
    bias = None if bias is None else bias.to(dtype)
    return F.linear(hidden.to(dtype), weight.to(dtype), bias).float()


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
        logps = LinearLogProbs.apply(hidden, head.weight, head.bias, targets[picked], chunk)
    else:
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
