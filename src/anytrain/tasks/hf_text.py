"""classify with a transformers model on text: AutoModelForSequenceClassification with num_labels,
id2label and label2id from the data, trained on the model's own loss (cross-entropy per text). The data is
tokenised by the model's tokenizer (data/hftext.py); the loss, metrics and predictions are classify's (ClassIds,
tasks/classify.py), composed rather than inherited: a transformers task stands on Transformers alone."""

from __future__ import annotations

from torch import nn

from ..hf import Head
from .base import predicted_logits
from .classify import ClassIds
from .transformers import Transformers


class HFClassification(ClassIds, Transformers):
    name = "classify"
    labelled = True
    offers = frozenset({"export", "predict"})
    head = Head("AutoModelForSequenceClassification", "sequence-classification", labelled=True)

    @classmethod
    def detect(cls, source) -> str | None:
        return "auto"  # labels of class ids or names, as classify's

    def predict_batch(self, model: nn.Module, inputs, meta: dict) -> list[dict]:
        return self.predictions(predicted_logits(model, inputs), meta)
