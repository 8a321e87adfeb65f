"""lm with a transformers model: AutoModelForCausalLM on text, one text per sequence, padded; padded positions
get the label -100. It stands on the causal-LM base (causal_lm/task.py: the model, its fused output layer, export)
with the next-token loss (causal_lm/tokens.py). `anytrain sample` continues the prompt's text with the model's
generate; `anytrain predict` scores texts: each text's mean next-token loss, its perplexity and the number of tokens
it predicts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from ..data.splits import Splits
from ..shape import IGNORE
from ..usermodel import logits_of
from .causal_lm.task import CausalLM
from .causal_lm.tokens import NextTokenLoss
from .transformers import token_sums


class HFCausalLM(NextTokenLoss, CausalLM):
    name = "lm"
    offers = frozenset({"export", "sample", "packing", "lora", "predict"})  # predict: each text's loss
    hints = {}

    @classmethod
    def detect(cls, source) -> str | None:
        return "auto: text without labels" if source.plain_text else None

    def load_data(self, given=None) -> Splits:
        """The text column (--text-column, else the data's one text column), each text whole, padded per batch."""
        from ..data.hftext import load_hf_splits
        from ..data.text import lm_column

        self.load_tokenizer()
        column = lm_column(self.cfg)
        self.data = load_hf_splits(self.cfg, self.tokenizer, given, column=column, whole=True,
                                   multiple=self.run.pad_multiple)  # fmt: skip
        self.check_config()
        return self.data

    def predict_inputs(self, dataset: str, meta: dict, folder: Path) -> tuple:
        """The run's text column, tokenised by its tokenizer as in training (truncated at --max-length), each
        batch padded at the end of its texts: a causal model's real tokens never attend to the padding after
        them, and keep the positions they have alone."""
        from ..data.hftext import predict_hf_texts
        from ..hf import tokenizer_of_run

        tokenizer = tokenizer_of_run(folder)
        rows, ds, source = predict_hf_texts(dataset, meta["input_columns"], tokenizer, meta["data_shape"].max_length)
        rows.tokenizer.padding_side = "right"
        return rows, ds, source

    def predict_batch(self, model: nn.Module, inputs, meta: dict) -> list[dict]:
        """Each text scored by the model: `loss`, the mean next-token cross-entropy over the tokens it predicts
        (every token of the text but its first), `perplexity` (exp of it) and `tokens` (how many). A text of one
        token predicts none: its loss and perplexity are null."""
        device = next(model.parameters()).device
        ids, mask = inputs["input_ids"].to(device), inputs["attention_mask"].to(device)
        outputs = model(input_ids=ids, attention_mask=mask, use_cache=False)
        sums = token_sums(logits_of(outputs)[:, :-1].float(), ids.masked_fill(mask == 0, IGNORE)[:, 1:])
        rows = []
        for total, tokens in zip(sums["token_loss"].tolist(), sums["tokens"].tolist()):
            loss = total / tokens if tokens else None
            perplexity = None if loss is None else math.exp(min(loss, 700.0))
            rows.append({"loss": loss, "perplexity": perplexity, "tokens": tokens})
        return rows

    def sample(self, model: nn.Module, folder: Path, meta: dict, prompt: str, settings: dict) -> str:
        """The prompt and what the model writes after it (the causal-LM base's generate: temperature, top-p, top-k,
        min-p, repetition penalty, the seed the completion's key, stopping at the end-of-text token or an end id of
        the model's generation config). The prompt keeps its last tokens so that prompt and new tokens fit the
        model's positions."""
        from ..config import ConfigError
        from ..hf import max_positions, tokenizer_of_run
        from .causal_lm.generation import Sampling, completion_keys, filters_of, generate, stop_ids

        tokenizer, tokens = tokenizer_of_run(folder), settings["tokens"]
        positions = max_positions(model.config) or tokens + 1
        if tokens >= positions:
            raise ConfigError(f"--tokens must be fewer than the model's {positions} positions")
        ids = tokenizer(prompt).input_ids[-(positions - tokens) :]
        stops = stop_ids(tokenizer, cast(Any, model).generation_config.eos_token_id, chats=False)
        sampling = Sampling(tokens, tuple(stops), tokenizer.pad_token_id, **filters_of(settings))
        key = completion_keys(settings["seed"], 0, 0, torch.tensor([0]), 1)
        done = generate(model.to(settings["device"]), [ids], key, sampling)
        return prompt + tokenizer.decode(done.completion_ids()[0])
