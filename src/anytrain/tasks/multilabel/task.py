"""multilabel: each sample holds any number of the classes (a label column of lists of ids or names);
targets are multi-hot rows (batch, classes); logits (batch, classes); BCE with logits; micro and macro F1
and exact match at --threshold (saved with the weights); predict prints the labels above it."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ...best import HIGHER, LOWER
from ...config import ConfigError, TrainConfig
from ...data.targets import LISTS
from ...shape import DataShape
from ...usermodel import logits_of
from ..labelled import Labelled, tables_only


class MultiLabel(Labelled):
    name = "multilabel"
    goals = {"loss": LOWER, "micro_f1": HIGHER, "macro_f1": HIGHER, "exact_match": HIGHER}
    headline = "micro_f1"
    label_form = LISTS

    @classmethod
    def check_settled(cls, cfg: TrainConfig, reason: str) -> None:
        if cfg.data.text_column and reason.startswith("auto"):
            raise ConfigError(
                f"--label-column: '{cfg.data.label_column}' holds lists (several labels a row); text (--text-column) "
                "is classified one label a text here: give one label per row, or use a table of numbers for "
                "multi-label"
            )
        tables_only(cfg, cls.name)

    def threshold(self) -> float:
        return self.cfg.section("multilabel").threshold

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs.float(), targets)

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = logits_of(outputs).float()
        losses = F.binary_cross_entropy_with_logits(logits, targets, reduction="none").mean(1)
        predicted, actual = (logits.sigmoid() > self.threshold()).float(), targets
        hits = predicted * actual
        exact = (predicted == actual).all(1).float()
        return {"loss": losses, "tp": hits, "fp": predicted - hits, "fn": actual - hits, "exact_match": exact}

    def metrics(self, sums: dict, count: int) -> dict:
        tp, fp, fn = sums["tp"], sums["fp"], sums["fn"]
        per_class = 2 * tp / (2 * tp + fp + fn).clamp_min(1e-300)  # 0 for a class never present nor predicted
        return {
            "loss": sums["loss"].item() / count,
            "micro_f1": (2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum()).clamp_min(1e-300)).item(),
            "macro_f1": per_class.mean().item(),
            "exact_match": sums["exact_match"].item() / count,
        }

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return torch.zeros(batch, shape.num_classes)

    def weights_metadata(self) -> dict:
        return {**super().weights_metadata(), "threshold": self.threshold()}

    def predictions(self, outputs: torch.Tensor, meta: dict) -> list[dict]:
        names = meta.get("class_names")
        threshold = meta.get("threshold", 0.5)
        rows = []
        for probs in outputs.float().sigmoid().tolist():
            chosen = [(k, p) for k, p in enumerate(probs) if p > threshold]
            rows.append(
                {"labels": [names[k] if names else k for k, _ in chosen], "probabilities": [p for _, p in chosen]}
            )
        return rows
