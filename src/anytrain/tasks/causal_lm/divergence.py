"""The generalized Jensen-Shannon divergence between a teacher's and a student's next-token distributions at each
completion token (distill's loss), from the two models' hidden states and output layers a chunk of tokens at a time,
so that neither model's (tokens x vocabulary) logits exist whole.

At a token, with z the logits and T the temperature, p_s = softmax(z_s / T), p_t = softmax(z_t / T) (TRL 1.16's
DistillationTrainer, its ChunkedDivergenceFunction, and GKD's generalized_jsd_loss):

    beta = 0      KL(p_t || p_s) = sum_v p_t (log p_t - log p_s)                 the forward KL
    beta = 1      KL(p_s || p_t) = sum_v p_s (log p_s - log p_t)                 the reverse KL
    otherwise     beta KL(p_t || m) + (1 - beta) KL(p_s || m),  m = (1 - beta) p_s + beta p_t

and the student's entropy -sum_v p_s log p_s (a figure: no gradient). `ChunkedDivergence` takes the completion
tokens' hidden states (N, H) of both models and their output layers and projects a chunk of tokens at a time
(head.chunk_tokens: the fused loss's chunk), the matrix product in autocast's dtype where it is on (the run's
precision) and the softmax in float32; backward recomputes each chunk's logits and takes their gradient by autograd
on that chunk alone. The teacher's side gets no gradient.

A model whose logits the model itself rescales (soft-capping, a logit scale or multiplier: RESCALED, what TRL reads
and head.SCALED_LOGITS), or whose output layer is not one linear layer after a backbone, cannot be projected from its
hidden states alone: then both models' own full logits are taken (`Teacher.logits`), the model's rescaling included,
and the divergence is computed from them a chunk of tokens at a time (each chunk recomputed in backward:
torch.utils.checkpoint). TRL applies the scales it knows of per tile instead; the models' own logits are right for
any model, at the memory of the full logits.

`DivergenceRequest` is the student's pass as the head answers it (head.HeadRequest): inside the forward of the module
that DDP and FSDP wrap, so the gradients synchronise."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .head import SCALED_LOGITS, CausalLMHead, HeadRequest, cast_logits, chunk_tokens, why_not

# what TRL's DistillationTrainer reads as a logit multiplier (logit_scale, output_multiplier, lm_head_multiplier,
# logits_scaling) or cap (final_logit_softcapping), beside what the fused loss already leaves to the model's own logits
RESCALED = tuple(dict.fromkeys((*SCALED_LOGITS, "output_multiplier", "lm_head_multiplier")))


def divergence_of(log_s: torch.Tensor, log_t: torch.Tensor, beta: float) -> torch.Tensor:
    """The divergence per row of the student's and the teacher's (n, V) log-probabilities (module docstring)."""
    if beta == 0:
        return (log_t.exp() * (log_t - log_s)).sum(-1)
    if beta == 1:
        return (log_s.exp() * (log_s - log_t)).sum(-1)
    log_m = torch.logaddexp(log_s + math.log1p(-beta), log_t + math.log(beta))
    kl_teacher, kl_student = (log_t.exp() * (log_t - log_m)).sum(-1), (log_s.exp() * (log_s - log_m)).sum(-1)
    return beta * kl_teacher + (1 - beta) * kl_student


@torch.no_grad()
def entropy_of(log_s: torch.Tensor) -> torch.Tensor:
    """The student's entropy per row of its (n, V) log-probabilities, without gradient (nothing kept for backward)."""
    return -(log_s.exp() * log_s).sum(-1)


def token_divergence(student: torch.Tensor, teacher: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(divergence, student entropy) per row of (n, V) float32 logits already divided by the temperature (module
    docstring); the entropy without gradient."""
    log_s = student.log_softmax(-1)
    return divergence_of(log_s, teacher.log_softmax(-1), beta), entropy_of(log_s)


def log_probs(hidden, weight, bias, dtype: torch.dtype, temperature: float) -> torch.Tensor:
    """A chunk's (n, V) float32 log-probabilities at the temperature, from hidden states and an output layer (the
    logits and their tempered copy freed as soon as they are read)."""
    return (cast_logits(hidden, weight, bias, dtype) / temperature).log_softmax(-1)


def projection_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The matrix product's dtype: autocast's where it is on (kept for the backward's recompute), else the weight's."""
    on = torch.is_autocast_enabled(hidden.device.type)
    return torch.get_autocast_dtype(hidden.device.type) if on else weight.dtype


