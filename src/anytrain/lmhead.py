"""A causal LM's loss without its full logits: the output layer and the cross-entropy taken together, a chunk
of tokens at a time (as TRL's SFTTrainer and Liger's fused linear cross-entropy do). The logits of a batch
are batch x length x vocabulary floats, with a 128k vocabulary the largest tensor of a fine-tuning step, and
unfused training holds them, their float copy and their gradient at once; here one chunk's logits exist at a
time and the gradients of the chunk's hidden states and of the output layer are computed while they do.

`install(model)` gives a transformers causal LM a forward that does this whenever it is given labels (training
and teacher-forced evaluation); without labels (generation) it is the model's own forward. The loss is the
model's own: the sum of the next-token cross-entropy over the targets divided by `num_items_in_batch` (else
their count); evaluation also gets each row's summed loss, targets and correct tokens (`row_stats`).
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F

from .shape import IGNORE

CHUNK_ELEMENTS = 2**24  # logits per chunk (64 MiB of float32), at least MIN_CHUNK tokens
MIN_CHUNK = 256
SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def chunk_tokens(vocabulary: int) -> int:
    return max(MIN_CHUNK, CHUNK_ELEMENTS // max(vocabulary, 1))


def chunk_of(model: nn.Module) -> int:
    """Tokens a chunk for this model's output layer."""
    return chunk_tokens(cast(Any, model).get_output_embeddings().weight.shape[0])  # a transformers model


def chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(hidden, weight, bias).float()  # in autocast's dtype when it is on; the softmax in float32


class LinearCrossEntropy(torch.autograd.Function):
    """sum over targets of cross_entropy(hidden @ weight.T + bias, labels), hidden (N, H), labels (N,) with
    -100 for none. The forward pass also computes the gradients (chunk by chunk); backward scales them."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk: int):  # type: ignore[override]
        grads = ctx.needs_input_grad[:3]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.zeros_like(hidden) if grads[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if grads[1] else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if bias is not None and grads[2] else None
        for start in range(0, hidden.shape[0], chunk):
            h, y = hidden[start : start + chunk], labels[start : start + chunk]
            valid = y != IGNORE
            logits = chunk_logits(h, weight, bias)
            log_z = logits.logsumexp(-1)
            picked = logits.gather(1, y.clamp(min=0).unsqueeze(1)).squeeze(1)
            total += ((log_z - picked) * valid).sum()
            if not any(grads):
                continue
            g = logits.sub_(log_z.unsqueeze(1)).exp_()  # softmax, in place of the logits
            # minus the one-hot target, by a scatter: indexing by the mask would wait for the GPU at every chunk
            g.scatter_add_(1, y.clamp(min=0).unsqueeze(1), -valid.unsqueeze(1).to(g.dtype))
            g.mul_(valid.unsqueeze(1))
            if grad_hidden is not None:
                grad_hidden[start : start + chunk] = (g.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight += g.T @ h.float()
            if grad_bias is not None:
                grad_bias += g.sum(0)
        ctx.save_for_backward(*(t for t in (grad_hidden, grad_weight, grad_bias) if t is not None))
        ctx.present = [t is not None for t in (grad_hidden, grad_weight, grad_bias)]
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_total):  # type: ignore[override]
        saved = iter(ctx.saved_tensors)
        grads = [
            (next(saved) * grad_total).to(dtype) if present else None for present, dtype in zip(ctx.present, ctx.dtypes)
        ]
        return *grads, None, None


@torch.no_grad()
def row_stats(hidden: torch.Tensor, weight, bias, labels: torch.Tensor, chunk: int) -> dict[str, torch.Tensor]:
    """Per row of (B, T, H) hidden states and (B, T) next-token labels: summed loss, targets, correct tokens."""
    rows, length = labels.shape
    loss = torch.zeros(rows * length, dtype=torch.float32, device=hidden.device)
    hits = torch.zeros(rows * length, dtype=torch.bool, device=hidden.device)
    flat, flat_labels = hidden.reshape(rows * length, -1), labels.reshape(-1)
    for start in range(0, rows * length, chunk):
        y = flat_labels[start : start + chunk]
        logits = chunk_logits(flat[start : start + chunk], weight, bias)
        loss[start : start + chunk] = F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="none")
        hits[start : start + chunk] = (logits.argmax(-1) == y) & (y != IGNORE)
    real = labels != IGNORE
    return {"token_loss": loss.view(rows, length).sum(1), "tokens": real.sum(1), "hits": hits.view(rows, length).sum(1)}


@dataclass
class FusedOutput:
    """What the fused forward returns: the loss, no logits; in evaluation also each row's statistics."""

    loss: torch.Tensor
    row_stats: dict[str, torch.Tensor] | None = None
    logits: None = None


