"""Data: load a dataset with Hugging Face datasets, check it, and hold each split the fastest way.

Every source (the bundled digits, a local file or folder, a hub name, a datasets object passed
to `anytrain.train`) goes through `datasets`; only `synthetic` is generated directly as tensors.
A table of numbers is held as two tensors per split (features, labels), so a batch is one
fancy-index, not 64 Python rows: per-row work in the data path would otherwise dominate the step
of a small model. A dataset with an Image column (or a folder of images) stays in Arrow and is
decoded per batch instead (images.py).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from ..config import ConfigError, TrainConfig, first_line
from ..shape import DataShape
from .targets import label_columns, multi_hot, read_labels, regression_values, settle_task, standardised

DIGITS_PATH = Path(__file__).with_name("digits.parquet")
FILE_BUILDERS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json"}
VALIDATION_NAMES = ("validation", "valid", "val", "dev")


class BatchRows(Dataset):
    """A split read a whole batch at a time: subclasses hold `targets` and define `__getitems__`."""

    targets: torch.Tensor

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index):
        inputs, targets = self.__getitems__([index])
        return inputs[0], targets[0]

    def set_epoch(self, epoch: int) -> None:
        """Nothing random to redraw (the sampler shuffles)."""


class TensorPairs(BatchRows):
    """(features, labels) tensors; `__getitems__` lets the DataLoader fetch a whole batch at once."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor):
        self.inputs, self.targets = inputs, targets

    def __getitem__(self, index):
        return self.inputs[index], self.targets[index]

    def __getitems__(self, indices: list[int]):
        index = torch.as_tensor(indices)
        return self.inputs[index], self.targets[index]


def keep_batch(batch):
    """collate_fn: `TensorPairs.__getitems__` already returns a stacked batch."""
    return batch


@dataclass
class DataSplits:
    train: TensorPairs
    validation: TensorPairs
    test: TensorPairs
    num_features: int
    num_classes: int
    source: str
    class_names: list[str] | None = None  # string labels (sorted: id i is the i-th) or a ClassLabel's names
    input_columns: list[str] | None = None  # the feature columns, in the order they were concatenated
    stats: tuple[torch.Tensor, torch.Tensor] | None = None  # (mean, std) when the rows stay in Arrow (arrow.py)
    task: str = "classify"  # or regress, multilabel (targets.py); num_classes is then the outputs per sample
    task_reason: str = ""  # why: --task, or what --task auto saw in the labels
    target_names: list[str] | None = None  # regress: the label columns
    target_mean: torch.Tensor | None = None  # regress: the training split's statistics, saved with the weights
    target_std: torch.Tensor | None = None
    notes: list[str] = field(default_factory=list)  # lines the trainer prints at start (load_splits)

    @functools.cached_property
    def feature_mean(self) -> torch.Tensor:  # cached: shape() is asked for more than once, the statistics once
        return self.stats[0] if self.stats else self.train.inputs.mean(0)

    @functools.cached_property
    def feature_std(self) -> torch.Tensor:
        if self.stats:
            return self.stats[1]
        std = self.train.inputs.std(0)
        return torch.where(std > 0, std, torch.ones_like(std))  # constant features (blank pixels) stay as they are

    def shape(self) -> DataShape:
        return DataShape(
            "tabular",
            num_classes=self.num_classes,
            num_features=self.num_features,
            feature_mean=self.feature_mean,
            feature_std=self.feature_std,
        )

    def describe(self) -> dict:
        return {
            "task_reason": self.task_reason or "auto",
            "num_features": self.num_features,
            "num_classes": self.num_classes,
            "train_samples": len(self.train),
            "data_path": "arrow (memory-mapped), read per batch" if self.stats else "in-memory tensors",
        }


def loader_workers(data: Dataset, cfg: TrainConfig) -> int:
    """--num-workers, or for auto (-1) what the split asks for: AUTO_WORKERS (images: 1, else 0)."""
    return cfg.data.num_workers if cfg.data.num_workers >= 0 else getattr(data, "AUTO_WORKERS", 0)


