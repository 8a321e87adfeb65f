"""The job every trainer in the peers benchmark runs: the same data, model, optimizer, schedule (no anytrain in it).

MLP 784-1024-1024-10 (first layer: standardise with the training split's mean/std, as anytrain's
tabular models do), batch 256, AdamW (lr 1e-3, weight decay 0.1 on weight matrices only, the fused
CPU kernel everywhere), constant LR without warm-up, gradient norm clipped to 1.0, no dropout, fp32,
16,000 training rows x 5 epochs, a validation pass (loss and accuracy, 4,000 rows) after every
epoch, a test pass (4,000 rows) at the end, the training loss logged every 10 steps.
"""  # the second paragraph is the job's description in docs/benchmarks.md's table 6

import time

T0 = time.perf_counter()  # the importing script's start, near enough (this is its first import)

import argparse  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

FEATURES, HIDDEN, CLASSES = 784, (1024, 1024), 10
ROWS = {"train": 16000, "validation": 4000, "test": 4000}
BATCH, EPOCHS, LR, WEIGHT_DECAY, MAX_GRAD_NORM, LOG_EVERY, SEED = 256, 5, 1e-3, 0.1, 1.0, 10, 42

# The same job as anytrain options (src/train.py), for the anytrain side of the benchmark.
ANYTRAIN_OPTIONS = ["--hidden-sizes", *map(str, HIDDEN), "--dropout", "0", "--batch-size", str(BATCH)]
ANYTRAIN_OPTIONS += ["--epochs", str(EPOCHS), "--lr", str(LR), "--weight-decay", str(WEIGHT_DECAY)]
ANYTRAIN_OPTIONS += ["--max-grad-norm", str(MAX_GRAD_NORM), "--schedule", "constant", "--warmup-steps", "0"]
ANYTRAIN_OPTIONS += ["--log-every-steps", str(LOG_EVERY), "--seed", str(SEED), "--num-classes", str(CLASSES)]


def arguments(out_help: str | None = None) -> argparse.Namespace:
    """Every peer script's options: --data (the parquet folder), --json (its figures), and --out
    (its own run folder) when out_help says what goes there."""
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, type=Path)
    p.add_argument("--json", required=True)
    if out_help:
        p.add_argument("--out", required=True, help=out_help)
    return p.parse_args()


def write_data(folder: Path) -> Path:
    """train/validation/test.parquet: Gaussian clusters, a 784-float 'features' list column and an int 'label',
    which each trainer reads as its users would (anytrain --dataset, the HF Trainer datasets, the others pyarrow)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    centres = 0.15 * rng.standard_normal((CLASSES, FEATURES)).astype(np.float32)  # overlapping: not solved in 1 epoch
    for split, rows in ROWS.items():
        if (folder / f"{split}.parquet").exists():
            continue
        labels = rng.integers(0, CLASSES, rows)
        features = centres[labels] + 1.5 * rng.standard_normal((rows, FEATURES)).astype(np.float32)
        column = pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), FEATURES)
        table = pa.table({"features": column, "label": pa.array(labels, pa.int64())})
        pq.write_table(table, folder / f"{split}.parquet")
    return folder


def read_split(folder: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(features float32 [rows, 784], labels int64) tensors of one split, read with pyarrow."""
    table = pq.read_table(folder / f"{split}.parquet")
    features = table["features"].combine_chunks().flatten().to_numpy().reshape(len(table), FEATURES)
    return torch.from_numpy(features.copy()), torch.from_numpy(table["label"].to_numpy().copy())


class Standardize(nn.Module):
    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.register_buffer("mean", mean.clone())
        self.register_buffer("std", std.clone())

    def forward(self, x):
        return (x - self.mean) / self.std


def build_model(features: torch.Tensor) -> nn.Sequential:
    """Standardise (with the training split's mean and std; a constant feature keeps std 1, as in anytrain),
    then Linear/ReLU layers: the module anytrain's --model mlp builds for this job."""
    std = features.std(0)
    torch.manual_seed(SEED)
    layers, width = [Standardize(features.mean(0), torch.where(std > 0, std, torch.ones_like(std)))], FEATURES
    for hidden in HIDDEN:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    return nn.Sequential(*layers, nn.Linear(width, CLASSES))


def optimizer(model: nn.Module) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LR, fused=True)


def write_result(path: str, loop_start: float, loop_s: float, steps: int, val_accuracy, test_accuracy, **extra) -> None:
    """What each script reports as JSON: process_to_loop_s (this process's start to the loop), loop_s (the epochs:
    training, validations, checkpoints), the optimizer steps, the validation and test accuracy reached."""
    figures = {"process_to_loop_s": loop_start - T0, "loop_s": loop_s, "steps": steps, "val_accuracy": val_accuracy}
    Path(path).write_text(json.dumps({**figures, "test_accuracy": test_accuracy, **extra}))
