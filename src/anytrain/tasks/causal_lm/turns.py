"""Completions with tools (grpo's and distill's --tools, --environment): a completion is a conversation of turns. The
model answers; transformers' response parsing reads its turn (tasks/causal_lm/tools.py); each tool call is run
(a timeout, an error answered, as TRL's GRPOTrainer) and the tools' messages, rendered by the chat template, are
appended as tokens, never re-tokenising what came before; the model goes on from there, until a turn without a call,
its --max-new-tokens of its own tokens, the model's positions, or a turn that calls once --max-tool-calls are made.

The completion is every token after the prompt; only the model's own are trained on (`Completions.completion`), the
tools' are read but never learned nor counted. Each turn's sampling is keyed (tasks/causal_lm/sampler.py): the
first turn by the completion's key, as without tools, each later one by a key of (that key, the turn), so a
completion is the same on any rank, batch or resumed run as long as its tools answer the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from .generation import Completions, PromptCache, Sampling, fitting, generate, positions_of
from .sampler import MASK32, mix32
from .tools import parse_turn, run_call, tool_suffix


@dataclass(frozen=True)
class Toolkit:
    """What every conversation of a run shares: the tokenizer, where a turn stops, the limits."""

    tokenizer: object
    stops: list[int]
    positions: int  # the model's
    max_calls: int
    timeout: float
    chunk: int = 0  # completions generated together (--generate-batch; 0: as many as fit, generation.fitting)


@dataclass
class Conversation:
    """One completion: its prompt's ids, its tools (name -> function; `schemas` as the template renders them), its
    environment; then the tokens after the prompt, which of them are the model's, and its messages (the model's
    turns parsed, the tools' answers), as TRL gives a conversational completion to the reward functions."""

    prefix: list[int]
    tools: dict[str, Callable]
    schemas: list[dict]
    environment: object | None = None
    ids: list[int] = field(default_factory=list)
    learned: list[bool] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    own: int = 0  # the model's tokens
    calls: int = 0
    failed: int = 0
    turns: int = 0
    malformed: int = 0
    waited: float = 0.0  # seconds in its tools
    truncated: bool = False
    open: bool = True

    def take(self, turn: list[int], stopped: bool, kit: Toolkit, room: int) -> None:
        """The model's turn (ending at a stop token when `stopped`), then its calls answered, or the end; `room`:
        the tokens the model may still write (none: its calls are not run)."""
        context = self.prefix + self.ids
        self.ids, self.learned = self.ids + turn, self.learned + [True] * len(turn)
        self.own, self.turns = self.own + len(turn), self.turns + 1
        message, bad = parse_turn(kit.tokenizer, turn, context, turn[-1] if stopped and turn else None, self.schemas)
        self.messages.append(message)
        self.malformed += bad
        calls = message.get("tool_calls") or []
        self.truncated = not stopped
        if not stopped or not calls or self.calls >= kit.max_calls or room < 1:
            self.open = False
            return
        answers, started = [], time.perf_counter()
        for call in calls:
            answer, failed = run_call(self.tools, call, kit.timeout)
            answers.append(answer)
            self.calls, self.failed = self.calls + 1, self.failed + failed
        self.waited += time.perf_counter() - started
        suffix = tool_suffix(kit.tokenizer, answers, kit.stops, self.schemas)
        if len(self.prefix) + len(self.ids) + len(suffix) >= kit.positions:  # no room to answer: it ends here
            self.open = False
            return
        self.ids, self.learned = self.ids + suffix, self.learned + [False] * len(suffix)
        self.messages += answers


def turn_keys(keys: torch.Tensor, turn: int) -> torch.Tensor:
    """The sampling keys of a turn: the completions' own at the first, then a function of (key, turn)."""
    return keys if turn == 0 else mix32(keys ^ ((turn * 0x9E3779B1) & MASK32))


def converse(
    model: nn.Module,
    talks: list[Conversation],
    keys: torch.Tensor | None,
    sampling: Sampling,
    kit: Toolkit,
    shared: PromptCache | None = None,
) -> Completions:
    """Every conversation taken turn by turn to its end (module docstring); the open ones generate together (with
    `shared`, a prompt that follows itself read once: generate's)."""
    turn = 0
    while active := [k for k, talk in enumerate(talks) if talk.open]:
        budgets = [min(sampling.max_new_tokens - talks[k].own, kit.positions - len(talks[k].prefix + talks[k].ids))
                   for k in active]  # fmt: skip
        these = None if keys is None else turn_keys(keys[torch.tensor(active)], turn)
        prompts, turned = (
            [talks[k].prefix + talks[k].ids for k in active],
            replace(sampling, max_new_tokens=max(budgets)),
        )
        done = generate(model, prompts, these, turned, kit.chunk or fitting(model, prompts, turned), shared)
        for j, k in enumerate(active):
            ids = done.ids[j, done.width :][done.completion[j]].tolist()
            stopped = not bool(done.truncated[j]) and len(ids) <= budgets[j]
            talks[k].take(ids[: budgets[j]], stopped, kit, budgets[j] - len(ids))
        turn += 1
    return assembled(talks, sampling.pad, next(model.parameters()).device)


def assembled(talks: list[Conversation], pad: int, device: torch.device) -> Completions:
    """The conversations as Completions: prompts padded on the left, what follows on the right; `completion` the
    model's own tokens."""
    width, length = max(len(t.prefix) for t in talks), max(1, max(len(t.ids) for t in talks))
    ids = torch.full((len(talks), width + length), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    learned = torch.zeros((len(talks), length), dtype=torch.bool)
    for k, talk in enumerate(talks):
        start, end = width - len(talk.prefix), width + len(talk.ids)
        ids[k, start:end] = torch.tensor(talk.prefix + talk.ids, dtype=torch.long)
        mask[k, start:end] = 1
        learned[k, : len(talk.ids)] = torch.tensor(talk.learned, dtype=torch.bool)
    truncated = torch.tensor([t.truncated for t in talks], dtype=torch.bool)
    return Completions(ids, mask, positions_of(mask), learned, truncated, width).to(device)


def counts(talks: list[Conversation]) -> torch.Tensor:
    """(5,) float64 sums for the log: tool calls, failed calls, model turns, completions that called, malformed
    turns."""
    return torch.tensor(
        [sum(t.calls for t in talks), sum(t.failed for t in talks), sum(t.turns for t in talks),
         sum(t.calls > 0 for t in talks), sum(t.malformed for t in talks)], dtype=torch.float64,
    )  # fmt: skip
