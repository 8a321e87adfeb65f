"""Per-token log-probabilities of a transformers causal LM at a temperature, the one way the causal-LM tasks take
them (grpo's policy, old and reference log-probabilities; dpo's sequence sums): a `LogpsRequest` to the model as
the loop trains it (head.CausalLMHead, which returns TokenLogps: the chunked fused output layer, no full logits),
through the loop's forward, so that a call through DDP's or FSDP's wrapper synchronises the gradients.

log p_T(y_t | y_<t) = z[y_t] / T - logsumexp(z / T), z the logits: TRL's GRPOTrainer divides the logits by the
sampling temperature before its log-softmax (`_get_per_token_logps_and_entropies`), so that the policy trained is
the one that sampled.

A prompt shared by several completions (grpo's group) is read once (`shared`, where `prompt_cache` found the model
able to): a forward of each distinct prompt but its last token returns the key-value cache, which is repeated to
each completion's row, then the last prompt token and the completion read it, with gradients through both calls.
The same values to float rounding (checked on the model at the start, `shares_prompts`), at a fraction of the
cost: a group of G completions reads its prompt once instead of G times."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from ...config import first_line
from ...shape import IGNORE
from .generation import (
    Completions,
    PromptCache,
    Sampling,
    generate,
    positions_of,
    prompt_cache,
    prompt_kv,
    prompt_runs,
    unwrapped,
)
from .head import LogpsRequest


def bare(model: nn.Module) -> Callable:
    """How a no-gradient pass calls the model outside the loop's wrappers (old and reference log-probabilities): a
    LogpsRequest as it is, a dict of inputs as keywords, as the loop's forward passes them."""
    return lambda given: model(given) if isinstance(given, LogpsRequest) else model(**given)


def labels_from(ids: torch.Tensor, learned: torch.Tensor) -> torch.Tensor:
    """The ids where `learned` (bool, same shape), IGNORE elsewhere: the positions whose log-probability is taken."""
    return ids.masked_fill(~learned, IGNORE)


def completion_logps(
    call: Callable, rows: Completions, temperature: float, shared: PromptCache | None = None
) -> torch.Tensor:
    """(rows, max_new_tokens) float32: each completion token's log-probability under softmax(logits / T), 0 at the
    padding after a completion's stop. `call(inputs)` calls the model: the loop's ctx.forward (its wrappers), or the
    bare model for no-gradient passes (old and reference log-probabilities). `shared`: each distinct prompt read
    once (module docstring) where rows share one."""
    learned = torch.zeros_like(rows.mask, dtype=torch.bool)
    learned[:, rows.width :] = rows.completion
    labels = labels_from(rows.ids, learned)
    groups = None if shared is None else prompt_runs(rows.ids[:, : rows.width], rows.mask[:, : rows.width])
    if shared is not None and groups is not None:
        return shared_logps(call, rows, labels, temperature, shared, groups)
    inputs = {"input_ids": rows.ids, "attention_mask": rows.mask, "position_ids": rows.positions}
    return call(LogpsRequest(inputs, labels, temperature)).logps[:, rows.width :]


def shared_logps(
    call: Callable, rows: Completions, labels: torch.Tensor, temperature: float, shared: PromptCache, groups
) -> torch.Tensor:
    """completion_logps with each distinct prompt read once: its cache (all but the last prompt token) repeated to
    its completions' rows; then the last prompt token and the completion, attending to the whole row's mask."""
    last = rows.width - 1
    cache = prompt_kv(call, rows.ids[:, :last], rows.mask[:, :last], shared, groups)
    tail = {"input_ids": rows.ids[:, last:], "attention_mask": rows.mask, "position_ids": rows.positions[:, last:]}
    return call(LogpsRequest({**tail, shared.kwarg: cache}, labels[:, last:], temperature)).logps[:, 1:]