def why_not(model: nn.Module) -> str | None:
    """Why this causal LM keeps its own loss (None: it can be fused)."""
    head = cast(Any, model).get_output_embeddings()  # a transformers model
    backbone = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if not isinstance(head, nn.Linear) or not isinstance(backbone, nn.Module) or backbone is model:
        return "its output layer is not one linear layer after a backbone"
    scaled = [name for name in SCALED_LOGITS if getattr(model.config, name, None) not in (None, 1, 1.0)]
    if scaled:
        return f"its logits are rescaled ({scaled[0]})"
    if os.environ.get("ACCELERATE_USE_FSDP") == "true" or os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
        return "FSDP and DeepSpeed shard the output layer"
    return None


def install(model: nn.Module) -> str | None:
    """Give the model the fused forward (with labels); returns why it was not (None when it was)."""
    reason = why_not(model)
    if reason is None:
        model.forward = types.MethodType(fused_forward(type(model).forward), model)
    return reason


def routes(model: nn.Module, kwargs: dict) -> bool:
    """Whether a mixture of experts' own loss adds its router's load-balancing loss (output_router_logits on)."""
    if getattr(model, "router_aux_loss_coef", None) is None:
        return False
    return bool(kwargs.get("output_router_logits", getattr(model.config, "output_router_logits", False)))


def router_loss(model: nn.Module, outputs, attention_mask) -> torch.Tensor:
    """The load-balancing loss times its coefficient, as the model's own forward adds it: its module's
    load_balancing_loss_func over the router logits (padding left out where a 2D mask says which it is)."""
    func = sys.modules[type(model).__module__].load_balancing_loss_func
    mask = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
    aux = func(outputs.router_logits, model.num_experts, model.num_experts_per_tok, mask)
    return model.router_aux_loss_coef * aux


def describe_router(model: nn.Module) -> str | None:
    """What the start-up line says of a mixture of experts' load-balancing loss (None: not one)."""
    if getattr(model, "router_aux_loss_coef", None) is None:
        return None
    if routes(model, {}):
        return (
            f"its router's load-balancing loss is added (router_aux_loss_coef {model.router_aux_loss_coef}), as its own"
        )
    return "its config has output_router_logits off, so no load-balancing loss is added (as its own loss)"


def fused_forward(own_forward):
    def forward(self, *args, labels=None, num_items_in_batch=None, **kwargs):
        if labels is None:
            return own_forward(self, *args, **kwargs)
        backbone = getattr(self, self.base_model_prefix)
        router = routes(self, kwargs)
        outputs = backbone(
            *args, **{**kwargs, "use_cache": False, **({"output_router_logits": True} if router else {})}
        )
        hidden = outputs.last_hidden_state[:, :-1]
        targets = labels[:, 1:]  # position t predicts token t + 1
        head = self.get_output_embeddings()
        chunk = chunk_tokens(head.weight.shape[0])
        if not torch.is_grad_enabled():
            stats = row_stats(hidden, head.weight, head.bias, targets, chunk)
            count = stats["tokens"].sum().clamp(min=1)
            return FusedOutput(stats["token_loss"].sum() / count, stats)
        flat = hidden.reshape(-1, hidden.shape[-1])
        total = LinearCrossEntropy.apply(flat, head.weight, head.bias, targets.reshape(-1), chunk)
        count = num_items_in_batch if num_items_in_batch is not None else (targets != IGNORE).sum().clamp(min=1)
        loss = total / count
        if router:
            loss = loss + router_loss(self, outputs, kwargs.get("attention_mask"))
        return FusedOutput(loss)

    return forward
