"""`--streaming`: the dataset is read as a stream (datasets' IterableDataset), never downloaded
whole or converted to a cache first, for datasets bigger than the disk.

The main process reads the stream; accelerate's DataLoaderDispatcher (what `prepare` makes of an
iterable loader) hands every rank its slice of each global batch, so every sample is trained on
once per epoch, whatever the number of ranks (the last global batch is completed with samples
from the first, as for map-style data). An epoch is one pass over the stream. The training
stream is shuffled through a buffer (datasets' `shuffle(seed, buffer_size)`), reshuffled every
epoch with `set_epoch`, so a run is reproducible and resumable (accelerate skips the batches
already trained on by reading past them).

What a stream cannot give is its length or statistics up front, so: --max-steps sets the
schedule's length (required); the dataset must bring its own validation split; the class count
comes from a ClassLabel feature or --num-classes; the tabular mean/std (and an image run's mode,
size and normalisation) are measured on the first STATS_ROWS training rows.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch.utils.data import IterableDataset

from ..config import ConfigError, TrainConfig
from ..shape import DataShape
from .splits import Rows, Splits

SHUFFLE_BUFFER = 10_000  # rows held to shuffle the training stream
STATS_ROWS = 10_000  # first training rows used for the statistics (images: images.STATS_SAMPLE)


class StreamBatches(IterableDataset, Rows):
    """A datasets IterableDataset read in batches and converted to (inputs, targets) tensors."""

    def __init__(self, stream, batch_size: int, convert, split: str):
        self.stream, self.batch_size, self.convert, self.split = stream, batch_size, convert, split
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The shuffle buffer's order (and an image's augmentation) is a function of (seed, epoch)."""
        self.epoch = epoch
        self.stream.set_epoch(epoch)

    def __iter__(self):
        position = 0  # the sample's index in this epoch's stream: its augmentation draw
        for rows in self.stream.iter(batch_size=self.batch_size):
            count = len(rows[next(iter(rows))])
            yield self.convert(rows, range(position, position + count), self.split, self.epoch)
            position += count


def _label_batch(rows: dict, cfg: TrainConfig, num_classes: int, split: str) -> torch.Tensor:
    labels = np.asarray(rows[cfg.data.label_column])
    if labels.dtype.kind not in "iu" or (len(labels) and (labels.min() < 0 or labels.max() >= num_classes)):
        raise ConfigError(
            f"--label-column: the {split} stream has labels outside the integer classes [0, {num_classes - 1}]"
        )
    return torch.from_numpy(labels.astype(np.int64))


def load_stream_splits(cfg: TrainConfig, splits: dict, source: str) -> Splits:
    from .images import image_column, image_facts, look_metadata, undecoded

    if "validation" not in splits:
        raise ConfigError(
            f"--streaming: {source} has no validation split, and a stream cannot be carved (add one, or drop "
            "--streaming)"
        )
    splits = {
        name: ds if ds.features else ds._resolve_features() for name, ds in splits.items()
    }  # some builders know columns only after a peek
    features = splits["train"].features
    if cfg.data.label_column not in features:
        raise ConfigError(
            f"--label-column: column '{cfg.data.label_column}' not in {source} (columns: {', '.join(features)})"
        )
    names = getattr(features[cfg.data.label_column], "names", None)
    num_classes = cfg.data.num_classes or (len(names) if names else 0)
    if num_classes < 2:
        raise ConfigError(
            "--num-classes: a stream's classes cannot be counted up front; give --num-classes (or use a ClassLabel "
            f"column) for {source}"
        )
    column = image_column(splits["train"], cfg)
    inputs = [column] if column else cfg.data.input_columns or [c for c in features if c != cfg.data.label_column]
    streams = {name: ds.select_columns([*inputs, cfg.data.label_column]) for name, ds in splits.items()}
    if column:  # images stay encoded until a batch is converted
        streams = {name: ds.cast_column(column, undecoded()) for name, ds in streams.items()}
    head = list(itertools.islice(iter(streams["train"]), STATS_ROWS))
    look, shape = _measure_head(head, inputs, column, num_classes, cfg, source)

    def convert(rows: dict, indices: range, split: str, epoch: int):
        targets = _label_batch(rows, cfg, num_classes, split)
        if look is not None:
            augment = tuple(cfg.data.augment) if split == "train" else ()
            return look.batch(rows[column], indices, split, augment, cfg.run.seed, epoch), targets
        return torch.from_numpy(_rows_to_array(rows, inputs)), targets

    streams["train"] = streams["train"].shuffle(seed=cfg.run.seed, buffer_size=SHUFFLE_BUFFER)
    batches = {name: StreamBatches(ds, cfg.optim.batch_size, convert, name) for name, ds in streams.items()}
    facts = {"num_classes": num_classes, "data_path": "stream (rank 0 reads, accelerate dispatches)"}
    facts.update(image_facts(look) if look is not None else {"num_features": shape.num_features})
    metadata = look_metadata(look) if look is not None else {"num_features": shape.num_features}
    return Splits.of(
        batches,
        shape,
        source,
        class_names=list(names) if names else None,
        input_columns=inputs,
        facts=facts,
        metadata=metadata,
    )


def _measure_head(
    head: list[dict], inputs: list[str], column: str | None, num_classes: int, cfg: TrainConfig, source: str
):
    """(image look or None, DataShape) from the first rows of the training stream."""
    from .images import STATS_SAMPLE, measure_look

    if column:
        values = [r[column] for r in head[:STATS_SAMPLE]]
        look = measure_look(values, list(range(len(values))), cfg, source)
        return look, DataShape("image", num_classes=num_classes, channels=look.channels, image_size=look.size)
    x = _rows_to_array({c: [r[c] for r in head] for c in inputs}, inputs)
    std = x.std(0, ddof=1) if len(x) > 1 else np.ones(x.shape[1])
    mean, std = (
        torch.tensor(x.mean(0), dtype=torch.float32),
        torch.tensor(np.where(std > 0, std, 1.0), dtype=torch.float32),
    )
    return None, DataShape(
        "tabular", num_classes=num_classes, num_features=x.shape[1], feature_mean=mean, feature_std=std
    )


def _rows_to_array(rows: dict, inputs: list[str]) -> np.ndarray:
    """Columns of numbers or fixed-length lists of numbers -> float32 (rows, features)."""
    try:
        parts = [np.asarray(rows[c], dtype=np.float32).reshape(len(rows[c]), -1) for c in inputs]
    except (ValueError, TypeError):
        raise ConfigError(
            f"--input-columns: the columns {', '.join(inputs)} of the stream are not all numeric (or their lists "
            "differ in length)"
        ) from None
    x = np.concatenate(parts, axis=1)
    if not np.isfinite(x).all():
        raise ConfigError("--dataset: the stream has NaN or infinite values")
    return x
