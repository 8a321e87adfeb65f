"""grpo's rollouts: each prompt answered --num-generations times by the model's own generate (key-value cache on,
prompts padded on the left, stopping at the end-of-text or end-of-turn token, --max-new-tokens), in evaluation
mode and without gradients.

Sampling is reproducible by construction: the model's generate picks, at each step, the most likely token after
Gumbel noise is added to the tempered, top-p filtered scores (the Gumbel-max trick: a sample from the softmax),
and the noise of a completion's token is a hash of (seed, the completion's key, its position, the token), not a
draw from a generator. A completion is therefore the same whichever process, batch or resumed run samples it:
1 rank equals 2, gradient accumulation equals one big batch, and a killed run resumes bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

MASK32 = 0xFFFFFFFF


def mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """(x * m) mod 2**32 for int64 x in [0, 2**32), in int64 without overflow (m split into 16-bit halves)."""
    low, high = m & 0xFFFF, m >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (murmur3's finaliser) of int64 values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def completion_keys(seed: int, split: int, epoch: int, rows: torch.Tensor, generations: int) -> torch.Tensor:
    """One key per completion, (rows x generations), in [0, 2**32): a function of the run's seed, the split, the
    epoch, the prompt's row and which of its completions."""
    k = torch.arange(generations, dtype=torch.int64)
    x = mix32(torch.full_like(rows, (seed * 7919 + split * 104729) & MASK32) ^ (rows.long() & MASK32))
    x = mix32(x ^ (epoch & MASK32))
    return mix32(x.repeat_interleave(generations) ^ k.repeat(len(rows)))


def gumbel(keys: torch.Tensor, position: int, vocabulary: int) -> torch.Tensor:
    """(len(keys), vocabulary) float32 Gumbel noise, a function of each key, the position and the token id."""
    tokens = torch.arange(vocabulary, dtype=torch.int64, device=keys.device)
    x = mix32(mix32(keys[:, None] ^ (position & MASK32)) ^ tokens[None, :])
    x = mix32(x ^ 0x9E3779B9)
    uniform = (x.double() + 0.5) / 2.0**32  # in (0, 1)
    return (-torch.log(-torch.log(uniform))).float()


class NoisyScores:
    """The logits processor of the generate call: temperature, top-p, then each row's Gumbel noise."""

    def __init__(self, keys: torch.Tensor, start: int, temperature: float, top_p: float):
        self.keys, self.start, self.temperature, self.top_p = keys, start, temperature, top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.float() / self.temperature
        if self.top_p < 1.0:
            ordered, order = scores.sort(-1, descending=True)
            before = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1)  # probability of the tokens before each
            drop = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, order, before >= self.top_p)
            scores = scores.masked_fill(drop, float("-inf"))
        noise = gumbel(self.keys.to(scores.device), input_ids.shape[1] - self.start, scores.shape[-1])
        return scores + noise


@dataclass
class Completions:
    """A batch of prompts and their completions as the model reads them back: `ids` the prompt (padded on the left
    to `width`) then the completion (padded on the right), `mask` their real tokens (the completion up to and with
    its stop token), `positions` each token's position; `completion` marks the completion's counted tokens,
    `truncated` the completions that reached --max-new-tokens without a stop."""

    ids: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    completion: torch.Tensor
    truncated: torch.Tensor
    width: int

    def rows(self, index: slice | torch.Tensor) -> Completions:
        return Completions(
            self.ids[index], self.mask[index], self.positions[index], self.completion[index], self.truncated[index],
            self.width,
        )  # fmt: skip

    def completion_ids(self) -> list[list[int]]:
        return [row[keep].tolist() for row, keep in zip(self.ids[:, self.width :], self.completion)]


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for k, prompt in enumerate(prompts):
        ids[k, width - len(prompt) :], mask[k, width - len(prompt) :] = torch.tensor(prompt), 1
    return ids, mask


@torch.no_grad()
def generate(model: nn.Module, prompts: list[list[int]], keys: torch.Tensor | None, settings: dict) -> Completions:
    """Each prompt's completion (keys: one per prompt; None: greedy), settings: max_new_tokens, temperature, top_p,
    stops (token ids), pad."""
    from transformers import GenerationConfig, LogitsProcessorList

    ids, mask = left_padded(prompts, settings["pad"])
    device = next(model.parameters()).device
    width, was_training = ids.shape[1], model.training
    processors = [] if keys is None else [NoisyScores(keys, width, settings["temperature"], settings["top_p"])]
    config = GenerationConfig(
        max_new_tokens=settings["max_new_tokens"],
        do_sample=False,
        eos_token_id=settings["stops"],
        pad_token_id=settings["pad"],
        use_cache=True,
    )  # fmt: skip: its own config, so the model's sampling defaults (a repetition penalty) change nothing
    model.eval()
    try:
        out = cast(Any, model).generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config,
            logits_processor=LogitsProcessorList(processors),
        )  # fmt: skip
    finally:
        model.train(was_training)
    return read_back(out, mask.to(device), width, settings)


def read_back(out: torch.Tensor, prompt_mask: torch.Tensor, width: int, settings: dict) -> Completions:
    """The generated rows as Completions: a completion ends with its first stop token (kept), the rest is padding."""
    new = out[:, width:]
    length = settings["max_new_tokens"]
    if new.shape[1] < length:  # every row stopped early: generate ends the batch there
        pad = torch.full((len(new), length - new.shape[1]), settings["pad"], dtype=new.dtype, device=new.device)
        new = torch.cat([new, pad], 1)
    stops = torch.tensor(settings["stops"], device=new.device)
    is_stop = torch.isin(new, stops)
    after = is_stop.cumsum(1) - is_stop.long()  # stops before each token
    completion = after == 0  # up to and with the first stop
    truncated = ~is_stop.any(1)
    mask = torch.cat([prompt_mask, completion.long()], 1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    ids = torch.cat([out[:, :width], new.masked_fill(~completion, settings["pad"])], 1)
    return Completions(ids, mask, positions, completion, truncated, width)


def token_logps(model: nn.Module, rows: Completions, call) -> torch.Tensor:
    """(rows, max_new_tokens) float32: each completion token's log-probability under the model (`call` is how the
    loop calls it: through its DDP/FSDP wrappers, so that gradients synchronise). Only the completion's positions
    get logits (logits_to_keep), a few rows at a time into float32."""
    length = rows.ids.shape[1] - rows.width
    inputs = {"input_ids": rows.ids, "attention_mask": rows.mask, "position_ids": rows.positions}
    logits = call({**inputs, "logits_to_keep": length + 1}).logits[:, :-1]  # position t predicts token t + 1
    targets = rows.ids[:, rows.width :]
    out = []
    for start in range(0, len(targets), 8):
        chunk = logits[start : start + 8].float()
        picked = chunk.gather(-1, targets[start : start + 8, :, None]).squeeze(-1)
        out.append(picked - chunk.logsumexp(-1))
    return torch.cat(out)