def make_loader(data: Dataset, cfg: TrainConfig, shuffle: bool) -> DataLoader:
    workers = loader_workers(data, cfg)
    persistent = cfg.data.persistent_workers and workers > 0
    if isinstance(
        data, IterableDataset
    ):  # a stream (stream.py) yields whole batches and shuffles through its own buffer
        return DataLoader(
            data, batch_size=None, num_workers=workers, pin_memory=cfg.data.pin_memory, persistent_workers=persistent
        )
    return DataLoader(
        data,
        batch_size=cfg.optim.batch_size,
        shuffle=shuffle,
        collate_fn=keep_batch,
        num_workers=workers,
        pin_memory=cfg.data.pin_memory,
        persistent_workers=persistent,
        # Its own generator, so starting an epoch does not draw from the global RNG that dropout
        # uses: a run resumed mid-epoch then sees exactly the random numbers the original saw.
        generator=torch.Generator().manual_seed(cfg.run.seed) if shuffle else None,
    )


# --------------------------------------------------------------------------- loading


def load_splits(cfg: TrainConfig, given=None):
    """Load, validate and split the dataset named by cfg.data.dataset (or `given`, a datasets Dataset or
    DatasetDict). A table of numbers becomes DataSplits, images ImageSplits. ConfigError on bad data.
    What the trainer should say at start (skipped files, a label that looks like a quantity) is in `.notes`."""
    from .images import ImageFolder

    if given is None and cfg.data.dataset == "synthetic":
        return _synthetic(cfg)
    folder = ImageFolder.scan(cfg.data.dataset) if given is None else None
    if folder is not None:
        folder.check_classes()  # before reading: one class folder is one line, not a missing 'label' column
    raw, source = (
        _load_raw(cfg.data.dataset, cfg.data.streaming, folder)
        if given is None
        else (given, f"{type(given).__name__} object")
    )
    data = _load_classification(cfg, _named_splits(raw), source)
    if folder is not None:
        data.skipped_files = folder.skipped
    notes = [folder.note() if folder else None, quantity_warning(data, cfg)]
    data.notes += [note for note in notes if note]
    return data


def _load_classification(cfg: TrainConfig, splits: dict, source: str):
    """Splits of a table of numbers (in memory or in Arrow), of images, or streamed."""
    from .arrow import load_arrow_splits, table_megabytes
    from .images import image_column, load_image_splits

    if cfg.data.streaming:
        from .stream import load_stream_splits

        return load_stream_splits(cfg, {name: _as_stream(ds) for name, ds in splits.items()}, source)
    column = image_column(splits["train"], cfg)
    if column is not None:
        return load_image_splits(cfg, splits, source, _classify_only(cfg, "images", column))
    inputs = _check_columns(splits, cfg, source)
    if table_megabytes(splits, inputs) > cfg.data.max_in_memory_mb:
        return load_arrow_splits(cfg, splits, source, _classify_only(cfg, "tables over --max-in-memory-mb", inputs))
    tensors = {name: _to_tensors(ds, cfg, source, name) for name, ds in splits.items()}
    task, reason = settle_task(cfg, tensors["train"][1])
    input_columns = cfg.data.input_columns or [c for c in splits["train"].column_names if c not in label_columns(cfg)]
    if task != "classify":
        return _target_splits(task, reason, tensors, cfg, source, input_columns)
    num_classes, string_ids = _num_classes(tensors, cfg, source)
    feature_names = next(iter(tensors.values()))[2]
    class_names = list(string_ids) if string_ids is not None else list(feature_names) if feature_names else None
    tensors = {name: (x, _label_ids(y, string_ids)) for name, (x, y, _) in tensors.items()}
    present = torch.unique(tensors["train"][1])
    if len(present) < 2:
        raise ConfigError(
            f"--label-column: every training row of {source} has the same label ({present.tolist()[0]}); a classifier "
            "needs at least 2 classes to learn"
        )
    return _finish(tensors, cfg, num_classes, source, class_names, input_columns, reason=reason)


