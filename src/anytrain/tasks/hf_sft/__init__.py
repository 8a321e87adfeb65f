"""sft: supervised fine-tuning of a transformers causal LM on chats or prompt/completion pairs (tasks/hf_sft/chats.py).
The loss is on the answers' tokens only, the mean over every answer token of the optimizer step's global
batch (hf:lm's token weighting: the fused loss of lmhead.py with num_items_in_batch). Evaluation also generates
each held-out conversation's last answer from the turns before it (greedy, through the causal-LM core's generate,
stopping at the template's end-of-turn token): exact match of the stripped texts, and the first few in the log.
Tool-calling chats are scored the same way: the prompt holds the row's tools block and the turns before
the last answer (tool results included), and a last answer that calls tools is compared as the template renders it
(its text and its calls, e.g. Qwen's `<tool_call>` blocks), so a hit is the same calls, arguments in the same order.
`anytrain sample` puts the prompt in a user turn of the chat template and prints the reply."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from torch import nn

from ...best import HIGHER
from ...config import TrainConfig
from ...data.splits import Splits
from ..causal_lm.answers import Answers
from ..causal_lm.generation import model_eos, stop_ids
from ..hf_lm import HFCausalLM


class SupervisedFineTuning(HFCausalLM):
    name = "sft"
    goals = {**HFCausalLM.goals, "exact_match": HIGHER}
    headline = "exact_match"
    offers = HFCausalLM.offers - {"predict"}  # hf:lm scores texts; a chat run answers prompts instead

    hints = {"predict": "it answers prompts with `anytrain sample RUN --prompt ...`"}

    @classmethod
    def detect(cls, source) -> str | None:
        """Chats in TRL's columns: a messages column, or prompt and completion columns."""
        from .chats import MESSAGES, chat_format

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
        from ... import hf
        from .chats import chat_splits

        self.tokenizer = hf.load_tokenizer(self.cfg)
        self.data = chat_splits(self.cfg, self.tokenizer, given, self.run.pad_multiple)
        self.model_config = self.checked_config(self.tokenizer.pad_token_id)
        chats = self.data.metadata["chat_template"] == "yes"
        self.stops = stop_ids(self.tokenizer, model_eos(self.cfg, self.model_config), chats)
        self.data.metadata["stop_ids"] = self.stops  # saved with the weights: what `anytrain sample` stops at
        self.answers = Answers(self.tokenizer, self.stops, self.run.main)
        return self.data

    def eval_batch(self, model: nn.Module, inputs, targets: torch.Tensor, forward: Callable) -> dict:
        """The answers' loss and accuracy (teacher-forced), then each row's last answer generated: exact match."""
        stats = super().eval_batch(model, inputs, targets, forward)
        answers = cast(Answers, self.answers)
        stats["exact_match"] = answers.exact_match(model, inputs["input_ids"], targets, inputs["attention_mask"])
        return stats

    def metrics(self, sums: dict, count: int) -> dict:
        cast(Answers, self.answers).say_shown()
        return {**super().metrics(sums, count), "exact_match": sums["exact_match"].item() / count}

    def weights_metadata(self) -> dict:
        return {**super().weights_metadata(), **self.data.metadata}

    def sample(self, model: nn.Module, folder: Path, meta: dict, prompt: str, settings: dict) -> str:
        """The reply to the prompt, in a user turn of the chat template (as it is for prompt/completion text)."""
        return Answers.sample(model, folder, meta, prompt, settings)