def sequence_logps(call: Callable, inputs: dict, temperature: float = 1.0) -> torch.Tensor:
    """(sequences, 2) float32 for a batch whose inputs hold `labels` (the learned tokens, IGNORE elsewhere) and
    `sequence_ids` (each token's sequence, several to a row when packed): each sequence's summed log-probability of
    its learned tokens and their count (dpo's π and its lengths)."""
    given = {k: v for k, v in inputs.items() if k not in ("sequence_ids", "labels")}
    logps = call(LogpsRequest(given, inputs["labels"], temperature)).logps
    picked = inputs["labels"] != IGNORE
    where = inputs["sequence_ids"][picked]
    count = int(inputs["sequence_ids"].max()) + 1
    sums = torch.zeros(count, dtype=torch.float32, device=logps.device).index_add(0, where, logps[picked])
    counts = torch.zeros(count, dtype=torch.float32, device=logps.device).index_add_(
        0, where, torch.ones_like(where, dtype=torch.float32)
    )
    return torch.stack([sums, counts], 1)


TOLERANCE = 1e-3  # shares_prompts: float32 rounds at ~1e-7 of the scale, bf16 at 1e-4 to 4e-4 (the zoo under autocast);
# a leak (padding attended, positions off) changes a tiny random model's log-probabilities by 6e-3 to 6e-2


def shares_prompts(call: Callable, model: nn.Module) -> tuple[PromptCache | None, str]:
    """Whether completion_logps and generate may read shared prompts once on this model, checked on it (in
    evaluation mode, no gradients, its own random generator): two prompts of different lengths, two completions
    each, one stopping early, their log-probabilities with and without sharing within TOLERANCE of their scale, and
    3 greedy tokens generated after them, the same. (the PromptCache or None, why not)."""
    from ...hf import checkpoints_activations
    from .generation import generating_model

    inner = generating_model(model)
    shared = prompt_cache(model)
    if shared is None:
        return None, "its forward takes no key-value cache"
    if checkpoints_activations(model):
        return None, "gradient checkpointing recomputes the blocks, and a key-value cache with them"
    vocabulary = cast(Any, inner).get_input_embeddings().weight.shape[0]
    rows = probe_rows(vocabulary, next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            plain = completion_logps(call, rows, 1.0)
            seen = completion_logps(call, rows, 1.0, shared)
    except Exception as e:  # noqa: BLE001 - a model whose forward refuses the cache
        return None, f"its forward with a key-value cache failed: {first_line(e)}"
    finally:
        model.train(was_training)
    scale = plain.abs().max().item() or 1.0
    change = (seen - plain).abs().max().item() / scale
    if not change <= TOLERANCE:  # NaN fails too
        return None, f"its log-probabilities change by {change:.3g} of their scale (tolerance {TOLERANCE:g})"
    if not same_generation(unwrapped(model), rows, shared):
        return None, "its generate, given the prompts' key-value cache, writes other tokens"
    return (
        shared,
        "each distinct prompt read once per group (checked on the model: the same log-probabilities and tokens)",
    )


def same_generation(model: nn.Module, rows: Completions, shared: PromptCache) -> bool:
    """Whether generate writes the same 3 greedy tokens after the rows' prompts with and without their cache."""
    prompts = [row[keep.bool()].tolist() for row, keep in zip(rows.ids[:, : rows.width], rows.mask[:, : rows.width])]
    sampling = Sampling(max_new_tokens=3, stops=(0,), pad=0)
    plain, once = (generate(model, prompts, None, sampling, shared=how) for how in (None, shared))
    return torch.equal(plain.ids, once.ids)


def probe_rows(vocabulary: int, device: torch.device) -> Completions:
    """shares_prompts' rows: prompts of 6 and 4 random tokens padded on the left, two completions of up to 5 each
    (the last one of 3, then padding)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocabulary, (4, 11), generator=generator)
    mask = torch.ones_like(ids)
    mask[2:, :2] = 0  # the second prompt is 4 tokens long
    completion = torch.ones(4, 5, dtype=torch.bool)
    completion[3, 3:] = False
    mask[:, 6:] = completion.long()
    ids[:2, :6] = ids[0, :6]
    ids[2:, :6] = ids[2, :6]
    ids = ids.masked_fill(mask == 0, 0)
    return Completions(ids, mask, positions_of(mask), completion, torch.zeros(4, dtype=torch.bool), 6).to(device)
