"""grpo's data: prompts in TRL's form, a `prompt` column of text or of chats (lists of {"role", "content"}
messages, rendered by the model's chat template with its generation prompt), every other column kept for the
reward functions (an `answer`, a test, a format). No completions: the model writes them.

The training split is read as rollout slots (`RolloutSlots`): the loader draws, in order, one batch of slots per
process and micro-step, and each names the prompts of its rollout (--batch-size prompts per process, shuffled by
seed and epoch), which micro-batch of the optimizer step it is and which of the --grpo-iterations. An epoch is
every prompt once; the last rollout is filled from the epoch's first prompts, so every step has its full batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...config import ConfigError, TrainConfig
from ...data.sources import carve_rows, opened
from ...data.splits import Rows
from ..causal_lm.prompts import prompt_ids

PROMPT = "prompt"
ANSWERED = ("completion", "chosen", "rejected", "messages")  # columns of data that already holds answers


def is_prompts(columns: list[str]) -> bool:
    return PROMPT in columns and not any(c in columns for c in ANSWERED)


@dataclass(frozen=True)
class Prompts:
    """An evaluation batch: the split and its rows."""

    split: str
    rows: list[int]

    def to(self, *args, **kwargs) -> Prompts:  # accelerate moves a batch to the device: nothing here to move
        return self


class PromptRows(Rows):
    """Tokenised prompts, each as the model reads it, with the prompt as given and the row's other columns. A batch
    is Prompts (evaluation's: it generates from them)."""

    def __init__(self, ids: list[list[int]], prompts: list, columns: dict[str, list], split: str):
        self.ids, self.prompts, self.columns, self.split = ids, prompts, columns, split

    def __len__(self) -> int:
        return len(self.ids)

    def __getitems__(self, indices: list[int]):
        return Prompts(self.split, list(indices))

    def __getitem__(self, index: int):
        return self.__getitems__([index])


@dataclass(frozen=True)
class Slot:
    """One micro-step of a rollout on one process: the prompts (rows of the split), their epoch, the rollout and which
    of the --grpo-iterations (which micro-batch of its optimizer step it is, the loop says: ctx.micro)."""

    rows: list[int]
    epoch: int
    rollout: int
    iteration: int

    def to(self, *args, **kwargs) -> Slot:  # accelerate moves a batch to the device: nothing here to move
        return self


class RolloutSlots(Rows):
    """The training prompts as the loader's slots (module docstring). Unshuffled by the loader: the order is the
    rollouts'; the prompts are shuffled here, a function of seed and epoch, the same on every process."""

    shuffled = False

    def __init__(self, prompts: PromptRows, cfg: TrainConfig, processes: int):
        o = cfg.section("grpo")
        self.prompts, self.seed = prompts, cfg.run.seed
        self.batch, self.processes = cfg.optim.batch_size, processes
        self.micro, self.iterations = cfg.optim.grad_accum_steps, o.grpo_iterations
        self.rollouts = math.ceil(len(prompts) / (self.batch * processes))  # per epoch
        self.epoch = 0
        self.order = np.arange(len(prompts))

    def __len__(self) -> int:
        return self.rollouts * self.iterations * self.micro * self.processes * self.batch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.order = np.random.default_rng([self.seed, epoch]).permutation(len(self.prompts))

    def __getitems__(self, indices: list[int]):
        k = indices[0] // self.batch  # the loader's batch: process k % P at micro-step k // P
        step, process = divmod(k, self.processes)
        rollout, within = divmod(step, self.iterations * self.micro)
        iteration = within // self.micro
        start = (rollout * self.processes + process) * self.batch
        rows = [int(self.order[(start + q) % len(self.order)]) for q in range(self.batch)]
        return Slot(rows, self.epoch, rollout, iteration)

    def __getitem__(self, index: int):
        return self.__getitems__([index])

    @property
    def ids(self) -> list[list[int]]:
        return self.prompts.ids


def prompt_rows(ds, tokenizer, source: str, split: str, room: tuple[int, str], tools: list | None) -> PromptRows:
    """A split's prompts tokenised as generation reads them (a chat's special tokens are the template's; `tools`
    the tools' schemas it shows), each whole: a prompt longer than `room` (the most tokens a prompt may have, and
    why) is refused, naming the longest."""
    ids, prompts = [], []
    for index, row in enumerate(ds):
        where = f"--dataset: row {index} of the {split} split of {source}"
        ids.append(prompt_ids(tokenizer, row[PROMPT], where, tools))
        prompts.append(row[PROMPT])
    longest = max(range(len(ids)), key=lambda k: len(ids[k]), default=None)
    if longest is not None and len(ids[longest]) > room[0]:
        raise ConfigError(
            f"--dataset: row {longest} of the {split} split of {source} has a prompt of {len(ids[longest])} tokens, "
            f"more than the {room[0]} a prompt may have ({room[1]}); prompts are never cut"
        )
    columns = {name: list(ds[name]) for name in ds.column_names if name != PROMPT}
    return PromptRows(ids, prompts, columns, split)


def load_prompts(
    cfg: TrainConfig, tokenizer, given, room: tuple[int, str], tools: list | None = None
) -> tuple[dict[str, PromptRows], str, bool]:
    """({split: PromptRows}, source, whether the prompts are chats): read, checked, carved, tokenised (chats shown
    `tools`, their schemas; tools need chats)."""
    splits, source = opened(cfg, given)
    train = splits["train"]
    if PROMPT not in train.column_names:
        raise ConfigError(
            f"--task grpo: {source} has no '{PROMPT}' column (columns: {', '.join(train.column_names)}): grpo "
            "answers prompts, scored by --reward"
        )
    chats = isinstance(train[0][PROMPT], list)
    if chats and not tokenizer.chat_template:
        raise ConfigError(
            f"--model {cfg.model.name}: its tokenizer has no chat template, which chat prompts (lists of messages) need"
        )
    if tools and not chats:
        raise ConfigError(
            f"--tools: the prompts of {source} are text; tools need chat prompts (lists of messages), which the "
            "chat template shows the tools with"
        )
    carved = carve_rows(splits, cfg, source)
    rows = {name: prompt_rows(ds, tokenizer, source, name, room, tools) for name, ds in carved.items()}
    return rows, source, chats