def _classify_only(cfg: TrainConfig, what: str, passed=None):
    """Regression and multi-label read tables held in memory; images and larger tables are classified."""
    if cfg.data.task in ("regress", "multilabel"):
        raise ConfigError(f"--task {cfg.data.task} reads tables in memory; {what} are classified (--task classify)")
    return passed


def _target_splits(task: str, reason: str, tensors: dict, cfg: TrainConfig, source: str, columns: list) -> DataSplits:
    """Regression and multi-label splits: targets made (targets.py), missing splits carved, then standardised."""
    labels = {name: y for name, (_, y, _) in tensors.items()}
    if task == "regress":
        targets = {name: regression_values(y, cfg, source, name) for name, y in labels.items()}
        names = None
    else:
        targets, names = multi_hot(labels, cfg, source)
    parts = carve({name: (x, targets[name]) for name, (x, _, _) in tensors.items()}, cfg, source)
    extra = {}
    if task == "regress":
        parts, mean, std = standardised(parts)
        extra = {"target_names": label_columns(cfg), "target_mean": mean, "target_std": std}
    facts = {"source": source, "class_names": names, "input_columns": columns, "task": task, "task_reason": reason}
    return _splits(parts, num_classes=parts["train"][1].shape[1], **facts, **extra)


QUANTITY_DISTINCT = 20  # a numeric label with more distinct training values than this,
QUANTITY_SHARE = 0.1  # and than this share of the training rows, looks like a quantity, not a class id
SPARSE_IDS = 2  # as do integer ids that make this many times more classes than there are distinct values


def quantity_warning(data, cfg: TrainConfig) -> str | None:
    """A warning when a numeric label (no strings, no ClassLabel, no --num-classes) looks like a
    quantity to regress: many distinct training values relative to the rows, or ids spread so thin
    that num_classes (max + 1) is far above the distinct count. Streams are not looked at."""
    labels = getattr(data.train, "targets", None)
    if getattr(data, "task", "classify") != "classify":
        return None  # the labels already chose regression or multi-label
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


def _as_stream(ds):
    import datasets

    return ds.to_iterable_dataset() if isinstance(ds, datasets.Dataset) else ds


def _load_raw(name: str, streaming: bool = False, folder=None):
    """A Dataset/DatasetDict for a name or path; with streaming, IterableDataset(Dict) where datasets can stream it.
    A folder of images (images.ImageFolder, `folder` when already scanned) is read with datasets' imagefolder."""
    import datasets

    from .images import ImageFolder

    datasets.disable_progress_bars()  # one tqdm bar per run is enough
    if name == "digits":
        return datasets.Dataset.from_parquet(str(DIGITS_PATH)), "digits (bundled UCI handwritten digits)"
    if name == "shakespeare-speakers":
        from .speakers import NUM_SPEAKERS, load_speakers

        return load_speakers(), f"{name} (bundled Tiny Shakespeare: who speaks, {NUM_SPEAKERS} speakers)"
    path = Path(name).expanduser()
    try:
        if path.is_dir():
            if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
                return datasets.load_from_disk(str(path)), str(path)
            if folder or ImageFolder.scan(name):  # by its images, not by its most common suffix (a stray notes.txt)
                return datasets.load_dataset("imagefolder", data_dir=str(path), streaming=streaming), str(path)
            return datasets.load_dataset(str(path), streaming=streaming), str(path)
        if path.is_file():
            builder = FILE_BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise ConfigError(
                    f"--dataset: {name}: unsupported file type '{path.suffix}' (use {', '.join(FILE_BUILDERS)} or a "
                    "save_to_disk folder)"
                )
            if path.stat().st_size == 0:
                raise ConfigError(f"--dataset: {name} is empty")
            return datasets.load_dataset(builder, data_files=str(path), streaming=streaming), str(path)
    except ConfigError:
        raise
    except Exception as e:  # datasets/pyarrow raise many kinds for unreadable files
        if "corresponds to no data" in str(e):
            raise ConfigError(f"--dataset: {name} has no rows") from None
        raise ConfigError(f"--dataset: cannot read {name}: {first_line(e)}") from None
    if path.suffix.lower() in FILE_BUILDERS or name.startswith((".", "/", "~")):
        raise ConfigError(f"--dataset: file not found: {name}")
    try:
        return datasets.load_dataset(name, streaming=streaming), f"hub:{name}"
    except Exception as e:
        raise ConfigError(
            f"--dataset: '{name}' is not a local file or folder, and loading it from the hub failed: {first_line(e)}"
        ) from None


