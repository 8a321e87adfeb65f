"""What a model is told about the data: the one argument, besides the config's model section,
that every model factory receives (the registry's and a user's `--model module:factory` alike).

    def factory(model: ModelConfig, shape: DataShape) -> nn.Module

`model` holds --model (as model.name), --hidden-sizes, --channels, --blocks-per-stage, --n-layer,
--n-head, --n-embd and --dropout (config/sections.py); `shape` the sizes below.

The module maps a batch of inputs to logits:

- tabular classification: float inputs (batch, num_features), raw values (feature_mean and
  feature_std are the training split's statistics) -> logits (batch, num_classes);
- images: float inputs (batch, channels, image_size, image_size), normalised per channel with
  the training split's statistics -> logits (batch, num_classes);
- text classification ("tokens"): int64 token ids (batch, longest text of the batch, at most
  max_length), shorter texts padded at the end with pad_id -> logits (batch, num_classes). The
  attention mask is `inputs != pad_id`;
- language modelling: int64 token ids (batch, block_size) -> logits (batch, block_size, vocab_size).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import torch

IGNORE = -100  # a position with no target: transformers' label for "no loss here"


@dataclass
class DataShape:
    kind: str  # "tabular", "image", "tokens" (text to classify) or "text" (language modelling)
    num_classes: int = 0  # tabular, image and tokens: logits per sample
    num_features: int = 0  # tabular: columns of a raw input row
    channels: int = 0  # image: 1 (grayscale) or 3 (RGB)
    image_size: int = 0  # image: height = width after resizing
    vocab_size: int = 0  # text and tokens: token ids are in [0, vocab_size)
    block_size: int = 0  # text: tokens per input window
    feature_mean: torch.Tensor | None = field(
        default=None, repr=False
    )  # tabular: per-column statistics of the training split
    feature_std: torch.Tensor | None = field(default=None, repr=False)
    max_length: int = 0  # tokens: the longest a row of inputs gets (the positions a model needs)
    pad_id: int = 0  # tokens: the id that fills a row after its text; never a real token

    def example_inputs(self, batch: int = 2) -> torch.Tensor:
        """A batch of the right shape and dtype, to check what a model returns before training."""
        if self.kind == "tokens":  # the first row full length, the others half padded
            ids = torch.full((batch, self.max_length), (self.pad_id + 1) % self.vocab_size, dtype=torch.long)
            ids[1:, (self.max_length + 1) // 2 :] = self.pad_id
            return ids
        if self.kind == "text":
            return torch.zeros(batch, self.block_size, dtype=torch.long)
        if self.kind == "image":
            return torch.zeros(batch, self.channels, self.image_size, self.image_size)
        return (
            torch.zeros(batch, self.num_features)
            if self.feature_mean is None
            else self.feature_mean.expand(batch, -1).clone()
        )

    def logits_shape(self, batch: int = 2) -> tuple[int, ...]:
        return (batch, self.block_size, self.vocab_size) if self.kind == "text" else (batch, self.num_classes)

    def to_json(self) -> str:
        """The sizes, without the statistics (saved with the weights, which hold those as buffers when used)."""
        return json.dumps({k: v for k, v in asdict(self).items() if k not in ("feature_mean", "feature_std")})

    @classmethod
    def from_json(cls, text: str) -> DataShape:
        return cls(**json.loads(text))
