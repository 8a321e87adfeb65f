"""Prompts for a causal LM to answer (grpo's and distill's data), in TRL's form: a `prompt` column of text or of chats
(lists of {"role", "content"} messages, rendered by the model's chat template with its generation prompt), every
other column kept (for grpo's reward functions: an `answer`, a test, a format). No completions: the model writes
them. Each split's prompts are tokenised whole, as generation reads them; a prompt longer than the room left for
the completion is refused, never cut. An evaluation batch is `Prompts`: the split and its rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import ConfigError, TrainConfig
from ...data.sources import carve_rows, opened
from ...data.splits import Rows
from .prompts import prompt_ids

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
            f"--task {cfg.data.task}: {source} has no '{PROMPT}' column (columns: {', '.join(train.column_names)}): "
            f"{cfg.data.task} trains on the model's answers to prompts"
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
