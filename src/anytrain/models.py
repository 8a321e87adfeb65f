"""Classifiers by name (`--model mlp|cnn`; the language model, `--model gpt`, is in gpt.py). Each
is a flat nn.Sequential (so the model-parallel module can cut it at any layer) whose first layer
standardises raw features with the training split's statistics: the saved weights then work on
raw data, with no separate preprocessing file to lose."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import ConfigError, TrainConfig


class Standardize(nn.Module):
    """(x - mean) / std with fixed statistics, stored as buffers so they travel with the weights."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.register_buffer("mean", mean.clone())
        self.register_buffer("std", std.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def build_mlp(cfg: TrainConfig, num_features: int, num_classes: int) -> list[nn.Module]:
    layers: list[nn.Module] = []
    width = num_features
    for hidden in cfg.hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        if cfg.dropout:
            layers.append(nn.Dropout(cfg.dropout))
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return layers


def build_cnn(cfg: TrainConfig, num_features: int, num_classes: int) -> list[nn.Module]:
    side = math.isqrt(num_features)
    if side * side != num_features:
        raise ConfigError(f"--model cnn needs inputs that form a square one-channel image; got {num_features} features")
    layers: list[nn.Module] = [nn.Unflatten(1, (1, side, side))]
    channels = 1
    for out in cfg.channels:
        layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1), nn.ReLU()]
        channels = out
    pooled = side // 2 if side >= 2 else side
    layers += [nn.MaxPool2d(2) if side >= 2 else nn.Identity(), nn.Flatten(), nn.Linear(channels * pooled * pooled, 128), nn.ReLU()]
    if cfg.dropout:
        layers.append(nn.Dropout(cfg.dropout))
    layers.append(nn.Linear(128, num_classes))
    return layers


MODELS = {"mlp": build_mlp, "cnn": build_cnn}


def build_model(cfg: TrainConfig, num_features: int, num_classes: int, mean: torch.Tensor | None = None, std: torch.Tensor | None = None) -> nn.Sequential:
    """The named model; mean/std default to 0/1 (e.g. when weights are loaded over them)."""
    if cfg.model not in MODELS:
        raise ConfigError(f"--model: unknown model '{cfg.model}' (choose from {', '.join(MODELS)})")
    mean = torch.zeros(num_features) if mean is None else mean
    std = torch.ones(num_features) if std is None else std
    return nn.Sequential(Standardize(mean, std), *MODELS[cfg.model](cfg, num_features, num_classes))
