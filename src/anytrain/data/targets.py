"""What the label column(s) of a table become for each task, and `--task auto`'s rule for a table's labels
(tasks/settle.py applies it).

- classify: class ids, from numbers or names (sorted), checked against --num-classes (`class_ids`;
  `labelled_rows` for rows that stay in Arrow: big tables, images, text);
- regress: the values of one or several numeric columns (`--label-column price,rent`), standardised
  with the training split's mean and standard deviation (kept, saved with the weights);
- multilabel: a column of lists of class ids or names, as multi-hot rows.

--task auto, for a table: several label columns, or one float column whose values are not all
integers, is regression; a column of lists is multi-label; anything else is classification.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from ..config import ConfigError, TrainConfig
from .sources import carve


def label_columns(cfg: TrainConfig) -> list[str]:
    """--label-column: one column, or for regression several, comma-separated."""
    return [c.strip() for c in cfg.data.label_column.split(",") if c.strip()]


def read_labels(table: pa.Table, cfg: TrainConfig):
    """One label column as numpy (lists as a list of Python lists); several as a float (rows, columns) array."""
    columns = label_columns(cfg)
    if len(columns) > 1:
        return np.stack([_numbers(table[c], c) for c in columns], axis=1)
    column = table[columns[0]]
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return column.to_pylist()
    return column.to_numpy()  # nulls become NaN and are refused with the other non-numbers


def labels_of(ds, cfg: TrainConfig):
    """A split's labels as read_labels reads them; a column of lists that datasets holds as JSON (lists mixing
    kinds, such as names and numbers) decoded first, so its values are not their JSON spellings."""
    columns = label_columns(cfg)
    inner = getattr(ds.features.get(columns[0]), "feature", None)
    if len(columns) == 1 and type(inner).__name__ == "Json":
        return [row or [] for row in ds[columns[0]]]
    return read_labels(ds.with_format("arrow"), cfg)


def _numbers(column: pa.ChunkedArray, name: str) -> np.ndarray:
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise ConfigError(f"--label-column: '{name}' holds {column.type}, not numbers: regression needs numbers")
    return column.to_numpy(zero_copy_only=False).astype(np.float64)


LISTS, VALUES, CLASSES = "lists", "values", "classes"  # what a table's training labels hold


def label_form(labels, label_column: str) -> tuple[str, str]:
    """What a table's training labels hold, and why: lists (several labels a row); values (several columns,
    or numbers of which some are not integers or are too large to be class ids: a NaN among them is refused
    later, by name); else class ids or names."""
    if isinstance(labels, list):
        return LISTS, "the label column holds lists"
    if labels.ndim == 2:
        return VALUES, f"{labels.shape[1]} label columns"
    if labels.dtype.kind == "f":
        finite = labels[np.isfinite(labels)]
        if not np.all(finite == np.round(finite)):
            return VALUES, f"the label '{label_column}' holds numbers that are not all integers"
        if len(finite) and np.abs(finite).max() > MAX_CLASS_ID:
            return VALUES, f"the label '{label_column}' holds whole numbers too large to be class ids"
    if labels.dtype.kind in "USO":
        check_numbers_as_text(labels, label_column)
    return CLASSES, ""


MAX_CLASS_ID = 2**20  # a class id beyond this (a million classes) is a quantity, not a class


def check_numbers_as_text(labels: np.ndarray, label_column: str) -> None:
    """A column of numbers that reads as text because a few cells are empty or not numbers (a CSV with one
    blank cell): one line naming the first such row, not a classifier whose classes are the numbers' spellings."""
    text = [("" if v is None else str(v)).strip() for v in labels]
    numeric = np.array([_is_number(v) for v in text])
    if numeric.all() or numeric.mean() < 0.9:
        return
    row = int(np.flatnonzero(~numeric)[0])
    raise ConfigError(
        f"--label-column: '{label_column}' holds numbers and {int((~numeric).sum())} value(s) that are not (row {row} "
        f"of the training split: {text[row]!r}); fill or drop them, or give --task classify to treat every value "
        "as a class name"
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def regression_values(labels, cfg: TrainConfig, source: str, split: str) -> torch.Tensor:
    """(rows, targets) float values; a text label or a NaN/inf target is one line naming the column."""
    if isinstance(labels, list) or labels.dtype.kind not in "iufb":
        raise ConfigError(
            f"--label-column: '{cfg.data.label_column}' of {source} holds text (or lists), not numbers: "
            "regression needs numeric targets"
        )
    values = labels.astype(np.float64).reshape(len(labels), -1)
    if not np.isfinite(values).all():
        row = int(np.flatnonzero(~np.isfinite(values).all(1))[0])
        raise ConfigError(
            f"--label-column: '{cfg.data.label_column}' of {source} ({split} split) has NaN or infinite targets "
            f"(first at row {row}: {values[row].tolist()})"
        )
    return torch.from_numpy(values.astype(np.float32))


def standardised(parts: dict) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Targets standardised with the training split's statistics: (parts, mean, std); a constant target keeps std 1."""
    train = parts["train"][1]
    mean, std = train.mean(0), train.std(0) if len(train) > 1 else torch.ones(train.shape[1])
    if len(train) > 1 and (std == 0).any():
        column = int(torch.nonzero(std == 0)[0])
        raise ConfigError(
            f"--label-column: target {column} is {mean[column].item():g} in every training row: a constant has "
            "nothing to regress (its R² is undefined)"
        )
    std = torch.where(std > 0, std, torch.ones_like(std))
    return {name: (x, (y - mean) / std) for name, (x, y) in parts.items()}, mean, std


def multi_hot(labels: dict, cfg: TrainConfig, source: str) -> tuple[dict, list[str] | None]:
    """{split: list of label lists} -> ({split: (rows, classes) float multi-hot}, class names or None for ids).
    Names are the training split's, sorted; ids must be below --num-classes (or the largest id + 1)."""
    for split, rows in labels.items():
        if not isinstance(rows, list):
            raise ConfigError(
                f"--label-column: '{cfg.data.label_column}' of {source} ({split} split) does not hold lists"
            )
    train = [v for row in labels["train"] for v in (row or [])]
    if not train:
        raise ConfigError(
            f"--label-column: every list in '{cfg.data.label_column}' of {source}'s training split is empty: there "
            "are no labels to learn"
        )
    kinds = {type(v) for rows in labels.values() for row in rows for v in (row or [])}
    if str in kinds and len(kinds) > 1:
        row = next(i for i, r in enumerate(labels["train"]) if any(not isinstance(v, str) for v in r or []))
        raise ConfigError(
            f"--label-column: '{cfg.data.label_column}' of {source} mixes class names and numbers (row {row} of the "
            "training split has a number among names): give all labels as names or all as ids"
        )
    if isinstance(train[0], str):
        names = sorted(set(map(str, train)))
        ids, count = {name: i for i, name in enumerate(names)}, len(names)
    else:
        high = max((int(v) for rows in labels.values() for row in rows for v in (row or [])), default=0)
        names, ids, count = None, None, cfg.data.num_classes or high + 1
    out = {}
    for split, rows in labels.items():
        hot = torch.zeros(len(rows), count)
        for i, row in enumerate(rows):
            for v in row or []:
                k = ids.get(v) if ids is not None else int(v)
                if k is None or not 0 <= k < count:
                    raise ConfigError(
                        f"--label-column: the {split} split of {source} has the label {v!r}, not one of the "
                        f"{count} classes of the training split"
                    )
                hot[i, k] = 1.0
        out[split] = hot
    return out, names


def class_ids(tensors: dict, cfg: TrainConfig, source: str) -> tuple[int, dict | None]:
    """The class count, and for string labels the name -> id map (sorted names, the same for every split)."""
    names = next(iter(tensors.values()))[2]
    labels = [y for _, y, _ in tensors.values()]
    if labels[0].dtype.kind in "US" or labels[0].dtype == object:
        classes = sorted(set().union(*(set(map(str, y)) for y in labels)))
        cfg_classes = cfg.data.num_classes or len(classes)
        if len(classes) > cfg_classes:
            raise ConfigError(f"--num-classes: {source} has {len(classes)} label values, more than {cfg_classes}")
        return cfg_classes, {c: i for i, c in enumerate(classes)}
    if labels[0].dtype.kind == "f":
        for y in labels:
            if not np.isfinite(y).all():
                missing = int((~np.isfinite(y)).sum())
                raise ConfigError(
                    f"--label-column: '{cfg.data.label_column}' of {source} has {missing} missing value(s) (NaN, "
                    f"first at row {int(np.flatnonzero(~np.isfinite(y))[0])}): fill or drop them"
                )
        if any(not np.all(y == np.round(y)) for y in labels):
            raise ConfigError(
                f"--label-column: '{cfg.data.label_column}' of {source} must hold integer class ids or strings"
            )
    elif labels[0].dtype.kind not in "iub":
        raise ConfigError(
            f"--label-column: '{cfg.data.label_column}' of {source} must hold integer class ids or strings"
        )
    low = min(int(y.min()) for y in labels)
    high = max(int(y.max()) for y in labels)
    if high > MAX_CLASS_ID:
        raise ConfigError(
            f"--label-column: '{cfg.data.label_column}' of {source} holds values up to {high}: not class ids (for "
            "regression use --task regress)"
        )
    num_classes = cfg.data.num_classes or (len(names) if names else high + 1)
    if low < 0 or high >= num_classes:
        raise ConfigError(
            f"--label-column: labels of {source} range over [{low}, {high}], outside the {num_classes} classes [0, "
            f"{num_classes - 1}]"
        )
    if num_classes < 2:
        raise ConfigError(f"--label-column: {source} has a single class; a classifier needs at least 2")
    return num_classes, None


def label_ids(labels: np.ndarray, ids: dict | None) -> torch.Tensor:
    if ids is not None:
        return torch.tensor([ids[str(v)] for v in labels], dtype=torch.long)
    return torch.from_numpy(labels.astype(np.int64))


def labelled_rows(splits: dict, cfg: TrainConfig, source: str) -> tuple[dict, int, list[str] | None]:
    """Rows that stay in Arrow (arrow.py, images.py, text): labels read and checked into tensors, missing
    splits carved from train. Returns ({split: (rows, labels)}, number of classes, class names)."""
    labelled = {}
    for name, ds in splits.items():
        labels = ds.with_format("arrow")[cfg.data.label_column].to_numpy()
        labelled[name] = (ds, labels, getattr(ds.features[cfg.data.label_column], "names", None))
    num_classes, string_ids = class_ids(labelled, cfg, source)
    names = next(iter(labelled.values()))[2]
    parts = carve(
        {name: (ds, label_ids(y, string_ids)) for name, (ds, y, _) in labelled.items()},
        cfg,
        source,
        take=lambda ds, idx: ds.select(idx.tolist()),
    )
    if len(torch.unique(parts["train"][1])) < 2:
        raise ConfigError(
            f"--label-column: every training row of {source} has the same label; a classifier needs at least 2 "
            "classes to learn"
        )
    return parts, num_classes, list(string_ids) if string_ids is not None else list(names) if names else None
