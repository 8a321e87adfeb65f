"""lm with a transformers model: AutoModelForCausalLM, one text per sequence, padded; padded positions
get the label -100. The loss (fused with the output layer: lmhead.py) is the mean over every target token
of the optimizer step's global batch, whatever the number of ranks or accumulation steps (the loop gives the
model the batch's share of them as num_items_in_batch); validation and test loss are the mean over every
target token of the split.
`anytrain sample` uses the model's generate; `anytrain predict` scores texts: each text's mean next-token loss,
its perplexity and the number of tokens it predicts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from ..best import HIGHER, LOWER
from ..hf import Head
from ..shape import IGNORE, DataShape
from ..usermodel import logits_of
from .transformers import Transformers, token_sums, with_row_loss


class HFCausalLM(Transformers):
    name = "lm"
    goals = {"loss": LOWER, "perplexity": LOWER, "accuracy": HIGHER}
    offers = frozenset({"export", "sample", "packing", "lora", "predict"})  # predict: each text's loss
    head = Head("AutoModelForCausalLM", "causal-LM", loss_type="ForCausalLM")
    step_shares = True  # the model's own loss: its sum over the batch's share of the step's target tokens

    @classmethod
    def detect(cls, source) -> str | None:
        return "auto: text without labels" if source.plain_text else None

    def texts(self) -> dict:
        from ..data.text import lm_column

        return {"column": lm_column(self.cfg), "whole": True}

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The next-token loss over the targets' mean (the model's own loss is this, given the labels)."""
        return self.loss_sum(outputs, targets) / (targets[:, 1:] != IGNORE).sum().clamp(min=1)

    def loss_sum(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The next-token loss summed over the targets: what the model's own loss is, given num_items_in_batch."""
        return token_sums(outputs[:, :-1].float(), targets[:, 1:])["token_loss"].sum()

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        sums = getattr(outputs, "row_stats", None)  # the fused loss's (lmhead.py): no logits were made
        if sums is None:  # position t predicts token t + 1
            sums = token_sums(logits_of(outputs)[:, :-1].float(), targets[:, 1:])
        return with_row_loss(sums)

    def metrics(self, sums: dict, count: int) -> dict:
        tokens = max(sums["tokens"].item(), 1)
        loss = sums["token_loss"].item() / tokens
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "accuracy": sums["hits"].item() / tokens}

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return shape.example_inputs(batch)

    def predict_inputs(self, dataset: str, meta: dict, folder: Path) -> tuple:
        """The run's text column, tokenised by its tokenizer as in training (truncated at --max-length), each
        batch padded at the end of its texts: a causal model's real tokens never attend to the padding after
        them, and keep the positions they have alone."""
        rows, ds, source = super().predict_inputs(dataset, meta, folder)
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
        """The prompt and what the model writes after it (the causal-LM core's generate: temperature, top-k, the seed
        the completion's key, stopping at the end-of-text token or an end id of the model's generation config). The
        prompt keeps its last tokens so that prompt and new tokens fit the model's positions."""
        from ..config import ConfigError
        from ..hf import max_positions, tokenizer_of_run
        from .causal_lm.generation import Sampling, completion_keys, generate, stop_ids

        tokenizer, tokens = tokenizer_of_run(folder), settings["tokens"]
        positions = max_positions(model.config) or tokens + 1
        if tokens >= positions:
            raise ConfigError(f"--tokens must be fewer than the model's {positions} positions")
        ids = tokenizer(prompt).input_ids[-(positions - tokens) :]
        stops = stop_ids(tokenizer, cast(Any, model).generation_config.eos_token_id, chats=False)
        sampling = Sampling(
            tokens, tuple(stops), tokenizer.pad_token_id, settings["temperature"], top_k=settings["top_k"]
        )
        key = completion_keys(settings["seed"], 0, 0, torch.tensor([0]), 1)
        done = generate(model.to(settings["device"]), [ids], key, sampling)
        return prompt + tokenizer.decode(done.completion_ids()[0])
