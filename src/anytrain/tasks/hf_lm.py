"""lm with a transformers model: AutoModelForCausalLM, one text per sequence, padded; padded positions
get the label -100. The loss (fused with the output layer: lmhead.py) is the mean over every target token
of the optimizer step's global batch, whatever the number of ranks or accumulation steps
(transformers.token_weighted); validation and test loss are the mean over every target token of the split.
`anytrain sample` uses the model's generate."""

from __future__ import annotations

import math
from pathlib import Path
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F

from ..hf import Head
from ..shape import DataShape
from ..usermodel import logits_of
from .lm import LanguageModel
from .transformers import TargetRows, Transformers, token_weighted


class HFCausalLM(Transformers, LanguageModel):
    head = Head("AutoModelForCausalLM", "causal-LM", loss_type="ForCausalLM")

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        stats = getattr(outputs, "row_stats", None)  # the fused loss's (lmhead.py): no logits were made
        if stats is not None:
            return {"loss": stats["token_loss"] / stats["tokens"].clamp(min=1), **stats}
        logits, labels = logits_of(outputs)[:, :-1].float(), targets[:, 1:]  # position t predicts token t + 1
        losses = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
        real = labels != -100
        hits = (logits.argmax(-1) == labels) & real
        tokens = real.sum(1)
        sums = losses.sum(1)
        return {"loss": sums / tokens.clamp(min=1), "token_loss": sums, "tokens": tokens, "hits": hits.sum(1)}

    def metrics(self, sums: dict, count: int) -> dict:
        tokens = max(sums["tokens"].item(), 1)
        loss = sums["token_loss"].item() / tokens
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "accuracy": sums["hits"].item() / tokens}

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return shape.example_inputs(batch)

    def train_batches(self, batches, loader, epoch: int, skipped: int):
        per_row = cast(TargetRows, self.data.train).targets_per_row  # every token of a text but its first
        return token_weighted(batches, loader, epoch, skipped, per_row, self.cfg.optim.grad_accum_steps)

    def sample(self, model: nn.Module, folder: Path, meta: dict, prompt: str, settings: dict) -> str:
        from ..hf import generate

        keys = ("tokens", "temperature", "top_k", "seed", "device")
        return generate(model, folder, prompt, *(settings[k] for k in keys))
