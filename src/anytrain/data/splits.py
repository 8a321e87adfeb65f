"""The one type every task's data loading returns (`Splits`), the batch-at-a-time datasets behind it,
and the DataLoader each split is read through.

A split is a map-style dataset whose `__getitems__` returns a whole batch `(inputs, targets)` (one
index operation instead of a Python row at a time), or a stream (stream.py) that yields whole batches.
"""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler, SequentialSampler

from ..config import TrainConfig
from ..shape import DataShape
from ..shares import Rounds


class Rows(Dataset):
    """One split, as the loop reads it: every split a task's data loading returns is one (map-style rows read
    through a DataLoader, or a stream of batches). The loop tells it each epoch; it says how many DataLoader
    workers --num-workers auto gives it, and whether the loader shuffles its rows (False: they order themselves
    each epoch, as grpo's rollout slots do)."""

    shuffled = True

    def set_epoch(self, epoch: int) -> None:
        """The epoch's own random draws (image augmentation, masks); none by default (the sampler shuffles)."""

    def auto_workers(self, local_processes: int = 1) -> int:
        """DataLoader workers for --num-workers auto: none (the step uses the cores); images ask for some.
        `local_processes`: the launch's processes on this machine (RunFacts), which share its cores."""
        return 0


@runtime_checkable
class TargetRows(Protocol):
    """Rows of a token-weighted task: how many target tokens each row holds (numpy, one count a row)."""

    @property
    def targets_per_row(self) -> np.ndarray: ...


def targets_of(rows: Rows) -> np.ndarray:
    """The target-token count of each row; TypeError for rows that do not count them."""
    if not isinstance(rows, TargetRows):
        raise TypeError(f"{type(rows).__name__} does not count its rows' target tokens (targets_per_row)")
    return rows.targets_per_row


class BatchRows(Rows):
    """A split read a whole batch at a time: subclasses hold `targets` and define `__getitems__`."""

    targets: torch.Tensor

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index):
        inputs, targets = self.__getitems__([index])
        return inputs[0], targets[0]

    def __getitems__(self, indices: list[int]):
        raise NotImplementedError


class TensorPairs(BatchRows):
    """(features, labels) tensors; `__getitems__` lets the DataLoader fetch a whole batch at once."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor):
        self.inputs, self.targets = inputs, targets

    def __getitem__(self, index):
        return self.inputs[index], self.targets[index]

    def __getitems__(self, indices: list[int]):
        index = torch.as_tensor(indices)
        return self.inputs[index], self.targets[index]


@dataclass(frozen=True)
class TargetStats:
    """Numeric targets standardised with the training split's statistics (regression): per target column."""

    mean: list[float]
    std: list[float]
    names: list[str]

    def to_json(self) -> str:
        import json

        return json.dumps({"mean": self.mean, "std": self.std, "names": self.names})

    @classmethod
    def from_json(cls, text: str) -> TargetStats:
        import json

        stats = json.loads(text)
        return cls(stats["mean"], stats["std"], stats["names"])


@dataclass
class Splits:
    """A task's data: three splits and what the rest of the run needs to know about them.

    shape      what a model is told about the data (shape.py), the same for every task
    source     the dataset, as the start-up line and summary.json name it
    facts      the data's facts for summary.json (sizes, tokenizer, image look, data path)
    metadata   saved with the weights: what reloading and `anytrain predict` need (Python values, written as
               strings by weights_meta.py)
    files      {name: text} written in the run folder at start (a BPE's tokenizer.json)
    notes      lines the trainer prints at start (skipped files, a label that looks like a quantity)
    tokenizer  text: the tokenizer its ids come from (tokenizer.Vocab or BPE, or a transformers tokenizer)
    tokens_per_sample  real tokens per training sample, for tokens/s (None: not text)
    target_stats  standardised numeric targets: their training statistics (None: targets are not standardised)
    """

    train: Rows
    validation: Rows
    test: Rows | None
    shape: DataShape
    source: str
    class_names: list[str] | None = None  # string labels (sorted: id i is the i-th) or a ClassLabel's names
    input_columns: list[str] | None = None  # the columns a row's inputs come from, as predict reads them
    facts: dict = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tokenizer: object = None
    tokens_per_sample: float | None = None
    target_stats: TargetStats | None = None

    @classmethod
    def of(cls, rows: dict, shape: DataShape, source: str, **facts) -> Splits:
        """Splits of {"train", "validation", "test"} rows (a stream may have no test split)."""
        return cls(rows["train"], rows["validation"], rows.get("test"), shape, source, **facts)

    @property
    def num_classes(self) -> int:
        return self.shape.num_classes

    @property
    def num_features(self) -> int:
        return self.shape.num_features


def keep_batch(batch):
    """collate_fn: `__getitems__` already returns a stacked batch."""
    return batch


def loader_workers(data: Rows, cfg: TrainConfig, local_processes: int = 1) -> int:
    """--num-workers, or for auto (-1) what the split asks for (images: 1, else 0), given the launch's processes on
    this machine (RunFacts.local_processes)."""
    return cfg.data.num_workers if cfg.data.num_workers >= 0 else data.auto_workers(local_processes)


def make_loader(data: Rows, cfg: TrainConfig, shuffle: bool, local_processes: int = 1) -> DataLoader:
    """A split's loader; `shuffle`: the training split's, its batches the epoch's Rounds (shares.py: the last round
    split as it falls over the processes, never a row twice), shuffled unless its rows order themselves."""
    workers = loader_workers(data, cfg, local_processes)
    persistent = cfg.data.persistent_workers and workers > 0
    if isinstance(data, IterableDataset):  # a stream (stream.py) yields whole batches and shuffles in its buffer
        return DataLoader(
            data, batch_size=None, num_workers=workers, pin_memory=cfg.data.pin_memory, persistent_workers=persistent
        )
    if not shuffle:
        return DataLoader(
            data,
            batch_size=cfg.optim.batch_size,
            collate_fn=keep_batch,
            num_workers=workers,
            pin_memory=cfg.data.pin_memory,
            persistent_workers=persistent,
        )
    # Its own generator, so starting an epoch does not draw from the global RNG that dropout
    # uses: a run resumed mid-epoch then sees exactly the random numbers the original saw.
    generator = torch.Generator().manual_seed(cfg.run.seed) if data.shuffled else None
    rows = cast(Sized, data)  # a map-style split has a length
    sampler = RandomSampler(rows, generator=generator) if data.shuffled else SequentialSampler(rows)
    return DataLoader(
        data,
        batch_sampler=Rounds(sampler, cfg.optim.batch_size),
        collate_fn=keep_batch,
        num_workers=workers,
        pin_memory=cfg.data.pin_memory,
        persistent_workers=persistent,
        generator=generator,
    )
