"""classify with a transformers model on text: AutoModelForSequenceClassification with num_labels,
id2label and label2id from the data, trained on the model's own loss (cross-entropy per text). The data is
tokenised by the model's tokenizer (data/hftext.py); the loss, metrics and predictions are classify's functions
(tasks/classify.py), composed rather than inherited: a transformers task stands on Transformers alone."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..best import HIGHER, LOWER
from ..hf import Head
from ..shape import DataShape
from .base import means, per_position, predicted_logits
from .classify import class_predictions
from .transformers import Transformers


class HFClassification(Transformers):
    name = "classify"
    goals = {"loss": LOWER, "accuracy": HIGHER}
    headline = "accuracy"
    labelled = True
    offers = frozenset({"export", "predict"})
    head = Head("AutoModelForSequenceClassification", "sequence-classification", labelled=True)

    @classmethod
    def detect(cls, source) -> str | None:
        return "auto"  # labels of class ids or names, as classify's

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets)

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        return per_position(outputs, targets)

    def metrics(self, sums: dict, count: int) -> dict:
        return means(sums, count)

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return torch.zeros(batch, dtype=torch.long)

    def predict_batch(self, model: nn.Module, inputs, meta: dict) -> list[dict]:
        return class_predictions(predicted_logits(model, inputs), meta)
