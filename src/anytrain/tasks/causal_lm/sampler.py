"""Keyed sampling, the one way the causal-LM tasks sample (generation.py's generate: grpo's and distill's rollouts,
`anytrain sample`): what a generate call samples (`Sampling`), the completions' keys, the Gumbel noise that is a
function of (key, position, token), and the logits processor that filters the scores and adds the noise.

The filters are those TRL's GRPOConfig (and DistillationConfig) gets through transformers' generate, in its order,
each as its transformers logits processor computes it: the repetition penalty on the raw logits (each token the row
has read, its prompt without the padding and its completion so far: a positive logit divided by the penalty, a
negative one multiplied: RepetitionPenaltyLogitsProcessor), then the temperature, top-k, top-p (the nucleus) and
min-p (a token less likely than min_p times the most likely one dropped, after the others: MinPLogitsWarper). They
shape what is sampled only: the log-probabilities trained on are those of softmax(logits / temperature), as TRL's
(logprobs.py).

Reproducible by construction: generate picks, at each step, the most likely token after Gumbel noise is added to the
filtered scores (the Gumbel-max trick: a sample from their softmax), and the noise of a completion's token is a hash
of (the completion's key, its position, the token), not a draw from a generator. A completion is therefore the same
whichever process, batch or resumed run samples it: 1 rank equals 2, gradient accumulation equals one big batch, and
a killed run resumes bit for bit. The filters read each row alone (the penalty its own tokens, the padding left out),
so they keep it.

The hash is murmur3's 32-bit finaliser. Over a step's (rows, vocabulary) numbers it runs in place in int32, whose
multiplication wraps modulo 2**32 as the finaliser's does, and the noise of several positions is made in one go (a
block of at most NOISE_BLOCK numbers, the positions that follow): the same bits as one position at a time in int64
(`mix32`), at a fraction of the cost (docs/benchmarks.md, the rollout's fixed cost).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MASK32 = 0xFFFFFFFF
SALT = 0x9E3779B9  # the token's hash is mixed once more with it
NOISE_BLOCK = 1 << 20  # the most numbers of noise made at a time (several positions where a position's are fewer)


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


def signed32(value: int) -> int:
    """The int32 with the bits of a value in [0, 2**32)."""
    return value - (1 << 32) if value >= 1 << 31 else value


def mix32_(x: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """mix32 in place on int32 holding the bits of uint32 values (the products wrap modulo 2**32; each right shift
    masked to the bits a logical shift keeps); `scratch` an int32 tensor of x's shape."""
    for shift, factor in ((16, 0x85EBCA6B), (13, 0xC2B2AE35), (16, None)):
        torch.bitwise_right_shift(x, shift, out=scratch)
        x ^= scratch.bitwise_and_((1 << (32 - shift)) - 1)
        if factor is not None:
            x *= signed32(factor)
    return x


def completion_keys(seed: int, split: int, epoch: int, rows: torch.Tensor, generations: int) -> torch.Tensor:
    """One key per completion, (rows x generations), in [0, 2**32): a function of the run's seed, the split, the
    epoch, the prompt's row and which of its completions."""
    k = torch.arange(generations, dtype=torch.int64)
    x = mix32(torch.full_like(rows, (seed * 7919 + split * 104729) & MASK32) ^ (rows.long() & MASK32))
    x = mix32(x ^ (epoch & MASK32))
    return mix32(x.repeat_interleave(generations) ^ k.repeat(len(rows)))


def noise(keys: torch.Tensor, positions: range, vocabulary: int) -> torch.Tensor:
    """(len(keys), len(positions), vocabulary) float32 Gumbel noise, a function of each key, the position and the
    token id: -log(-log(u)), u = (h + 1/2) / 2**32 from h = mix32(mix32(mix32(key ^ position) ^ token) ^ SALT)."""
    device = keys.device
    where = torch.arange(positions.start, positions.stop, dtype=torch.int64, device=device) & MASK32
    rows = mix32(keys[:, None].long() ^ where[None, :])  # (keys, positions), in [0, 2**32)
    rows = rows - ((rows >> 31) << 32)  # the same bits as int32 values
    tokens = torch.arange(vocabulary, dtype=torch.int32, device=device)
    x = rows.to(torch.int32)[:, :, None] ^ tokens
    scratch = torch.empty_like(x)
    mix32_(x, scratch)
    x ^= signed32(SALT)
    mix32_(x, scratch)
    del scratch
    uniform = x.long().bitwise_and_(MASK32).double().add_(0.5).mul_(2.0**-32)  # the bits as uint32: u in (0, 1)
    return uniform.log_().neg_().log_().neg_().float()


def gumbel(keys: torch.Tensor, position: int, vocabulary: int) -> torch.Tensor:
    """(len(keys), vocabulary) float32 Gumbel noise of one position (noise)."""
    return noise(keys, range(position, position + 1), vocabulary)[:, 0]


