"""Tables bigger than --max-in-memory-mb: the rows stay in datasets' memory-mapped Arrow files and
become tensors one batch at a time, so the process's own memory does not grow with the data.

Small tables are faster as two tensors (data/__init__.py); which path a run took is recorded in
its summary (`data_path`). Statistics (the Standardize layer's mean/std) and the finiteness
check are computed in one pass over Arrow chunks.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from ..config import ConfigError, TrainConfig
from ..shape import DataShape
from .sources import numeric_rows
from .splits import BatchRows, Splits

CHUNK_ROWS = 8192  # rows per Arrow chunk in the statistics pass (8192 x 256 float64 features = 16 MB)


def table_megabytes(splits: dict, inputs: list[str]) -> float:
    """The features of every split as float32, in MB (from the first row's width)."""
    first = splits["train"].with_format("arrow")[:1]
    width = sum(numeric_rows(first[c]).shape[1] for c in inputs)
    return sum(len(ds) for ds in splits.values()) * width * 4 / 2**20


class ArrowRows(BatchRows):
    """One split's rows in Arrow (inputs, memory-mapped) and its labels (a tensor); a batch is one `take`."""

    def __init__(self, rows, columns: list[str], targets: torch.Tensor):
        self.rows = rows.select_columns(columns).with_format("arrow")
        self.columns, self.targets = columns, targets

    def __getitems__(self, indices: list[int]):
        table = self.rows[list(indices)]
        inputs = np.concatenate([numeric_rows(table[c]) for c in self.columns], axis=1)
        return torch.from_numpy(inputs), self.targets[torch.as_tensor(indices)]

    def column_stats(self, source: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-feature mean and (unbiased) std in one chunked pass; ConfigError on NaN or infinity."""
        total: np.ndarray | None = None
        squares: np.ndarray | None = None
        count = 0
        for chunk in self.rows.iter(batch_size=CHUNK_ROWS):
            try:
                x = np.concatenate([numeric_rows(chunk[c]) for c in self.columns], axis=1).astype(np.float64)
            except (ValueError, TypeError, pa.ArrowException):
                raise ConfigError(
                    f"--input-columns: the columns of {source} are not all numeric (or their lists differ in length)"
                ) from None
            if not np.isfinite(x).all():
                raise ConfigError(f"--dataset: {source} ({split} split) has NaN or infinite values")
            total = x.sum(0) if total is None else total + x.sum(0)
            squares = (x * x).sum(0) if squares is None else squares + (x * x).sum(0)
            count += len(x)
        if total is None or squares is None:
            raise ConfigError(f"--dataset: {source} ({split} split) has no rows")
        mean = total / count
        var = np.maximum(squares - count * mean * mean, 0.0) / max(count - 1, 1)
        std = np.sqrt(var)
        return torch.tensor(mean, dtype=torch.float32), torch.tensor(np.where(std > 0, std, 1.0), dtype=torch.float32)


def load_arrow_splits(cfg: TrainConfig, splits: dict, source: str, inputs: list[str]) -> Splits:
    """Labels checked and held in memory; the inputs stay in Arrow. Missing splits are carved from train."""
    from .targets import labelled_rows

    parts, num_classes, class_names = labelled_rows(splits, cfg, source)
    rows = {name: ArrowRows(ds, inputs, y) for name, (ds, y) in parts.items()}
    for name, split in rows.items():
        stats = split.column_stats(source, name)  # every split is checked for NaN; the training split's are kept
        if name == "train":
            mean, std = stats
    shape = DataShape("tabular", num_classes=num_classes, num_features=len(mean), feature_mean=mean, feature_std=std)
    facts = {
        "num_features": len(mean),
        "num_classes": num_classes,
        "train_samples": len(rows["train"]),
        "data_path": "arrow (memory-mapped), read per batch",
    }
    return Splits.of(
        rows,
        shape,
        source,
        class_names=class_names,
        input_columns=inputs,
        facts=facts,
        metadata={"num_features": len(mean)},
    )