def _named_splits(raw) -> dict:
    """Map a Dataset or DatasetDict onto train/validation/test; absent ones are carved from train later."""
    import datasets

    if isinstance(raw, (datasets.Dataset, datasets.IterableDataset)):
        return {"train": raw}
    if not isinstance(raw, (datasets.DatasetDict, datasets.IterableDatasetDict, dict)):
        raise ConfigError(f"dataset: expected a datasets.Dataset or DatasetDict, got {type(raw).__name__}")
    names = {k.lower(): k for k in raw}
    if "train" not in names:
        if len(raw) != 1:
            raise ConfigError(f"--dataset: no 'train' split among {', '.join(raw.keys())}")
        return {"train": next(iter(raw.values()))}
    out = {"train": raw[names["train"]]}
    for alias in VALIDATION_NAMES:
        if alias in names:
            out["validation"] = raw[names[alias]]
            break
    if "test" in names:
        out["test"] = raw[names["test"]]
    return out


def _check_columns(splits: dict, cfg: TrainConfig, source: str) -> list[str]:
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
            _numeric_rows(first[c])
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
            col = _numeric_rows(table[c])
        except (ValueError, TypeError, pa.ArrowException):
            raise ConfigError(
                f"--input-columns: column '{c}' of {source} is not numeric (or its lists differ in length)"
            ) from None
        if not np.isfinite(col).all():
            raise ConfigError(f"--dataset: column '{c}' of {source} ({split} split) has NaN or infinite values")
        parts.append(col)
    features = torch.from_numpy(np.concatenate(parts, axis=1))
    labels = read_labels(table, cfg)
    names = getattr(ds.features[label_columns(cfg)[0]], "names", None)
    return features, labels, names


def _numeric_rows(column: pa.ChunkedArray) -> np.ndarray:
    """A numeric column, scalar or (nested) fixed-length lists, as float32 rows x values."""
    rows, values = len(column), column.combine_chunks()
    while (
        pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or pa.types.is_fixed_size_list(values.type)
    ):
        lengths = pc.list_value_length(values)
        if values.null_count or (len(lengths) and pc.min_max(lengths)["min"] != pc.min_max(lengths)["max"]):
            raise ValueError("missing or ragged lists")
        values = values.flatten()
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_boolean(values.type)):
        raise TypeError(f"{values.type} is not numeric")
    return values.to_numpy(zero_copy_only=False).astype(np.float32).reshape(rows, -1)


def _num_classes(tensors: dict, cfg: TrainConfig, source: str) -> tuple[int, dict | None]:
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
        if any(not np.all(np.isfinite(y)) or not np.all(y == np.round(y)) for y in labels):
            raise ConfigError(
                f"--label-column: '{cfg.data.label_column}' of {source} must hold integer class ids or strings"
            )
    elif labels[0].dtype.kind not in "iub":
        raise ConfigError(
            f"--label-column: '{cfg.data.label_column}' of {source} must hold integer class ids or strings"
        )
    low = min(int(y.min()) for y in labels)
    high = max(int(y.max()) for y in labels)
    num_classes = cfg.data.num_classes or (len(names) if names else high + 1)
    if low < 0 or high >= num_classes:
        raise ConfigError(
            f"--label-column: labels of {source} range over [{low}, {high}], outside the {num_classes} classes [0, "
            f"{num_classes - 1}]"
        )
    if num_classes < 2:
        raise ConfigError(f"--label-column: {source} has a single class; a classifier needs at least 2")
    return num_classes, None


