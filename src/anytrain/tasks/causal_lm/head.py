"""The causal LM as the loop trains it: `CausalLMHead`, the module accelerate prepares around a transformers causal
LM (or its peft model), and the output layer's loss without the full logits.

The logits of a batch are batch x length x vocabulary floats, with a 128k vocabulary the largest tensor of a
fine-tuning step; unfused training holds them, their float copy and their gradient at once. Here the output layer
and the cross-entropy are taken together a chunk of tokens at a time (as TRL's SFTTrainer and Liger's fused linear
cross-entropy do): one chunk's logits exist at a time, and the gradients of its hidden states and of the output layer
are computed while they do (`ChunkedNLL`).

`CausalLMHead(model, fused)` holds the transformers model's own submodules under their own names, so its weights,
checkpoints and saved files are the model's, name for name. Its forward answers four calls, each through the one
module that DDP and FSDP wrap, so their gradients synchronise:
  - `head(**inputs, labels=..., num_items_in_batch=...)`: the model's own loss, the sum of the next-token
    cross-entropy over the targets divided by num_items_in_batch (else their count), fused; in evaluation also each
    row's summed loss, targets and correct tokens (`FusedOutput.row_stats`);
  - `head(LogpsRequest(inputs, labels, temperature))`: `TokenLogps`, each labelled token's log-probability under
    softmax(logits / T), 0 elsewhere (tasks/causal_lm/logprobs.py takes every log-probability this way);
  - `head(request)` for a `HeadRequest`: `request.answer(head)` (distill's divergence, tasks/causal_lm/divergence.py);
  - `head(**inputs)` without labels: the model's own forward (a prompt's key-value cache).
Whether the loss is fused is decided once, when the head is made (`why_not`: the model's output layer and logit
scaling, and whether the run shards the output layer, a run fact): a model that cannot be fused computes its
loss and log-probabilities from its own full logits. Generation and saving use the transformers model itself
(`CausalLMHead.wrapped`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F

from ...shape import IGNORE

CHUNK_ELEMENTS = 2**24  # logits per chunk (64 MiB of float32), at least MIN_CHUNK tokens (148 MiB at a 152k vocabulary)
MIN_CHUNK = 256
SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def chunk_tokens(vocabulary: int) -> int:
    return max(MIN_CHUNK, CHUNK_ELEMENTS // max(vocabulary, 1))


def chunk_of(model: nn.Module) -> int:
    """Tokens a chunk for this model's output layer."""
    return chunk_tokens(cast(Any, model).get_output_embeddings().weight.shape[0])  # a transformers model


def chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(hidden, weight, bias).float()  # in autocast's dtype when it is on; the softmax in float32


class ChunkedNLL(torch.autograd.Function):
    """The output layer's negative log-likelihood of the targets, a chunk of tokens at a time, summed by group: for
    hidden (N, H) and labels (N,) (-100: none), out[g] = the sum over group g's tokens of
    logsumexp(logits) - logits[label], logits = hidden @ weight.T + bias. One chunk's logits exist at a time.

    The one function behind the fused LM loss (groups None: out is a scalar, the sum over every target) and dpo's
    sequences' log-probabilities (groups: each token's sequence, `count` of them). One group: the forward pass also
    computes the gradients while each chunk's logits exist, and backward scales them (nothing recomputed). Several
    groups: backward recomputes each chunk's logits (in the dtype the forward used), as each group's upstream
    gradient is its own."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, groups, count: int, chunk: int):  # type: ignore[override]
        ctx.chunk, ctx.grouped = chunk, groups is not None
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        if groups is None:
            total, grads = one_group(hidden, weight, bias, labels, chunk, ctx.needs_input_grad[:3])
            ctx.present = [t is not None for t in grads]
            ctx.save_for_backward(*(t for t in grads if t is not None))
            return total
        ctx.dtype = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled() else weight.dtype
        out = torch.zeros(count, dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            y, valid = labels[start : start + chunk], labels[start : start + chunk] != IGNORE
            logits = cast_logits(hidden[start : start + chunk], weight, bias, ctx.dtype)
            picked = logits.gather(1, y.clamp(min=0).unsqueeze(1)).squeeze(1)
            out.index_add_(0, groups[start : start + chunk].clamp(min=0), (logits.logsumexp(-1) - picked) * valid)
        ctx.save_for_backward(hidden, weight, bias, labels, groups)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        if not ctx.grouped:
            saved = iter(ctx.saved_tensors)
            scaled = [(next(saved) * grad_out).to(d) if p else None for p, d in zip(ctx.present, ctx.dtypes)]
            return *scaled, None, None, None, None
        return *recomputed(ctx, grad_out), None, None, None, None


def cast_logits(hidden: torch.Tensor, weight: torch.Tensor, bias, dtype: torch.dtype) -> torch.Tensor:
    """A chunk's logits in float32, the matrix product in `dtype` (autocast's, kept for the backward's recompute)."""
    return F.linear(hidden.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)).float()


