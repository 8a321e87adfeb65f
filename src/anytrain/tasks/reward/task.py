"""reward: a transformers sequence classifier with one output, trained on preference pairs (tasks/dpo/pairs.py,
the same formats as dpo) with the Bradley-Terry loss, -log σ(r_chosen - r_rejected), the mean over the pairs of
the optimizer step on any number of ranks and accumulation steps. Each batch of B pairs is one forward pass over
its 2B sequences. The metric is pairwise accuracy (the chosen answer scored above the rejected one), with the mean
margin. It exports a folder AutoModelForSequenceClassification loads (num_labels 1); `anytrain predict RUN
--dataset FILE` scores each text of the file's `text` column (a prompt followed by its answer, as trained)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from ...best import HIGHER, LOWER
from ...data.splits import Splits
from ...hf import Head
from ...shape import DataShape
from ...usermodel import logits_of
from ..transformers import Transformers


class RewardModel(Transformers):
    name = "reward"
    goals = {"loss": LOWER, "accuracy": HIGHER, "margin": HIGHER}
    headline = "accuracy"
    offers = frozenset({"export", "predict", "lora"})
    head = Head("AutoModelForSequenceClassification", "sequence-classification", labelled=True)
    targets_to_model = False  # the loss is the pairs'; the model is given the texts only
    step_shares = True  # the loss: loss_sum over the batch's share of its step's pairs (ctx.share)

    def load_data(self, given=None) -> Splits:
        from ..dpo.task import load_pairs

        rows, _ = load_pairs(self, given)
        for split in rows.values():
            split.answers_in_inputs = False  # a classifier reads the texts only
        self.data.input_columns = ["text"]
        return self.data

    def checked_config(self, pad_id: int | None):
        from ... import hf

        config = hf.model_config(self.cfg, self.head, self.name, pad_id, ["reward"])  # one output: the score
        hf.check_vocabulary(self.cfg, self.tokenizer, config)
        return config

    def margins(self, outputs, targets: torch.Tensor) -> torch.Tensor:
        """r_chosen - r_rejected per pair, from the scores of the batch's 2B sequences (the chosen first)."""
        scores = logits_of(outputs).float()[:, 0]
        b = len(targets)
        return scores[:b] - scores[b : 2 * b]

    def loss_sum(self, outputs, targets: torch.Tensor) -> torch.Tensor:
        return -F.logsigmoid(self.margins(outputs, targets)).sum()

    def loss(self, outputs, targets: torch.Tensor) -> torch.Tensor:
        return self.loss_sum(outputs, targets) / len(targets)

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        margin = self.margins(outputs, targets)
        return {"loss": -F.logsigmoid(margin), "accuracy": (margin > 0).double(), "margin": margin}

    def metrics(self, sums: dict, count: int) -> dict:
        return {k: v.item() / count for k, v in sums.items()}

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return torch.zeros(batch // 2, 2)

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