class ChunkedDivergence(torch.autograd.Function):
    """Per-token divergence and student entropy (N,) float32 from the completion tokens' hidden states of the student
    (N, H_s) and the teacher (N, H_t) and their output layers (V, H) with their biases, a chunk of tokens at a time
    (module docstring). The gradient flows to the student's hidden states, weight and bias only."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, t_hidden, t_weight, t_bias, beta: float, temperature: float, chunk: int):  # type: ignore[override]
        ctx.dtypes = (projection_dtype(hidden, weight), projection_dtype(t_hidden, t_weight))
        ctx.beta, ctx.temperature, ctx.chunk = beta, temperature, chunk
        divergence = torch.zeros(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        entropy = torch.zeros_like(divergence)
        for start in range(0, hidden.shape[0], chunk):
            part = slice(start, start + chunk)
            log_s = log_probs(hidden[part], weight, bias, ctx.dtypes[0], temperature)
            log_t = log_probs(t_hidden[part], t_weight, t_bias, ctx.dtypes[1], temperature)
            divergence[part], entropy[part] = divergence_of(log_s, log_t, beta), entropy_of(log_s)
            del log_s, log_t
        ctx.save_for_backward(hidden, weight, bias, t_hidden, t_weight, t_bias)
        ctx.mark_non_differentiable(entropy)
        return divergence, entropy

    @staticmethod
    def backward(ctx, grad_divergence, _):  # type: ignore[override]
        hidden, weight, bias, t_hidden, t_weight, t_bias = ctx.saved_tensors
        needed, (dtype, t_dtype), temperature = ctx.needs_input_grad, ctx.dtypes, ctx.temperature
        grad_hidden = torch.zeros_like(hidden) if needed[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if needed[1] else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if bias is not None and needed[2] else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            part = slice(start, start + ctx.chunk)
            h = hidden[part]
            log_t = log_probs(t_hidden[part], t_weight, t_bias, t_dtype, temperature)
            with torch.enable_grad():  # the divergence alone (no entropy), its gradient by autograd on this chunk
                logits = cast_logits(h, weight, bias, dtype).requires_grad_()
                divergence = divergence_of((logits / temperature).log_softmax(-1), log_t, ctx.beta)
                (g,) = torch.autograd.grad(divergence, logits, grad_divergence[part])
            del log_t, logits, divergence
            if grad_hidden is not None:
                grad_hidden[part] = (g.to(dtype) @ weight.to(dtype)).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight.addmm_(g.T, h.float())  # in place: no (V, H) temporary per chunk
            if grad_bias is not None:
                grad_bias += g.sum(0)
        grads = (grad_hidden, grad_weight, grad_bias)
        dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return *(None if g is None else g.to(d) for g, d in zip(grads, dtypes)), None, None, None, None, None, None


def full_divergence(student: torch.Tensor, teacher: torch.Tensor, beta: float, temperature: float, chunk: int):
    """The same from both models' own logits (N, V) at the completion tokens, a chunk of tokens at a time in float32,
    each chunk recomputed in backward (the fallback for rescaled logits: module docstring)."""

    def piece(s: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return token_divergence(s.float() / temperature, t.float() / temperature, beta)

    parts = [
        cast(tuple, checkpoint(piece, student[k : k + chunk], teacher[k : k + chunk], use_reentrant=False))
        if torch.is_grad_enabled()
        else piece(student[k : k + chunk], teacher[k : k + chunk])
        for k in range(0, student.shape[0], chunk)
    ]
    if not parts:
        empty = student.new_zeros(0, dtype=torch.float32)
        return empty + student.sum() * 0, empty
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def at_completion(x: torch.Tensor, start: int, learned: torch.Tensor) -> torch.Tensor:
    """(N, ...) of (B, T, ...) per-position values: those of the positions that predict the learned completion tokens
    (`learned` (B, L): which of the L tokens after the prompt; position start + j predicts token j)."""
    return x[:, start : start + learned.shape[1]][learned]


@dataclass(frozen=True)
class Teacher:
    """The teacher at the completion tokens: its hidden states and output layer (chunked), or its own logits."""

    hidden: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    logits: torch.Tensor | None = None


@torch.no_grad()
def teacher_at(model: nn.Module, inputs: dict, start: int, learned: torch.Tensor, full: bool) -> Teacher:
    """The teacher's pass over the rows (no gradients; the caller's autocast): its hidden states at the completion
    tokens and its output layer, or (`full`) its own logits there."""
    if full:
        return Teacher(logits=at_completion(cast(Any, model)(**inputs, use_cache=False).logits, start, learned))
    lm = cast(Any, model)
    hidden = getattr(lm, lm.base_model_prefix)(**inputs, use_cache=False).last_hidden_state
    out = lm.get_output_embeddings()
    return Teacher(at_completion(hidden, start, learned), out.weight, out.bias)


def full_logits(student: nn.Module, teacher: nn.Module, shards: bool = False) -> str | None:
    """Why the divergence must come from the models' own full logits (the student's or the teacher's output layer
    cannot be projected from its hidden states: head.why_not, or a multiplier TRL also reads: RESCALED), or None
    (chunked)."""
    for who, model in (("the student", student), ("the teacher", teacher)):
        config = cast(Any, model).config.get_text_config()
        scaled = [name for name in RESCALED if getattr(config, name, None) not in (None, 1, 1.0)]
        why = why_not(model, shards and who == "the student") or (scaled and f"its logits are rescaled ({scaled[0]})")
        if why:
            return f"{who}: {why}"
    return None


@dataclass
class Divergence:
    """What the student's pass returns: the per-token divergence and student entropy (N,) float32."""

    divergence: torch.Tensor
    entropy: torch.Tensor
    loss: None = None
    logits: None = None


@dataclass(frozen=True)
class DivergenceRequest(HeadRequest):
    """The student's pass over rows (`inputs`: ids, mask, positions, maybe a prompt's key-value cache) whose hidden
    position `start` + j predicts completion token j (`learned`: which count), against the teacher's side."""

    inputs: dict
    start: int
    learned: torch.Tensor
    teacher: Teacher
    beta: float
    temperature: float

    def answer(self, head: CausalLMHead) -> Divergence:
        inputs, t = {**self.inputs, "use_cache": False}, self.teacher
        if t.logits is not None:
            logits = at_completion(head.wrapped(**inputs).logits, self.start, self.learned)
            chunk = chunk_tokens(logits.shape[-1])
            return Divergence(*full_divergence(logits, t.logits, self.beta, self.temperature, chunk))
        lm = head.causal_lm
        hidden = at_completion(getattr(lm, lm.base_model_prefix)(**inputs).last_hidden_state, self.start, self.learned)
        out = lm.get_output_embeddings()
        chunk = chunk_tokens(out.weight.shape[0])
        found = ChunkedDivergence.apply(hidden, out.weight, out.bias, t.hidden, t.weight, t.bias, self.beta,
                                        self.temperature, chunk)  # fmt: skip
        return Divergence(*cast(tuple, found))
