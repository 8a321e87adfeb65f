"""Generation for a transformers causal LM, the one way every causal-LM task generates (grpo's and distill's rollouts,
sft's and dpo's evaluation answers, `anytrain sample`): prompts padded on the left, each token's position from the
mask (as the log-probabilities take them), the key-value cache on, evaluation mode, no gradients, stopping at any of
the stop ids (`stop_ids`: the tokenizer's end of text, the model's generation config's end ids, a chat template's end
of turn) or after `max_new_tokens`. A prompt that follows itself (grpo's group) may be read once (`shared`:
`prompt_kv`, the cache of its tokens but the last, repeated to its rows).

The sampling config is complete: the model's own generation config (a repetition penalty, no_repeat_ngram_size,
top_k in its generation_config.json) changes nothing; what is sampled is what `Sampling` says, keyed (sampler.py: the
same completion whichever process, batch or resumed run samples it). Without keys, generation is greedy: the model's
most likely token, no filter nor penalty.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from ...config import ConfigError
from .sampler import NoisyScores, Sampling
from .sampler import completion_keys as completion_keys  # re-exported: the tasks' keys
from .sampler import filters_of as filters_of  # re-exported: `anytrain sample`'s filters


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

    def to(self, device: torch.device) -> Completions:
        ids, mask, positions, completion = (
            t.to(device) for t in (self.ids, self.mask, self.positions, self.completion)
        )
        return Completions(ids, mask, positions, completion, self.truncated.to(device), self.width)

    def completion_ids(self) -> list[list[int]]:
        """Each completion's tokens after its prompt (with tools, the tools' answers too, as TRL gives them)."""
        return [row[keep.bool()].tolist() for row, keep in zip(self.ids[:, self.width :], self.mask[:, self.width :])]


def positions_of(mask: torch.Tensor) -> torch.Tensor:
    """Each token's position from a row's attention mask: 0 at its first real token (0 on the padding before it), as
    the log-probabilities and generate read every row."""
    return (mask.cumsum(1) - 1).clamp(min=0)


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for k, prompt in enumerate(prompts):
        ids[k, width - len(prompt) :], mask[k, width - len(prompt) :] = torch.tensor(prompt), 1
    return ids, mask


def stop_ids(tokenizer, model_eos, chats: bool) -> list[int]:
    """Where a completion stops (as TRL's GRPOTrainer): the tokenizer's end-of-text token, the model's generation
    config's eos_token_id (an id or a list), and for chats the special tokens the template closes an assistant turn
    with (its end of turn)."""
    from .prompts import render

    stops = {tokenizer.eos_token_id} | set(model_eos if isinstance(model_eos, (list, tuple)) else [model_eos])
    stops -= {None}
    if chats:
        asked = [{"role": "user", "content": "2 + 2?"}]
        before = render(tokenizer, asked, True)
        after = render(tokenizer, [*asked, {"role": "assistant", "content": "4"}])[len(before) :]
        special = set(tokenizer.all_special_ids)
        stops |= {t for t in tokenizer(after, add_special_tokens=False).input_ids if t in special}
    if not stops:
        raise ConfigError("--model: its tokenizer has no end-of-text token, where a completion would stop")
    return sorted(int(t) for t in stops)


def model_eos(cfg, config) -> list[int] | int | None:
    """The end ids of the model's generation config: its generation_config.json's, else those transformers derives
    from its config (as from_pretrained gives the model)."""
    from transformers import GenerationConfig

    from ...hf import source_of

    try:
        return GenerationConfig.from_pretrained(source_of(cfg)).eos_token_id
    except (OSError, ValueError):  # no generation_config.json: the model's config says it
        return GenerationConfig.from_model_config(config).eos_token_id


def unwrapped(model: nn.Module) -> nn.Module:
    """The transformers model (or its peft model) inside DDP's and torch.compile's wrappers and the loop's head
    (head.CausalLMHead), for generate()."""
    from .head import plain

    model = getattr(model, "module", model)
    return plain(getattr(model, "_orig_mod", model))


def generating_model(model: nn.Module) -> nn.Module:
    """The transformers model inside its wrappers (peft, accelerate): the one whose generation config counts."""
    from transformers import GenerationMixin

    found = unwrapped(model).modules()
    return next(m for m in found if isinstance(m, GenerationMixin) and hasattr(m, "generation_config"))


@dataclass(frozen=True)
class PromptCache:
    """How a model takes a key-value cache (its forward's keyword, `cache` from transformers 5, `past_key_values`
    before, which is also its output's field) and keeps only the last position's logits (`keep`, if it can)."""

    kwarg: str
    keep: str | None


def prompt_cache(model: nn.Module) -> PromptCache | None:
    """The model's PromptCache, from its forward's signature (None: it takes no cache)."""
    names = inspect.signature(type(generating_model(model)).forward).parameters  # its own, not a wrapper's
    kwarg = next((n for n in ("cache", "past_key_values") if n in names), None)
    keep = next((n for n in ("logits_to_keep", "num_logits_to_keep") if n in names), None)
    return None if kwarg is None else PromptCache(kwarg, keep)


def prompt_runs(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Of prompts padded on the left (ids, mask): the first row of each run of rows with the same prompt and each
    row's run, where some row has the prompt of the row before (grpo's groups are consecutive) and the prompts have a
    column before their last token; else None."""
    if ids.shape[1] < 2:
        return None
    prompts = ids.masked_fill(mask == 0, -1)
    new = torch.ones(len(prompts), dtype=torch.bool, device=prompts.device)
    new[1:] = (prompts[1:] != prompts[:-1]).any(1)
    if bool(new.all()):
        return None
    return new.nonzero()[:, 0], new.cumsum(0) - 1


def prompt_kv(call: Callable, ids: torch.Tensor, mask: torch.Tensor, shared: PromptCache, runs) -> Any:
    """The key-value cache of each distinct row of (ids, mask) read once (`runs`: prompt_runs'), repeated to every
    row of its run (a gather: gradients flow back through it)."""
    firsts, run = runs
    head = {"input_ids": ids[firsts], "attention_mask": mask[firsts], "use_cache": True}
    head |= {"position_ids": positions_of(mask[firsts]), **({shared.keep: 1} if shared.keep else {})}
    cache = getattr(call(head), shared.kwarg)
    cache.batch_select_indices(run)
    return cache


MEMORY_SHARE = 0.5  # fitting(): the share of the free memory a generate call may fill


def free_bytes(device: torch.device) -> int:
    """The memory a generate call may take on `device`: a GPU's free memory and what torch holds unused there; a
    CPU's available memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    import psutil  # an accelerate dependency

    return int(psutil.virtual_memory().available)


def row_bytes(model: nn.Module, length: int) -> int | None:
    """A row's memory while generating `length` tokens: its key-value cache (every layer's keys and values, at 4
    bytes a number) and a step's scores (float32 scores, their filtered copies, the Gumbel noise's int64 hashes: 16
    numbers of 8 bytes a token of the vocabulary). None for a model whose config does not say its attention's sizes."""
    config = cast(Any, generating_model(model)).config.get_text_config()
    layers, heads = getattr(config, "num_hidden_layers", None), getattr(config, "num_attention_heads", None)
    if not (layers and heads and getattr(config, "hidden_size", None)):
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * layers * kv_heads * head_dim * length * 4 + 16 * 8 * config.vocab_size