def _label_ids(labels: np.ndarray, ids: dict | None) -> torch.Tensor:
    if ids is not None:
        return torch.tensor([ids[str(v)] for v in labels], dtype=torch.long)
    return torch.from_numpy(labels.astype(np.int64))


def _synthetic(cfg: TrainConfig) -> DataSplits:
    """A learnable classification set: Gaussian clusters around random class centres."""
    g = torch.Generator().manual_seed(cfg.run.seed)
    centres = torch.randn(cfg.data.synthetic_classes, cfg.data.synthetic_features, generator=g)
    labels = torch.randint(cfg.data.synthetic_classes, (cfg.data.synthetic_samples,), generator=g)
    features = centres[labels] + 1.5 * torch.randn(cfg.data.synthetic_samples, cfg.data.synthetic_features, generator=g)
    data = cfg.data
    source = f"synthetic ({data.synthetic_samples} x {data.synthetic_features}, {data.synthetic_classes} classes)"
    return _finish({"train": (features, labels)}, cfg, cfg.data.synthetic_classes, source)


def labelled_rows(splits: dict, cfg: TrainConfig, source: str) -> tuple[dict, int, list[str] | None]:
    """Rows that stay in Arrow (arrow.py, images.py): labels read and checked into tensors, missing
    splits carved from train. Returns ({split: (rows, labels)}, number of classes, class names)."""
    labelled = {}
    for name, ds in splits.items():
        labels = ds.with_format("arrow")[cfg.data.label_column].to_numpy()
        labelled[name] = (ds, labels, getattr(ds.features[cfg.data.label_column], "names", None))
    num_classes, string_ids = _num_classes(labelled, cfg, source)
    names = next(iter(labelled.values()))[2]
    parts = carve(
        {name: (ds, _label_ids(y, string_ids)) for name, (ds, y, _) in labelled.items()},
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


def carve(parts: dict, cfg: TrainConfig, source: str, take=lambda x, idx: x[idx]) -> dict:
    """Carve the missing validation/test splits from train with a seeded permutation; parts maps
    split -> (inputs, labels tensor), and take(inputs, idx) selects rows of the inputs."""
    x, y = parts["train"]
    fractions = {
        name: getattr(cfg.data, f"{'val' if name == 'validation' else 'test'}_fraction")
        for name in ("validation", "test")
        if name not in parts
    }
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(cfg.run.seed))
    start = 0
    for name, fraction in fractions.items():
        count = math.floor(len(y) * fraction)
        if count == 0:
            raise ConfigError(
                f"--dataset: {source} has no {name} split and {name} fraction {fraction} of {len(y)} rows leaves it "
                "empty"
            )
        idx = order[start : start + count]
        parts[name] = (take(x, idx), y[idx])
        start += count
    if start:
        idx = order[start:].sort().values  # keep the remaining training rows in their original order
        parts["train"] = (take(x, idx), y[idx])
    for name, (_, labels) in parts.items():
        if len(labels) == 0:
            raise ConfigError(f"--dataset: the {name} split of {source} is empty")
    return parts


def _finish(
    tensors: dict,
    cfg: TrainConfig,
    num_classes: int,
    source: str,
    class_names: list[str] | None = None,
    input_columns: list[str] | None = None,
    reason: str = "",
) -> DataSplits:
    facts = {"source": source, "class_names": class_names, "input_columns": input_columns, "task_reason": reason}
    return _splits(carve(tensors, cfg, source), num_classes=num_classes, **facts)


def _splits(parts: dict, **facts) -> DataSplits:
    """DataSplits of carved {split: (inputs, targets)} tensors."""
    pairs = [TensorPairs(*parts[name]) for name in ("train", "validation", "test")]
    return DataSplits(*pairs, num_features=parts["train"][0].shape[1], **facts)
