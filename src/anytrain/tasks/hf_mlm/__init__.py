"""mlm: masked language modelling with a transformers model (AutoModelForMaskedLM): domain adaptation
of a BERT-style model on your own text. Masks come from transformers' standard collator, seeded per
row and epoch (tasks/hf_mlm/hfmasked.py); the loss is the cross-entropy over the masked tokens, token-weighted
over the optimizer step (transformers.TokenWeighted); metrics: that loss, its perplexity and the
accuracy of the masked tokens. The adapted model is saved with save_pretrained in run_dir/hf."""

from __future__ import annotations

import math
from typing import cast

import torch

from ...best import HIGHER, LOWER
from ...data.splits import Splits
from ...hf import Head
from ...shape import DataShape
from ..transformers import TokenWeighted
from .hfmasked import MaskedRows, masked_splits


class MaskedLM(TokenWeighted):
    name = "mlm"
    goals = {"loss": LOWER, "perplexity": LOWER, "accuracy": HIGHER}
    hints = {"predict": "its run_dir/hf folder loads in transformers' fill-mask pipeline"}
    head = Head("AutoModelForMaskedLM", "masked-LM")

    def load_data(self, given=None) -> Splits:
        from ... import hf

        self.tokenizer = hf.load_tokenizer(self.cfg)
        self.data = masked_splits(self.cfg, self.tokenizer, given)
        self.model_config = self.checked_config(self.tokenizer.pad_token_id)
        return self.data

    def step_counts(self, epoch: int):
        return cast(MaskedRows, self.data.train).masked_per_row(epoch)  # a new draw each epoch

    def metrics(self, sums: dict, count: int) -> dict:
        values = super().metrics(sums, count)
        return {"loss": values["loss"], "perplexity": math.exp(min(values["loss"], 700.0)), **values}

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return shape.example_inputs(batch)