def fitting(model: nn.Module, prompts: list[list[int]], sampling: Sampling) -> int:
    """How many of `prompts` to generate at a time so that their rows fill at most MEMORY_SHARE of the free memory
    (grpo's --generate-batch 0): 0 (all at once) where they all fit or the model's sizes are unknown, else the most
    that fit, at least 1."""
    per_row = row_bytes(model, max(len(p) for p in prompts) + sampling.max_new_tokens)
    if per_row is None:
        return 0
    rows = int(MEMORY_SHARE * free_bytes(next(model.parameters()).device)) // per_row
    return 0 if rows >= len(prompts) else max(rows, 1)


@torch.no_grad()
def generate(
    model: nn.Module,
    prompts: list[list[int]],
    keys: torch.Tensor | None,
    sampling: Sampling,
    chunk: int = 0,
    shared: PromptCache | None = None,
) -> Completions:
    """Each prompt's completion (keys: one per prompt, sampled; None: greedy) under a complete config: the model's
    generation config is set aside for the call, so none of its fields fill what this one leaves unset. `chunk`: so
    many prompts generated at a time (0: all), the pieces joined: the same completions (each one's noise is its
    key's), the memory of a piece's key-value cache and logits. `shared`: a prompt that follows itself (grpo's
    group) read once, its key-value cache (but its last token) repeated to its rows before generate goes on."""
    if 0 < chunk < len(prompts):
        starts = range(0, len(prompts), chunk)
        return joined([generate(model, prompts[i : i + chunk], None if keys is None else keys[i : i + chunk],
                                sampling, shared=shared) for i in starts], sampling.pad)  # fmt: skip
    from transformers import GenerationConfig, LogitsProcessorList

    ids, mask = left_padded(prompts, sampling.pad)
    device = next(model.parameters()).device
    width, was_training = ids.shape[1], model.training
    processors = [] if keys is None else [NoisyScores(keys, width, sampling, mask.to(device))]
    config = GenerationConfig(
        max_new_tokens=sampling.max_new_tokens, do_sample=False, eos_token_id=list(sampling.stops),
        pad_token_id=sampling.pad, use_cache=True,
    )  # fmt: skip
    inner = generating_model(model)
    own, inner.generation_config = inner.generation_config, GenerationConfig()  # transformers' defaults only
    model.eval()
    ids, mask = ids.to(device), mask.to(device)
    try:
        out = cast(Any, model).generate(
            input_ids=ids, attention_mask=mask, position_ids=positions_of(mask),
            generation_config=config, logits_processor=LogitsProcessorList(processors),
            **prefilled(model, ids, mask, shared), **unrouted(inner),
        )  # fmt: skip
    finally:
        inner.generation_config = own
        model.train(was_training)
    return read_back(out, mask, width, sampling)


