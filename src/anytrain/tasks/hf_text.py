"""classify with a transformers model on text: AutoModelForSequenceClassification with num_labels,
id2label and label2id from the data, trained on the model's own loss (cross-entropy per text). The data is
tokenised by the model's tokenizer (data/hftext.py). The class stands on Transformers (tasks/transformers.py: the
model, its tokenizer, metadata, export, predict's inputs) and composes ClassIds (tasks/labelled.py: the data it
fits, the loss, metrics and predict's rows of every classifier over class ids, classify's and hf_image/'s too)."""

from __future__ import annotations

from ..hf import Head
from .labelled import ClassIds
from .transformers import Transformers


class HFClassification(ClassIds, Transformers):
    name = "classify"
    offers = frozenset({"export", "predict"})
    head = Head("AutoModelForSequenceClassification", "sequence-classification", labelled=True)
