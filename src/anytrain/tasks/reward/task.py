"""reward: a transformers sequence classifier with one output, trained on preference pairs (causal_lm/pairs.py,
the same formats as dpo) with the Bradley-Terry loss, -log σ(r_chosen - r_rejected), the mean over the pairs of
the optimizer step on any number of ranks and accumulation steps. Each batch of B pairs is one forward pass over
its 2B sequences. The metric is pairwise accuracy (the chosen answer scored above the rejected one), with the mean
margin. It exports a folder AutoModelForSequenceClassification loads (num_labels 1); `anytrain predict RUN
--dataset FILE` scores each text of the file's `text` column (a prompt followed by its answer, as trained)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F

from ...best import HIGHER, LOWER
from ...data.splits import Splits
from ...hf import Head
from ...usermodel import logits_of
from ..causal_lm.pairs import PairBatch
from ..contract import RunContext
from ..transformers import Transformers


class RewardModel(Transformers):
    name = "reward"
    goals = {"loss": LOWER, "accuracy": HIGHER, "margin": HIGHER}
    headline = "accuracy"
    offers = frozenset({"export", "predict", "lora"})
    head = Head("AutoModelForSequenceClassification", "sequence-classification", labelled=True)
    targets_to_model = False  # the loss is the pairs'; the model is given the texts only
    step_shares = True  # the loss: loss_sum over the batch's share of its step's pairs (ctx.share)

    def train_step(self, ctx: RunContext, batch: PairBatch) -> torch.Tensor:
        """The batch's 2B sequences scored in one forward pass; the loss over the batch's share of the step's pairs."""
        return ctx.loss(ctx.forward(batch.inputs), cast(Any, batch))  # the criterion hands it to loss_sum

    def eval_batch(self, model: nn.Module, batch: PairBatch, forward: Callable) -> dict:
        return self.per_sample(forward(model, batch.inputs, None), batch)

    def batch_counts(self, batch: PairBatch) -> tuple[int, int]:
        return batch.counts()

    def load_data(self, given=None) -> Splits:
        from ... import hf
        from ..causal_lm.pairs import pair_splits

        self.tokenizer = hf.load_tokenizer(self.cfg)
        self.model_config = self.checked_config(self.tokenizer.pad_token_id)
        self.data, _ = pair_splits(self.cfg, self.tokenizer, given, self.run.pad_multiple)
        for split in (self.data.train, self.data.validation, self.data.test):
            if split is not None:
                split.answers_in_inputs = False  # type: ignore[attr-defined]  # a classifier reads the texts only
        self.data.input_columns = ["text"]
        return self.data

    def checked_config(self, pad_id: int | None):
        """One output: the score."""
        from ..transformers import checked_config

        return checked_config(self.cfg, self.head, self.name, pad_id, self.tokenizer, ["reward"])

    def margins(self, outputs, pairs: PairBatch) -> torch.Tensor:
        """r_chosen - r_rejected per pair, from the scores of the batch's 2B sequences (the chosen first)."""
        scores = logits_of(outputs).float()[:, 0]
        b = len(pairs)
        return scores[:b] - scores[b : 2 * b]

    def loss_sum(self, outputs, targets: PairBatch) -> torch.Tensor:  # type: ignore[override]  # the pairs
        return -F.logsigmoid(self.margins(outputs, targets)).sum()

    def loss(self, outputs, targets: PairBatch) -> torch.Tensor:  # type: ignore[override]
        return self.loss_sum(outputs, targets) / len(targets)

    def per_sample(self, outputs, targets: PairBatch) -> dict[str, torch.Tensor]:  # type: ignore[override]
        margin = self.margins(outputs, targets)
        return {"loss": -F.logsigmoid(margin), "accuracy": (margin > 0).double(), "margin": margin}

    def metrics(self, sums: dict, count: int) -> dict:
        return {k: v.item() / count for k, v in sums.items()}

    def weights_metadata(self) -> dict:
        return {**super().weights_metadata(), "input_columns": ["text"]}

    def predict_inputs(self, dataset: str, meta: dict, folder: Path) -> tuple:
        rows, ds, source = super().predict_inputs(dataset, meta, folder)
        rows.tokenizer.padding_side = "right"
        return rows, ds, source

    def predict_batch(self, model: nn.Module, inputs, meta: dict) -> list[dict]:
        """Each text's reward (the model's one output)."""
        device = next(model.parameters()).device
        scores = model(**{k: v.to(device) for k, v in inputs.items()}).logits.float()[:, 0]
        return [{"reward": score} for score in scores.tolist()]
