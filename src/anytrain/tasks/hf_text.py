"""classify with a transformers model on text: AutoModelForSequenceClassification with num_labels,
id2label and label2id from the data, trained on the model's own loss (cross-entropy per text)."""

from __future__ import annotations

from ..hf import Head
from .classify import Classification
from .transformers import Transformers


class HFClassification(Transformers, Classification):
    """The data is tokenised by the model's tokenizer (data/hftext.py); metrics and predictions are classify's."""

    offers = frozenset({"export", "predict"})
    head = Head("AutoModelForSequenceClassification", "sequence-classification", labelled=True)