def one_group(hidden, weight, bias, labels, chunk: int, needed) -> tuple[torch.Tensor, list]:
    """The sum over every target, and the gradients of hidden, weight and bias (those `needed`), chunk by chunk."""
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grad_hidden = torch.zeros_like(hidden) if needed[0] else None
    grad_weight = torch.zeros_like(weight, dtype=torch.float32) if needed[1] else None
    grad_bias = torch.zeros_like(bias, dtype=torch.float32) if bias is not None and needed[2] else None
    for start in range(0, hidden.shape[0], chunk):
        h, y = hidden[start : start + chunk], labels[start : start + chunk]
        valid = y != IGNORE
        logits = chunk_logits(h, weight, bias)
        log_z = logits.logsumexp(-1)
        picked = logits.gather(1, y.clamp(min=0).unsqueeze(1)).squeeze(1)
        total += ((log_z - picked) * valid).sum()
        if not any(needed):
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
    return total, [grad_hidden, grad_weight, grad_bias]


def recomputed(ctx, grad_out: torch.Tensor) -> list:
    """The grouped backward: each chunk's logits again, (softmax - one-hot) x its tokens' groups' gradients."""
    hidden, weight, bias, labels, groups = ctx.saved_tensors
    needed = ctx.needs_input_grad
    grad_hidden = torch.empty_like(hidden) if needed[0] else None
    grad_weight = torch.zeros_like(weight, dtype=torch.float32) if needed[1] else None
    grad_bias = torch.zeros_like(bias, dtype=torch.float32) if bias is not None and needed[2] else None
    for start in range(0, hidden.shape[0], ctx.chunk):
        h, y = hidden[start : start + ctx.chunk], labels[start : start + ctx.chunk]
        valid = (y != IGNORE).unsqueeze(1)
        g = cast_logits(h, weight, bias, ctx.dtype).softmax(-1)
        g.scatter_add_(1, y.clamp(min=0).unsqueeze(1), -torch.ones_like(g[:, :1]))
        g.mul_(valid * grad_out[groups[start : start + ctx.chunk].clamp(min=0)].unsqueeze(1))
        if grad_hidden is not None:
            grad_hidden[start : start + ctx.chunk] = (g.to(ctx.dtype) @ weight.to(ctx.dtype)).to(hidden.dtype)
        if grad_weight is not None:
            grad_weight += g.T @ h.float()
        if grad_bias is not None:
            grad_bias += g.sum(0)
    grads = (grad_hidden, grad_weight, grad_bias)
    return [None if g is None else g.to(d) for g, d in zip(grads, ctx.dtypes)]


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


