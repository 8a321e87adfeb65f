"""The model registry (`--model mlp|cnn|resnet|encoder|bag|gpt`) and the factories behind it. Every factory
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
from .gpt import Block, build_gpt, init_weights
from .shape import DataShape


class Standardize(nn.Module):
    """(x - mean) / std with fixed statistics, stored as buffers so they travel with the weights."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.mean: torch.Tensor
        self.std: torch.Tensor
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
    first: list[nn.Module]
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


# --------------------------------------------------------------------------- text classification
# Both take the "tokens" shape (shape.py): int64 ids (batch, T), each row a text padded at its end with
# shape.pad_id to the batch's longest. Padding never reaches a result: the encoder never attends to a
# padded key and pools real tokens only, EmbeddingBag leaves the pad id out of its mean. A text's logits
# are the same whatever the batch pads it to, which is what lets 1 and 2 ranks, and accumulation, agree.


class Encoder(nn.Module):
    """Token + learned position embeddings, the GPT's pre-norm blocks without the causal mask, a final
    LayerNorm, the mean over each text's real tokens, and a linear layer to the classes."""

    def __init__(self, model: ModelConfig, shape: DataShape):
        super().__init__()
        self.pad_id, self.max_length = shape.pad_id, shape.max_length
        self.tok_emb = nn.Embedding(shape.vocab_size, model.n_embd)
        self.pos_emb = nn.Embedding(shape.max_length, model.n_embd)
        self.drop = nn.Dropout(model.dropout)
        self.blocks = nn.ModuleList(
            Block(model.n_embd, model.n_head, model.dropout, causal=False) for _ in range(model.n_layer)
        )
        self.ln_f = nn.LayerNorm(model.n_embd, bias=False)
        self.head = nn.Linear(model.n_embd, shape.num_classes)
        init_weights(self, self.blocks)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        T = ids.size(1)
        if T > self.max_length:
            raise ValueError(f"{T} tokens exceed the encoder's {self.max_length} positions")
        mask = ids != self.pad_id  # (B, T): True at real tokens
        x = self.drop(self.tok_emb(ids) + self.pos_emb(torch.arange(T, device=ids.device)))
        for block in self.blocks:
            x = block(x, mask)
        real = mask.unsqueeze(-1).to(x.dtype)
        pooled = (self.ln_f(x) * real).sum(1) / real.sum(1).clamp(min=1)  # the mean over real tokens only
        return self.head(pooled)


def build_encoder(model: ModelConfig, shape: DataShape) -> Encoder:
    """The registry's `--model encoder`: --n-layer blocks of --n-embd width and --n-head heads,
    --dropout, and --max-length positions."""
    return Encoder(model, shape)


class Bag(nn.Module):
    """The mean of a text's token embeddings (nn.EmbeddingBag, which skips the pad id), then the
    --hidden-sizes layers and a linear layer to the classes: a deep averaging network. Word order is
    not seen, so it is fast and a baseline. With --ngrams N the bag also holds every run of 2..N
    consecutive real tokens, hashed into --ngram-buckets extra embedding rows (fastText's n-grams):
    on characters, that is the character n-grams a TF-IDF baseline uses."""

    PRIME = 2_147_483_647  # the hash is taken modulo 2**31 - 1 after each token, so int64 never overflows
    MIX = 2_654_435_761  # Knuth's multiplicative hash constant: < 2**32, so hash * MIX < 2**63

    def __init__(self, model: ModelConfig, shape: DataShape):
        super().__init__()
        self.vocab_size, self.pad_id = shape.vocab_size, shape.pad_id
        self.ngrams, self.buckets = model.ngrams, model.ngram_buckets if model.ngrams > 1 else 0
        rows = shape.vocab_size + self.buckets
        self.embed = nn.EmbeddingBag(rows, model.n_embd, mode="mean", padding_idx=shape.pad_id)
        layers, width = hidden_layers(model, model.n_embd)
        self.classify = nn.Sequential(*layers, nn.Linear(width, shape.num_classes))

    def features(self, ids: torch.Tensor) -> torch.Tensor:
        """(batch, T) token ids -> the ids and, for n in 2..N, each window's n-gram row (vocab_size +
        its hash bucket), or the pad id where the window reaches into the padding."""
        features = [ids]
        for n in range(2, self.ngrams + 1):
            if ids.size(1) < n:
                break
            windows = ids.unfold(1, n, 1)  # (batch, T - n + 1, n)
            hashed = torch.full_like(windows[..., 0], n)
            for k in range(n):
                hashed = (hashed * self.vocab_size + windows[..., k]) % self.PRIME
            real = (windows != self.pad_id).all(-1)
            bucket = hashed * self.MIX % self.PRIME % self.buckets  # mixed, so that near n-grams spread out
            features.append(torch.where(real, self.vocab_size + bucket, self.pad_id))
        return torch.cat(features, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.classify(self.embed(self.features(ids)))


def build_bag(model: ModelConfig, shape: DataShape) -> Bag:
    """The registry's `--model bag`: --n-embd wide embeddings, --ngrams, --hidden-sizes, --dropout."""
    return Bag(model, shape)


REGISTRY = {
    "mlp": build_mlp,
    "cnn": build_cnn,
    "resnet": build_resnet,
    "encoder": build_encoder,
    "bag": build_bag,
    "gpt": build_gpt,
}
# The registry's models that learn from tables or images (text: encoder and bag classify, gpt models).
LABELLED = ("mlp", "cnn", "resnet")