def unrouted(model: nn.Module) -> dict:
    """A mixture of experts' load-balancing loss off while generating: nothing needs it, and transformers computes it
    against the whole attention mask, which fails on a step of one token a row after padded prompts."""
    return {"output_router_logits": False} if getattr(model.config, "output_router_logits", False) else {}


def prefilled(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, shared: PromptCache | None) -> dict:
    """generate's keyword for a cache of the prompts but their last tokens, each distinct prompt read once ({} where
    none is shared, or no `shared`)."""
    runs = None if shared is None else prompt_runs(ids, mask)
    if shared is None or runs is None:
        return {}
    return {shared.kwarg: prompt_kv(lambda inputs: model(**inputs), ids[:, :-1], mask[:, :-1], shared, runs)}


def read_back(out: torch.Tensor, prompt_mask: torch.Tensor, width: int, sampling: Sampling) -> Completions:
    """The generated rows as Completions: a completion ends with its first stop token (kept), the rest is padding."""
    new = out[:, width:]
    length = sampling.max_new_tokens
    if new.shape[1] < length:  # every row stopped early: generate ends the batch there
        pad = torch.full((len(new), length - new.shape[1]), sampling.pad, dtype=new.dtype, device=new.device)
        new = torch.cat([new, pad], 1)
    is_stop = torch.isin(new, torch.tensor(sampling.stops, device=new.device))
    after = is_stop.cumsum(1) - is_stop.long()  # stops before each token
    completion = after == 0  # up to and with the first stop
    truncated = ~is_stop.any(1)
    mask = torch.cat([prompt_mask, completion.long()], 1)
    ids = torch.cat([out[:, :width], new.masked_fill(~completion, sampling.pad)], 1)
    return Completions(ids, mask, positions_of(mask), completion, truncated, width)


def joined(pieces: list[Completions], pad: int) -> Completions:
    """Completions of several generate calls as one: each piece's prompts padded on the left to the widest."""
    width = max(p.width for p in pieces)

    def left(t: torch.Tensor, p: Completions, fill: int) -> torch.Tensor:
        return torch.cat([torch.full((len(t), width - p.width), fill, dtype=t.dtype, device=t.device), t], 1)

    ids = torch.cat([left(p.ids, p, pad) for p in pieces])
    mask = torch.cat([left(p.mask, p, 0) for p in pieces])
    completion, truncated = torch.cat([p.completion for p in pieces]), torch.cat([p.truncated for p in pieces])
    return Completions(ids, mask, positions_of(mask), completion, truncated, width)