@dataclass(frozen=True)
class Sampling:
    """What a generate call samples: up to `max_new_tokens`, from softmax(logits / temperature) after the
    repetition penalty (1: none), within the `top_k` most likely tokens (0: all), the nucleus of probability `top_p`
    and the tokens at least `min_p` times as likely as the most likely one (0: all), stopping at any of `stops`; `pad`
    fills the rows."""

    max_new_tokens: int
    stops: tuple[int, ...]
    pad: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0


FILTERS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")  # what `anytrain sample`'s settings pass on


def filters_of(settings: dict) -> dict:
    """The Sampling fields past the length, stops and padding that `anytrain sample`'s settings hold."""
    return {name: settings[name] for name in FILTERS}


def sampled_scores(scores: torch.Tensor, sampling: Sampling, seen: torch.Tensor | None = None) -> torch.Tensor:
    """(rows, vocabulary) float32: the scores whose softmax is sampled from, -inf for the tokens filtered out (module
    docstring, transformers' order); `seen` (rows, vocabulary) bool: the tokens each row has read, where
    `repetition_penalty` is not 1."""
    scores = scores.float()
    if seen is not None and sampling.repetition_penalty != 1.0:
        penalty = sampling.repetition_penalty
        scores = torch.where(seen, torch.where(scores < 0, scores * penalty, scores / penalty), scores)
    if sampling.temperature != 1.0:  # x / 1 is x: the same bits either way
        scores = scores / sampling.temperature
    if 0 < sampling.top_k < scores.shape[-1]:
        kth = scores.topk(sampling.top_k, -1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = scores.sort(-1, descending=True)
        before = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1)  # probability of the tokens before each
        drop = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, order, before >= sampling.top_p)
        scores = scores.masked_fill(drop, float("-inf"))
    if sampling.min_p > 0:
        probabilities = scores.softmax(-1)
        least = sampling.min_p * probabilities.amax(-1, keepdim=True)
        scores = scores.masked_fill(probabilities < least, float("-inf"))
    return scores


class Seen:
    """Each row's tokens read so far as a (rows, vocabulary) mask, kept up to date across a generate call's steps:
    its prompt (`prompt_mask`: its real tokens, not the left padding), then each token generate appends."""

    def __init__(self, prompt_mask: torch.Tensor | None):
        self.prompt_mask = prompt_mask
        self.mask: torch.Tensor | None = None
        self.read = 0  # input_ids' columns in the mask

    def __call__(self, input_ids: torch.Tensor, vocabulary: int) -> torch.Tensor:
        new = input_ids[:, self.read :]
        if self.mask is None:  # the prompt: its padding to the spare last column
            self.mask = torch.zeros((len(input_ids), vocabulary + 1), dtype=torch.bool, device=input_ids.device)
            if self.prompt_mask is not None:
                new = new.masked_fill(self.prompt_mask.to(new.device) == 0, vocabulary)
        self.mask.scatter_(1, new.clamp(max=vocabulary), True)  # an id past the output layer's: the spare column
        self.read = input_ids.shape[1]
        return self.mask[:, :vocabulary]


class NoisyScores:
    """The logits processor of a keyed generate call: the filters (sampled_scores), then each row's Gumbel noise,
    made a block of positions at a time. `start`: the prompts' width (input_ids' columns before the first new
    token); `prompt_mask`: their real tokens (the repetition penalty leaves the padding out; None: all real)."""

    def __init__(self, keys: torch.Tensor, start: int, sampling: Sampling, prompt_mask: torch.Tensor | None = None):
        self.keys, self.start, self.sampling = keys, start, sampling
        self.seen = Seen(prompt_mask) if sampling.repetition_penalty != 1.0 else None
        self.block, self.first, self.count = torch.empty(0), 0, 0  # the noise of positions first ... first + count - 1

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        vocabulary = scores.shape[-1]
        seen = None if self.seen is None else self.seen(input_ids, vocabulary)
        scores = sampled_scores(scores, self.sampling, seen)
        return scores + self.noise_at(input_ids.shape[1] - self.start, vocabulary, scores.device)

    def noise_at(self, position: int, vocabulary: int, device: torch.device) -> torch.Tensor:
        """(rows, vocabulary): the position's noise, from the block that holds it (made when it is not there: the
        position and those after it, up to max_new_tokens, at most NOISE_BLOCK numbers)."""
        if not self.first <= position < self.first + self.count:
            count = max(1, NOISE_BLOCK // max(1, len(self.keys) * vocabulary))
            self.count = max(1, min(count, self.sampling.max_new_tokens - position))
            self.keys, self.first = self.keys.to(device), position
            self.block = noise(self.keys, range(position, position + self.count), vocabulary)
        return self.block[:, position - self.first]
