"""tag: token classification (named entities, parts of speech) with a transformers model,
AutoModelForTokenClassification, on words tagged one label each (tasks/hf_tag/hftags.py). The loss is the
cross-entropy over the tagged sub-tokens (a word's first), token-weighted over the optimizer step
(transformers.TokenWeighted). Metrics: token accuracy, and entity-level precision, recall and F1 by
seqeval's definition (tasks/hf_tag/tagging.py) when the tags are IOB (B-PER, I-PER, O). `anytrain predict`
prints each word with its tag."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ...best import HIGHER
from ...data.splits import Splits
from ...hf import Head
from ...shape import IGNORE
from ...usermodel import logits_of
from ..transformers import TokenWeighted


class TokenClassification(TokenWeighted):
    name = "tag"
    goals = {**TokenWeighted.goals, "precision": HIGHER, "recall": HIGHER, "f1": HIGHER}
    headline = "f1"
    offers = frozenset({"export", "predict"})
    head = Head("AutoModelForTokenClassification", "token-classification", labelled=True)

    def load_data(self, given=None) -> Splits:
        from ... import hf
        from .hftags import tagged_splits

        self.tokenizer = hf.load_tokenizer(self.cfg)
        self.data = tagged_splits(self.cfg, self.tokenizer, given, self.run.pad_multiple)
        self.model_config = self.checked_config(self.tokenizer.pad_token_id)
        return self.data

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """The token statistics, and each sentence's entities: correct, predicted, true (summed into P/R/F1)."""
        from .tagging import entity_counts

        stats = super().per_sample(outputs, targets)
        names = self.data.class_names or []
        predicted, real = logits_of(outputs).argmax(-1).tolist(), (targets != IGNORE).tolist()
        counts = []
        for guess, truth, keep in zip(predicted, targets.tolist(), real):
            pairs = [(names[g], names[t]) for g, t, k in zip(guess, truth, keep) if k]
            counts.append(entity_counts([g for g, _ in pairs], [t for _, t in pairs]))
        found = torch.tensor(counts, dtype=torch.float64, device=targets.device).view(-1, 3)
        return {**stats, "entities_correct": found[:, 0], "entities_predicted": found[:, 1], "entities": found[:, 2]}

    def metrics(self, sums: dict, count: int) -> dict:
        from .tagging import prf

        scores = prf(*(int(sums[k].item()) for k in ("entities_correct", "entities_predicted", "entities")))
        return {**super().metrics(sums, count), **scores}

    def example_targets(self, shape, batch: int) -> torch.Tensor:
        return torch.zeros(batch, shape.max_length, dtype=torch.long)

    def predict_inputs(self, dataset: str, meta: dict, folder: Path) -> tuple:
        from ...hf import tokenizer_of_run
        from .hftags import predict_tagged

        column = meta["input_columns"][0]
        return predict_tagged(dataset, column, tokenizer_of_run(folder), meta["data_shape"].max_length)

    def predict_batch(self, model: nn.Module, inputs, meta: dict) -> list[dict]:
        from .hftags import word_tags

        inputs = dict(inputs)
        word_ids, words = inputs.pop("word_ids"), inputs.pop("words")
        return word_tags(model(**inputs).logits, word_ids, words, meta["class_names"])
