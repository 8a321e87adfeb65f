"""regress: targets are one or several numeric columns, standardised with the training split's
statistics (saved with the weights); the model returns values (batch, targets); MSE (or --loss huber);
RMSE, MAE and R² in the original units; predict prints values by column name."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn import functional as F

from ..best import HIGHER, LOWER
from ..config import TrainConfig
from ..data.splits import Splits
from ..data.targets import VALUES
from ..shape import DataShape
from ..usermodel import logits_of
from .labelled import Labelled, tables_only


class Regression(Labelled):
    name = "regress"
    goals = {"loss": LOWER, "rmse": LOWER, "mae": LOWER, "r2": HIGHER}
    headline = "r2"
    losses = ("mse", "huber")
    label_form = VALUES

    @classmethod
    def check_settled(cls, cfg: TrainConfig, reason: str) -> None:
        tables_only(cfg, cls.name)

    def load_data(self, given=None) -> Splits:
        data = super().load_data(given)
        assert data.target_stats is not None  # tables standardise numeric targets
        self.target_std = torch.tensor(data.target_stats.std)
        return data

    def weights_metadata(self) -> dict[str, Any]:
        """+ the targets' statistics, which turn predictions back into the labels' units."""
        assert self.data.target_stats is not None
        return {**super().weights_metadata(), "targets": self.data.target_stats}

    def huber(self) -> bool:
        return self.cfg.optim.loss == "huber"

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.huber():
            return F.huber_loss(outputs.float(), targets)
        return F.mse_loss(outputs.float(), targets)

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        errors = logits_of(outputs).float() - targets
        zeros = torch.zeros_like(errors)
        losses = F.huber_loss(errors, zeros, reduction="none") if self.huber() else errors.square()
        stats = {"se": errors.square(), "ae": errors.abs(), "z": targets, "z2": targets.square()}
        return {"loss": losses.mean(1), **stats}

    def metrics(self, sums: dict, count: int) -> dict:
        std = self.target_std.double()  # standardised errors back to the targets' units
        se, ae = sums["se"] * std.square(), sums["ae"] * std
        spread = (sums["z2"] - sums["z"].square() / count) * std.square()  # sum of squared deviations from the mean
        r2 = 1 - se / spread.clamp_min(1e-300)
        return {
            "loss": sums["loss"].item() / count,
            "rmse": math.sqrt(se.mean().item() / count),
            "mae": ae.mean().item() / count,
            "r2": r2.mean().item(),  # the mean over targets, like scikit-learn's r2_score
        }

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return torch.zeros(batch, shape.num_classes)

    def predictions(self, outputs: torch.Tensor, meta: dict) -> list[dict]:
        stats = meta["targets"]
        values = outputs.float() * torch.tensor(stats.std) + torch.tensor(stats.mean)
        return [dict(zip(stats.names, row)) for row in values.tolist()]