def why_not(model: nn.Module, shards: bool = False) -> str | None:
    """Why this causal LM keeps its own loss (None: it can be fused); `shards`: the run shards the output layer
    (FSDP, DeepSpeed: RunFacts.shards)."""
    head = cast(Any, model).get_output_embeddings()  # a transformers model
    backbone = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if not isinstance(head, nn.Linear) or not isinstance(backbone, nn.Module) or backbone is model:
        return "its output layer is not one linear layer after a backbone"
    scaled = [name for name in SCALED_LOGITS if getattr(model.config, name, None) not in (None, 1, 1.0)]
    if scaled:
        return f"its logits are rescaled ({scaled[0]})"
    if shards:
        return "FSDP and DeepSpeed shard the output layer"
    return None


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


@dataclass
class TokenLogps:
    """What the forward returns given a temperature: (B, T) float32, aligned with the labels: position t holds the
    log-probability of labels[:, t] given the tokens before it where it is labelled (not -100), 0 elsewhere (no value
    there to overflow; position 0 predicts nothing)."""

    logps: torch.Tensor
    loss: None = None
    logits: None = None


def token_logps(hidden, head: nn.Linear, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """TokenLogps' (B, T) from (B, T, H) hidden states and labels: the labelled tokens' log-probabilities under the
    tempered softmax, through ChunkedNLL with one group per token (each token its own upstream gradient)."""
    targets = labels[:, 1:]
    picked = targets != IGNORE
    h = hidden[:, :-1][picked] / temperature
    bias = None if head.bias is None else head.bias / temperature
    count = h.shape[0]
    groups = torch.arange(count, device=h.device)
    nll = ChunkedNLL.apply(h, head.weight, bias, targets[picked], groups, count, chunk_tokens(head.weight.shape[0]))
    logps = torch.zeros(picked.shape, dtype=torch.float32, device=h.device).masked_scatter(picked, -nll)
    return F.pad(logps, (1, 0))


def own_token_logps(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """The same from a model's own (B, T, V) logits (rescaled logits, a sharded output layer), a few rows at a time in
    float32."""
    targets, picked = labels[:, 1:], labels[:, 1:] != IGNORE
    rows = []
    for start in range(0, len(labels), 8):
        chunk = logits[start : start + 8, :-1].float() / temperature
        y = targets[start : start + 8].clamp(min=0)
        logps = chunk.gather(-1, y[..., None]).squeeze(-1) - chunk.logsumexp(-1)
        rows.append(logps.masked_fill(~picked[start : start + 8], 0.0))
    return F.pad(torch.cat(rows), (1, 0))


@dataclass(frozen=True)
class LogpsRequest:
    """A call for per-token log-probabilities: the model's inputs (ids, mask, positions, a key-value cache), the
    labels (the ids whose log-probability is taken, IGNORE elsewhere) and the sampling temperature."""

    inputs: dict[str, Any]
    labels: torch.Tensor
    temperature: float = 1.0


class HeadRequest:
    """A call the head answers by handing itself to the request, inside its forward (so that DDP and FSDP see the
    pass): a method that reads the backbone and the output layer its own way (distill's divergence,
    causal_lm/divergence.py)."""

    def answer(self, head: CausalLMHead) -> Any:
        raise NotImplementedError


class CausalLMHead(nn.Module):
    """A transformers causal LM (or its peft model) as the loop trains it (module docstring). `wrapped` is the model
    itself, for generate and save_pretrained; attributes the head does not have are the model's (its config, its
    generation config, peft's disable_adapter)."""

    def __init__(self, model: nn.Module, fused: bool):
        super().__init__()
        for name, child in model.named_children():  # the model's own names: the same weights' names
            self.add_module(name, child)
        for name, param in model.named_parameters(recurse=False):
            self.register_parameter(name, param)
        for name, buffer in model.named_buffers(recurse=False):
            self.register_buffer(name, buffer)
        self.__dict__["_wrapped"] = model  # not a submodule: its submodules are the head's
        self.__dict__["_causal_lm"] = transformers_model(model)
        self.fused = fused

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            model = self.__dict__.get("_wrapped")
            if model is None:
                raise
            return getattr(model, name)

    @property
    def wrapped(self) -> nn.Module:
        """The transformers model, or its peft model: what generates and is saved."""
        return self.__dict__["_wrapped"]

    @property
    def causal_lm(self) -> Any:
        """The transformers causal LM itself (inside a peft model, its base model): its backbone and output layer."""
        return self.__dict__["_causal_lm"]

    def train(self, mode: bool = True):
        super().train(mode)
        self.wrapped.train(mode)  # the model's own flag too (its submodules are the head's)
        return self

    def forward(self, request: LogpsRequest | torch.Tensor | None = None, *, labels=None, num_items_in_batch=None,
                **inputs):  # fmt: skip
        """A LogpsRequest's TokenLogps, a HeadRequest's answer; else the model's inputs (the ids may come first, as a
        model's do)."""
        if isinstance(request, LogpsRequest):
            return TokenLogps(self.token_logps(request))
        if isinstance(request, HeadRequest):
            return request.answer(self)
        if request is not None:
            inputs["input_ids"] = request
        if labels is None:
            return self.wrapped(**inputs)
        if not self.fused:
            return self.wrapped(**inputs, labels=labels, num_items_in_batch=num_items_in_batch)
        return self.fused_loss(inputs, labels, num_items_in_batch)

    def token_logps(self, request: LogpsRequest) -> torch.Tensor:
        """TokenLogps' (B, T): through the chunked output layer, or the model's own logits where it is not fused."""
        inputs = {**request.inputs, "use_cache": False}
        if not self.fused:
            return own_token_logps(self.wrapped(**inputs).logits, request.labels, request.temperature)
        lm = self.causal_lm
        hidden = getattr(lm, lm.base_model_prefix)(**inputs).last_hidden_state
        return token_logps(hidden, lm.get_output_embeddings(), request.labels, request.temperature)

    def fused_loss(self, inputs: dict, labels: torch.Tensor, num_items_in_batch) -> FusedOutput:
        """The fused loss of a labelled batch (module docstring); in evaluation also each row's statistics."""
        lm = self.causal_lm
        router = routes(lm, inputs)
        outputs = getattr(lm, lm.base_model_prefix)(
            **{**inputs, "use_cache": False, **({"output_router_logits": True} if router else {})}
        )
        hidden = outputs.last_hidden_state[:, :-1]
        targets = labels[:, 1:]  # position t predicts token t + 1
        head = lm.get_output_embeddings()
        chunk = chunk_tokens(head.weight.shape[0])
        if not torch.is_grad_enabled():
            stats = row_stats(hidden, head.weight, head.bias, targets, chunk)
            count = stats["tokens"].sum().clamp(min=1)
            return FusedOutput(stats["token_loss"].sum() / count, stats)
        flat = hidden.reshape(-1, hidden.shape[-1])
        total = ChunkedNLL.apply(flat, head.weight, head.bias, targets.reshape(-1), None, 1, chunk)
        count = num_items_in_batch if num_items_in_batch is not None else (targets != IGNORE).sum().clamp(min=1)
        loss = total / count
        if router:
            loss = loss + router_loss(lm, outputs, inputs.get("attention_mask"))
        return FusedOutput(loss)


def transformers_model(model: nn.Module) -> nn.Module:
    """The transformers causal LM itself: inside a peft model, its base model's."""
    from transformers import PreTrainedModel

    return next(m for m in model.modules() if isinstance(m, PreTrainedModel) and hasattr(m, "base_model_prefix"))


def head_of(model: nn.Module, shards: bool = False) -> tuple[CausalLMHead, str | None]:
    """The model as the loop trains it, and why its loss is not fused (None: it is)."""
    reason = why_not(transformers_model(model), shards)
    return CausalLMHead(model, fused=reason is None), reason


def plain(model: nn.Module) -> nn.Module:
    """The transformers model (or peft model) itself, for generate and saving; any other model as it is."""
    return model.wrapped if isinstance(model, CausalLMHead) else model
