"""Labelled tables and the labelled data that shares their reading: check the columns, read the labels
into class ids (or, for regress and multilabel, targets.py's targets), carve the missing splits, and
hold each split the fastest way.

A table of numbers is held as two tensors per split (features, labels), so a batch is one fancy-index,
not 64 Python rows: per-row work in the data path would otherwise dominate the step of a small model.
A table bigger than --max-in-memory-mb stays in Arrow (arrow.py); a dataset with an Image column or a
folder of images is decoded per batch (images.py); --streaming reads a stream (stream.py). Only
`synthetic` is generated directly as tensors. The task is settled before any of this (tasks/settle.py).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from ..config import ConfigError, TrainConfig
from ..shape import DataShape
from .sources import ImageFolder, as_stream, carve, named_splits, numeric_rows, open_dataset
from .splits import Splits, TargetStats, TensorPairs
from .targets import (
    CLASSES,
    VALUES,
    class_ids,
    label_columns,
    label_ids,
    labels_of,
    multi_hot,
    regression_values,
    standardised,
)


def load_labelled(cfg: TrainConfig, given=None, targets: str = CLASSES) -> Splits:
    """Load, check and split the dataset named by cfg.data.dataset (or `given`, a datasets Dataset or
    DatasetDict) for cfg.data.task (classify, regress or multilabel). ConfigError on bad data."""
    if given is None and cfg.data.dataset == "synthetic":
        return synthetic(cfg)
    folder = ImageFolder.scan(cfg.data.dataset) if given is None else None
    if folder is not None:
        folder.check_classes()  # before reading: one class folder is one line, not a missing 'label' column
    raw, source = (
        open_dataset(cfg.data.dataset, cfg.data.streaming, folder)
        if given is None
        else (given, f"{type(given).__name__} object")
    )
    data = _by_kind(cfg, named_splits(raw), source, targets)
    if folder is not None:
        data.facts["skipped_files"] = folder.skipped
    notes = [folder.note() if folder else None, quantity_warning(data, cfg) if targets == CLASSES else None]
    data.notes += [note for note in notes if note]
    return data


def _by_kind(cfg: TrainConfig, splits: dict, source: str, targets: str) -> Splits:
    """Splits of a table of numbers (in memory or in Arrow), of images, or streamed."""
    from .arrow import load_arrow_splits, table_megabytes
    from .images import image_column, load_image_splits

    if cfg.data.streaming:
        from .stream import load_stream_splits

        return load_stream_splits(cfg, {name: as_stream(ds) for name, ds in splits.items()}, source)
    column = image_column(splits["train"], cfg)
    if column is not None:
        return load_image_splits(cfg, splits, source, _classify_only(cfg, targets, "images", column))
    inputs = check_columns(splits, cfg, source)
    if table_megabytes(splits, inputs) > cfg.data.max_in_memory_mb:
        return load_arrow_splits(
            cfg, splits, source, _classify_only(cfg, targets, "tables over --max-in-memory-mb", inputs)
        )
    tensors = {name: _to_tensors(ds, cfg, source, name) for name, ds in splits.items()}
    input_columns = cfg.data.input_columns or [c for c in splits["train"].column_names if c not in label_columns(cfg)]
    if targets != CLASSES:
        return _target_splits(tensors, cfg, source, input_columns, targets)
    num_classes, string_ids = class_ids(tensors, cfg, source)
    feature_names = next(iter(tensors.values()))[2]
    class_names = list(string_ids) if string_ids is not None else list(feature_names) if feature_names else None
    tensors = {name: (x, label_ids(y, string_ids)) for name, (x, y, _) in tensors.items()}
    present = torch.unique(tensors["train"][1])
    if len(present) < 2:
        raise ConfigError(
            f"--label-column: every training row of {source} has the same label ({present.tolist()[0]}); a classifier "
            "needs at least 2 classes to learn"
        )
    return in_memory(carve(tensors, cfg, source), num_classes, source, class_names, input_columns)


def _classify_only(cfg: TrainConfig, targets: str, what: str, passed=None):
    """Values and lists of labels are read from tables held in memory; images and larger tables are classified."""
    if targets != CLASSES:
        raise ConfigError(f"--task {cfg.data.task} reads tables in memory; {what} are classified (--task classify)")
    return passed


def _target_splits(tensors: dict, cfg: TrainConfig, source: str, columns: list, form: str) -> Splits:
    """Regression and multi-label splits: targets made (targets.py), missing splits carved, then standardised
    (a regression's: their statistics in `target_stats`)."""
    labels = {name: y for name, (_, y, _) in tensors.items()}
    if form == VALUES:
        targets = {name: regression_values(y, cfg, source, name) for name, y in labels.items()}
        names = None
    else:
        targets, names = multi_hot(labels, cfg, source)
    parts = carve({name: (x, targets[name]) for name, (x, _, _) in tensors.items()}, cfg, source)
    stats = None
    if form == VALUES:
        parts, mean, std = standardised(parts)
        stats = TargetStats(mean.tolist(), std.tolist(), label_columns(cfg))
    data = in_memory(parts, parts["train"][1].shape[1], source, names, columns)
    data.target_stats = stats
    return data


def in_memory(parts: dict, num_classes: int, source: str, class_names=None, input_columns=None) -> Splits:
    """Splits of carved {split: (features, targets)} tensors, with the training split's feature statistics."""
    train, validation, test = (TensorPairs(*parts[name]) for name in ("train", "validation", "test"))
    std = train.inputs.std(0)
    shape = DataShape(
        "tabular",
        num_classes=num_classes,
        num_features=train.inputs.shape[1],
        feature_mean=train.inputs.mean(0),
        feature_std=torch.where(std > 0, std, torch.ones_like(std)),  # constant features (blank pixels) stay as is
    )
    facts = {
        "num_features": shape.num_features,
        "num_classes": num_classes,
        "train_samples": len(train),
        "data_path": "in-memory tensors",
    }
    return Splits(
        train,
        validation,
        test,
        shape,
        source,
        class_names=class_names,
        input_columns=input_columns,
        facts=facts,
        metadata={"num_features": shape.num_features},
    )


QUANTITY_DISTINCT = 20  # a numeric label with more distinct training values than this,
QUANTITY_SHARE = 0.1  # and than this share of the training rows, looks like a quantity, not a class id
SPARSE_IDS = 2  # as do integer ids that make this many times more classes than there are distinct values


def quantity_warning(data: Splits, cfg: TrainConfig) -> str | None:
    """A warning when a numeric class label (no strings, no ClassLabel, no --num-classes) looks like a
    quantity to regress: many distinct training values relative to the rows, or ids spread so thin
    that num_classes (max + 1) is far above the distinct count. Streams are not looked at."""
    labels = getattr(data.train, "targets", None)  # a stream holds no labels up front
    if labels is None or data.class_names is not None or cfg.data.num_classes:
        return None
    distinct, rows = len(torch.unique(labels)), len(labels)
    if distinct > QUANTITY_DISTINCT and distinct > QUANTITY_SHARE * rows:
        facts = f"{distinct} distinct values over {rows} rows"
    elif data.num_classes > QUANTITY_DISTINCT and data.num_classes > SPARSE_IDS * distinct:
        facts = f"{distinct} distinct values up to {data.num_classes - 1}, so {data.num_classes} classes"
    else:
        return None
    return (
        f"WARNING: --label-column '{cfg.data.label_column}' looks like a quantity ({facts}): for regression use "
        "--task regress"
    )


def check_columns(splits: dict, cfg: TrainConfig, source: str) -> list[str]:
    """Every split is non-empty and has the label and input columns; returns the input columns."""
    for split, ds in splits.items():
        if len(ds) == 0:
            raise ConfigError(f"--dataset: the {split} split of {source} is empty")
        columns = ds.column_names
        for label in label_columns(cfg):
            if label not in columns:
                raise ConfigError(f"--label-column: column '{label}' not in {source} (columns: {', '.join(columns)})")
        inputs = cfg.data.input_columns or [c for c in columns if c not in label_columns(cfg)]
        for c in inputs:
            if c not in columns:
                raise ConfigError(f"--input-columns: column '{c}' not in {source} (columns: {', '.join(columns)})")
        if not inputs:
            raise ConfigError(f"--input-columns: {source} has no feature columns besides the label")
    first = splits["train"].with_format("arrow")[:1]
    for c in inputs:
        try:
            numeric_rows(first[c])
        except (ValueError, TypeError, pa.ArrowException):
            raise ConfigError(
                f"--input-columns: column '{c}' of {source} is not numeric (or its lists differ in length)"
            ) from None
    return inputs


def _to_tensors(ds, cfg: TrainConfig, source: str, split: str):
    inputs = cfg.data.input_columns or [c for c in ds.column_names if c not in label_columns(cfg)]
    table = ds.with_format("arrow")  # whole columns straight from Arrow: no per-row Python (0.26 s -> 5 ms on digits)
    parts = []
    for c in inputs:
        try:
            col = numeric_rows(table[c])
        except (ValueError, TypeError, pa.ArrowException):
            raise ConfigError(
                f"--input-columns: column '{c}' of {source} is not numeric (or its lists differ in length)"
            ) from None
        if not np.isfinite(col).all():
            raise ConfigError(f"--dataset: column '{c}' of {source} ({split} split) has NaN or infinite values")
        parts.append(col)
    features = torch.from_numpy(np.concatenate(parts, axis=1))
    labels = labels_of(ds, cfg)
    names = getattr(ds.features[label_columns(cfg)[0]], "names", None)
    return features, labels, names


def synthetic(cfg: TrainConfig) -> Splits:
    """A learnable classification set: Gaussian clusters around random class centres."""
    g = torch.Generator().manual_seed(cfg.run.seed)
    centres = torch.randn(cfg.data.synthetic_classes, cfg.data.synthetic_features, generator=g)
    labels = torch.randint(cfg.data.synthetic_classes, (cfg.data.synthetic_samples,), generator=g)
    features = centres[labels] + 1.5 * torch.randn(cfg.data.synthetic_samples, cfg.data.synthetic_features, generator=g)
    data = cfg.data
    source = f"synthetic ({data.synthetic_samples} x {data.synthetic_features}, {data.synthetic_classes} classes)"
    return in_memory(carve({"train": (features, labels)}, cfg, source), cfg.data.synthetic_classes, source)


def predict_rows(dataset: str, columns: list[str], num_features: int | None) -> tuple[torch.Tensor, object, str]:
    """`anytrain predict`'s rows: (features in the run's column order, the file's rows, its name) or ConfigError."""
    from .sources import rows_to_predict

    ds, source = rows_to_predict(dataset)
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise ConfigError(
            f"--dataset: {source} lacks the run's input columns {', '.join(missing)} (it has "
            f"{', '.join(ds.column_names)})"
        )
    table = ds.with_format("arrow")
    try:
        features = np.concatenate([numeric_rows(table[c]) for c in columns], axis=1)
    except (ValueError, TypeError) as e:
        raise ConfigError(
            f"--dataset: the input columns of {source} are not numeric like the training data's ({e})"
        ) from None
    if num_features is not None and features.shape[1] != num_features:
        raise ConfigError(
            f"--dataset: {source} gives {features.shape[1]} features per row; the run was trained on {num_features}"
        )
    return torch.from_numpy(features), ds, source
