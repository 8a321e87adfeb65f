"""Your own model through anytrain's loop: a factory in a file of yours, outside the package.

anytrain calls `build(model, shape)` once, before training. `model` is the config's model section
(anytrain.config.ModelConfig: --hidden-sizes, --dropout, ... as model.hidden_sizes, model.dropout);
`shape` (anytrain.DataShape) says what the inputs look like:
`shape.kind` is "tabular", "image" or "text", with the sizes that go with it. The module must
map a batch of inputs to logits, here (batch, shape.num_classes).

    accelerate launch --config_file accelerate_configs/cpu.yaml src/train.py --model examples/own_model.py:build
    accelerate launch --config_file accelerate_configs/multi_cpu.yaml src/train.py --model examples/own_model.py:build
    python examples/own_model.py     # the same from Python: anytrain.train(model=build, ...)
"""

from __future__ import annotations

import torch
from torch import nn


class WideNet(nn.Module):
    """One wide hidden layer with LayerNorm and GELU; tables are standardised with the training
    split's statistics (kept as buffers, so they are saved with the weights), images flattened."""

    def __init__(self, shape, width: int = 512, dropout: float = 0.1):
        super().__init__()
        if shape.kind == "text":
            raise ValueError("WideNet classifies tables and images; use --model gpt for text")
        inputs = shape.num_features if shape.kind == "tabular" else shape.channels * shape.image_size**2
        mean = shape.feature_mean if shape.feature_mean is not None else torch.zeros(inputs)
        std = shape.feature_std if shape.feature_std is not None else torch.ones(inputs)
        self.register_buffer("mean", mean.reshape(-1).clone() if shape.kind == "tabular" else torch.zeros(inputs))
        self.register_buffer("std", std.reshape(-1).clone() if shape.kind == "tabular" else torch.ones(inputs))
        self.body = nn.Sequential(
            nn.Linear(inputs, width),
            nn.LayerNorm(width),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(width, shape.num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body((x.flatten(1) - self.mean) / self.std)


def build(model, shape) -> nn.Module:
    """The factory anytrain calls: `--model examples/own_model.py:build`. Reads --dropout from the model section."""
    return WideNet(shape, dropout=model.dropout)


if __name__ == "__main__":
    import anytrain

    summary = anytrain.train(model=build, epochs=20, output_dir="runs/own_model", overwrite=True, progress=False)
    print(f"test accuracy {summary['test_accuracy']:.4f} with {summary['parameters']:,} parameters")
