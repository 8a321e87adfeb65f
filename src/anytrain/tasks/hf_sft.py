"""sft: supervised fine-tuning of a transformers causal LM on chats or prompt/completion pairs (causal_lm/chats.py),
standing on the causal-LM base (causal_lm/task.py). The loss is on the answers' tokens only, the mean over every
answer token of the optimizer step's global batch (causal_lm/tokens.py: the fused output layer with
num_items_in_batch). Evaluation also generates
each held-out conversation's last answer from the turns before it (greedy, through the causal-LM base's generate,
stopping at the template's end-of-turn token): exact match of the stripped texts, and the first few in the log.
Tool-calling chats are scored the same way: the prompt holds the row's tools block and the turns before
the last answer (tool results included), and a last answer that calls tools is compared as the template renders it
(its text and its calls, e.g. Qwen's `<tool_call>` blocks), so a hit is the same calls, arguments in the same order.
`anytrain sample` puts the prompt in a user turn of the chat template and prints the reply."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from torch import nn

from ..best import HIGHER
from ..config import TrainConfig
from ..data.splits import Splits
from .causal_lm.answers import Answers
from .causal_lm.task import CausalLM
from .causal_lm.tokens import NextTokenLoss


class SupervisedFineTuning(NextTokenLoss, CausalLM):
    name = "sft"
    goals = {**NextTokenLoss.goals, "exact_match": HIGHER}
    headline = "exact_match"
    offers = frozenset({"export", "sample", "packing", "lora"})  # no predict: a chat run answers prompts

    @classmethod
    def detect(cls, source) -> str | None:
        """Chats in TRL's columns: a messages column, or prompt and completion columns."""
        from .causal_lm.chats import MESSAGES, chat_format

        if not source.readable:
            return None
        form = chat_format(source.train.column_names, source.train.features, source.cfg.data.text_column)
        if form == MESSAGES:
            return f"auto: a '{source.cfg.data.text_column or MESSAGES}' column of messages"
        return None if form is None else "auto: prompt and completion columns"

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.stops: list[int] = []  # the template's end-of-turn ids (load_data)
        self.answers: Answers | None = None  # generated answers: exact match, the log's examples (load_data)

    def load_data(self, given=None) -> Splits:
        from .causal_lm.chats import chat_splits

        self.load_tokenizer()
        self.data = chat_splits(self.cfg, self.tokenizer, given, self.run.pad_multiple)
        self.check_config()  # after the data: a row it refuses is said first
        self.stops = self.stops_for(self.data.metadata["chat_template"] == "yes")  # saved: what sample stops at
        self.answers = Answers(self.tokenizer, self.stops, self.run.main)
        return self.data

    def eval_batch(self, model: nn.Module, batch, forward: Callable) -> dict:
        """The answers' loss and accuracy (teacher-forced), then each row's last answer generated: exact match."""
        stats = super().eval_batch(model, batch, forward)
        inputs, targets = batch
        answers = cast(Answers, self.answers)
        stats["exact_match"] = answers.exact_match(model, inputs["input_ids"], targets, inputs["attention_mask"])
        return stats

    def metrics(self, sums: dict, count: int) -> dict:
        cast(Answers, self.answers).say_shown()
        return {**super().metrics(sums, count), "exact_match": sums["exact_match"].item() / count}
