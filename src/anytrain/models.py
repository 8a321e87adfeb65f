"""The model registry (`--model mlp|cnn|resnet|gpt`) and the factories behind it. Every factory
has the signature a user's `--model module:factory` has: `factory(model, shape) -> nn.Module`,
with the config's model section (config.ModelConfig) and the data's shape (shape.py says what
the module receives and returns).

On tabular data each classifier is a flat nn.Sequential (so the model-parallel module can cut it
at any layer) whose first layer standardises raw features with the training split's statistics:
the saved weights then work on raw data, with no separate preprocessing file to lose. Images
arrive normalised by the data pipeline (data/images.py), so image models start at their first layer.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import ConfigError, ModelConfig
from .gpt import build_gpt
from .shape import DataShape


class Standardize(nn.Module):
    """(x - mean) / std with fixed statistics, stored as buffers so they travel with the weights."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.register_buffer("mean", mean.clone())
        self.register_buffer("std", std.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def standardize(shape: DataShape) -> list[nn.Module]:
    """Tabular inputs: the Standardize layer (mean/std 0/1 when weights will be loaded over them)."""
    if shape.kind != "tabular":
        return []
    mean = torch.zeros(shape.num_features) if shape.feature_mean is None else shape.feature_mean
    std = torch.ones(shape.num_features) if shape.feature_std is None else shape.feature_std
    return [Standardize(mean, std)]


def hidden_layers(model: ModelConfig, width: int) -> tuple[list[nn.Module], int]:
    """model.hidden_sizes as Linear + ReLU (+ Dropout) layers from `width` inputs; returns (layers, last width)."""
    layers: list[nn.Module] = []
    for hidden in model.hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        if model.dropout:
            layers.append(nn.Dropout(model.dropout))
        width = hidden
    return layers, width


def build_mlp(model: ModelConfig, shape: DataShape) -> nn.Sequential:
    """Fully connected layers; images are flattened first."""
    if shape.kind == "image":
        first, width = [nn.Flatten()], shape.channels * shape.image_size**2
    else:
        first, width = standardize(shape), shape.num_features
    layers, width = hidden_layers(model, width)
    return nn.Sequential(*first, *layers, nn.Linear(width, shape.num_classes))


def build_cnn(model: ModelConfig, shape: DataShape) -> nn.Sequential:
    """3x3 convolutions (model.channels), one 2x2 max-pool, a 128-wide hidden layer. Tabular inputs
    must form a square one-channel image (e.g. the 8x8 digits' 64 pixels)."""
    if shape.kind == "image":
        first, channels, side = [], shape.channels, shape.image_size
    else:
        side, channels = math.isqrt(shape.num_features), 1
        if side * side != shape.num_features:
            raise ConfigError(
                f"--model cnn needs inputs that form a square one-channel image; got {shape.num_features} features"
            )
        first = [*standardize(shape), nn.Unflatten(1, (1, side, side))]
    layers: list[nn.Module] = []
    for out in model.channels:
        layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1), nn.ReLU()]
        channels = out
    pooled = side // 2 if side >= 2 else side
    layers += [
        nn.MaxPool2d(2) if side >= 2 else nn.Identity(),
        nn.Flatten(),
        nn.Linear(channels * pooled * pooled, 128),
        nn.ReLU(),
    ]
    if model.dropout:
        layers.append(nn.Dropout(model.dropout))
    return nn.Sequential(*first, *layers, nn.Linear(128, shape.num_classes))


class BasicBlock(nn.Module):
    """Two 3x3 conv + batch-norm layers with an identity (or 1x1 projection) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        projection = stride != 1 or cin != cout
        self.shortcut = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
            if projection
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


def build_resnet(model: ModelConfig, shape: DataShape) -> nn.Sequential:
    """A CIFAR-style ResNet (He et al. 2016, section 4.2): a 3x3 stem, one stage per entry of
    model.channels with model.blocks_per_stage BasicBlocks (every stage after the first halves the
    resolution), global average pooling, one Linear. `--channels 16 32 64 --blocks-per-stage 3` is
    ResNet-20. Any image size works (the pooling is adaptive); tabular inputs are refused."""
    if shape.kind != "image":
        raise ConfigError("--model resnet needs image data (an Image column or a folder of images)")
    if not model.channels:
        raise ConfigError("--channels must name at least one stage for the resnet model")
    width = model.channels[0]
    layers: list[nn.Module] = [
        nn.Conv2d(shape.channels, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    ]
    for stage, out in enumerate(model.channels):
        for block in range(model.blocks_per_stage):
            layers.append(BasicBlock(width, out, stride=2 if stage > 0 and block == 0 else 1))
            width = out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    if model.dropout:
        layers.append(nn.Dropout(model.dropout))
    return nn.Sequential(*layers, nn.Linear(width, shape.num_classes))


REGISTRY = {"mlp": build_mlp, "cnn": build_cnn, "resnet": build_resnet, "gpt": build_gpt}
