"""Images: an `Image` column of a datasets table (parquet with image bytes, a hub dataset) or an
imagefolder (one subfolder per class), kept Arrow-backed and memory-mapped, decoded per batch.

A batch is read from Arrow, decoded by datasets' `Image` feature, converted to one mode
(grayscale or RGB), resized to --image-size, augmented when training (Pillow's crop-after-padding
and mirror), and normalised per channel with the training split's statistics. All of it happens
in `ImageRows.__getitems__`, so in the DataLoader's worker processes when --num-workers > 0.

Augmentation is a function of (seed, epoch, sample index): every draw comes from a generator
seeded by those three numbers. The same run therefore sees the same augmented images with 0 or
N workers, on 1 or N ranks, and after a resume (the epoch and position are in the checkpoint).
(torchvision's transforms.v2 would be the usual choice, but no torchvision build installs beside
the CPU build of torch 2.13 this project pins: PyPI's fails with 'operator torchvision::nms does
not exist'. Pillow is what datasets decodes with anyway.)

An image that cannot be decoded stops the run with one line naming its file (exit 2); the
checkpoints saved so far stay. Most are found before training: the statistics pass decodes up to
STATS_SAMPLE training images spread over the split.

A folder is an image folder when it holds images and no tables (`ImageFolder.scan`); it is read
with datasets' imagefolder whatever else it holds. Its other files (a stray notes.txt) are
skipped, and counted in a start-up line and in the summary's `skipped_files`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from ..config import ConfigError, TrainConfig
from ..shape import DataShape
from .splits import BatchRows, Splits

STATS_SAMPLE = 1000  # training images decoded to choose the mode and size and to measure mean/std
GRAY_MODES = ("1", "L", "LA", "I", "I;16", "F")


class BadImage(ConfigError):
    """An image that cannot be decoded. Raised in a DataLoader worker, it comes back with the worker's
    traceback folded into its message: that is cut back to the one line."""

    def __init__(self, message: str):
        lines = message.strip().splitlines()
        super().__init__(lines[-1].split(": ", 1)[-1] if len(lines) > 1 else message)


def image_column(ds, cfg: TrainConfig) -> str | None:
    """The dataset's Image column (None for a table of numbers); ConfigError when ambiguous."""
    import datasets

    images = [name for name, feature in ds.features.items() if isinstance(feature, datasets.Image)]
    if cfg.data.input_columns:
        images = [c for c in images if c in cfg.data.input_columns]
        if images and len(cfg.data.input_columns) > 1:
            raise ConfigError(f"--input-columns: an image column ({images[0]}) must be the only input column")
    if len(images) > 1:
        raise ConfigError(f"--input-columns: the dataset has several image columns ({', '.join(images)}); name one")
    return images[0] if images else None


def decode(value: dict, where: str):
    """datasets' decoding (EXIF orientation included); a failure names the file, or the row."""
    import datasets

    try:
        return datasets.Image().decode_example(value)
    except Exception as e:  # noqa: BLE001 - PIL raises several kinds for broken files
        name = value.get("path") or where
        raise BadImage(
            f"--dataset: cannot decode image {name} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from None


class ImageRows(BatchRows):
    """One split: Arrow-backed rows (images stay encoded) and the labels, turned into a batch of
    float tensors (batch, channels, size, size) only when the DataLoader asks for one."""

    def auto_workers(self, local_processes: int = 1) -> int:
        return auto_image_workers(local_processes)

    def __init__(
        self,
        rows,
        column: str,
        targets: torch.Tensor,
        split: str,
        look: ImageLook,
        augment: tuple[str, ...] = (),
        seed: int = 0,
    ):
        self.rows = rows.select_columns([column]).cast_column(
            column, undecoded()
        )  # bytes/paths: decoded here, per batch
        self.column, self.targets, self.split = column, targets, split
        self.look, self.augment, self.seed = look, tuple(augment), seed
        # In shared memory: DataLoader workers kept alive between epochs (--persistent-workers) read the new epoch too.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """The augmentation of an epoch is drawn from (seed, epoch, index); the loop calls this before each."""
        self._epoch.fill_(epoch)

    def __getitems__(self, indices: list[int]):
        values = self.rows[list(indices)][self.column]
        inputs = self.look.batch(values, indices, self.split, self.augment, self.seed, self.epoch)
        return inputs, self.targets[torch.as_tensor(indices)]


def auto_image_workers(local_processes: int = 1) -> int:
    """--num-workers auto for images: one worker decodes while the step runs, where it gets a core of
    its own: beside a GPU, or when this machine's cores outnumber the training processes' torch
    threads. Otherwise the worker takes the cores the step computes on: on 2 cores and 2 threads,
    0 workers trained 10-15 % faster than 1 or 2, though the step then waits ~22 % of its time for
    decoding (docs/benchmarks.md, "Images")."""
    if torch.cuda.is_available():
        return 1
    busy = torch.get_num_threads() * local_processes
    return 1 if len(os.sched_getaffinity(0)) > busy else 0


def undecoded():
    import datasets

    return datasets.Image(decode=False)


def augmented(image, augment: tuple[str, ...], rng: np.random.Generator):
    """Random crop after zero-padding by size/8 (4 pixels at 32) and a horizontal flip half the time."""
    from PIL import ImageOps

    if "crop" in augment:
        pad = max(1, image.width // 8)
        left, top = (int(v) for v in rng.integers(0, 2 * pad + 1, size=2))
        image = ImageOps.expand(image, border=pad, fill=0).crop((left, top, left + image.width, top + image.height))
    if "flip" in augment and rng.random() < 0.5:
        image = ImageOps.mirror(image)
    return image


@dataclass
class ImageLook:
    """What every image of the run is turned into: mode, size, and the per-channel normalisation."""

    mode: str  # "L" or "RGB"
    size: int
    mean: torch.Tensor  # (channels,) in [0, 1] units, from the training split
    std: torch.Tensor

    @property
    def channels(self) -> int:
        return 1 if self.mode == "L" else 3

    def fit(self, image):
        from PIL import Image

        if image.mode != self.mode:
            image = image.convert(self.mode)
        if image.size != (self.size, self.size):
            image = image.resize((self.size, self.size), Image.Resampling.BILINEAR)
        return image

    def pixels(
        self, value: dict, index: int, split: str, augment: tuple[str, ...], seed: int, epoch: int
    ) -> np.ndarray:
        """One image as uint8 (size, size, channels): decoded, converted, resized, augmented."""
        image = self.fit(decode(value, f"row {index} of the {split} split"))
        if augment:
            image = augmented(image, augment, np.random.default_rng((seed, epoch, index)))
        array = np.asarray(image, dtype=np.uint8)
        return array[..., None] if array.ndim == 2 else array

    def batch(
        self, values: list[dict], indices, split: str, augment: tuple[str, ...] = (), seed: int = 0, epoch: int = 0
    ) -> torch.Tensor:
        """Encoded images (datasets' {"bytes", "path"}) with their sample indices -> one normalised float batch."""
        return self.normalise(
            np.stack([self.pixels(v, int(i), split, augment, seed, epoch) for v, i in zip(values, indices)])
        )

    def normalise(self, pixels: np.ndarray) -> torch.Tensor:
        """uint8 (batch, size, size, channels) -> float (batch, channels, size, size), standardised per channel."""
        x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float().div_(255.0)
        return x.sub_(self.mean.view(1, -1, 1, 1)).div_(self.std.view(1, -1, 1, 1)).contiguous()


def sample_values(rows, column: str) -> tuple[list[dict], list[int]]:
    """Up to STATS_SAMPLE encoded training images spread over the split, with their row numbers."""
    count = len(rows)
    picks = np.unique(np.linspace(0, count - 1, min(count, STATS_SAMPLE)).round().astype(np.int64)).tolist()
    return rows.select_columns([column]).cast_column(column, undecoded())[picks][column], picks


def measure_look(values: list[dict], picks: list[int], cfg: TrainConfig, source: str) -> ImageLook:
    """Mode, size and per-channel mean/std from a sample of training images."""
    images = [decode(v, f"row {i} of the train split of {source}") for v, i in zip(values, picks)]
    mode = "L" if all(im.mode in GRAY_MODES for im in images) else "RGB"
    size = cfg.data.image_size or max(images[0].size)
    look = ImageLook(mode, size, torch.zeros(1), torch.ones(1))
    pixels = np.stack([np.asarray(look.fit(im), dtype=np.float64).reshape(size, size, -1) / 255.0 for im in images])
    mean, std = pixels.mean(axis=(0, 1, 2)), pixels.std(axis=(0, 1, 2))
    look.mean = torch.tensor(mean, dtype=torch.float32)
    look.std = torch.tensor(np.where(std > 0, std, 1.0), dtype=torch.float32)  # a blank channel stays as it is
    return look


def image_facts(look: ImageLook) -> dict:
    """What summary.json says of the images, and (image_look) what predict needs to prepare new ones the same way."""
    return {
        "image_size": look.size,
        "image_mode": look.mode,
        "image_mean": look.mean.tolist(),
        "image_std": look.std.tolist(),
    }


def look_metadata(look: ImageLook) -> dict:
    """What predict needs to prepare new images as the run's were (saved with the weights)."""
    return {"image_look": {"mode": look.mode, "size": look.size, "mean": look.mean.tolist(), "std": look.std.tolist()}}


def load_image_splits(cfg: TrainConfig, splits: dict, source: str, column: str) -> Splits:
    """Labels checked and held in memory; images stay in Arrow. Missing splits are carved from train."""
    from .targets import labelled_rows

    for name, ds in splits.items():
        if len(ds) == 0:
            raise ConfigError(f"--dataset: the {name} split of {source} is empty")
        if cfg.data.label_column not in ds.column_names:
            raise ConfigError(
                f"--label-column: column '{cfg.data.label_column}' not in {source} (columns: "
                f"{', '.join(ds.column_names)})"
            )
    parts, num_classes, class_names = labelled_rows(splits, cfg, source)
    look = measure_look(*sample_values(parts["train"][0], column), cfg, source)
    rows = {
        name: ImageRows(ds, column, y, name, look, tuple(cfg.data.augment) if name == "train" else (), cfg.run.seed)
        for name, (ds, y) in parts.items()
    }
    facts = {
        "num_classes": num_classes,
        "train_samples": len(rows["train"]),
        **image_facts(look),
        "augment": list(rows["train"].augment),
        "data_path": "arrow (memory-mapped), images decoded per batch",
    }
    shape = DataShape("image", num_classes=num_classes, channels=look.channels, image_size=look.size)
    return Splits.of(
        rows, shape, source, class_names=class_names, input_columns=[column], facts=facts, metadata=look_metadata(look)
    )


def predict_images(dataset: str, columns: list[str], saved: dict) -> tuple[torch.Tensor, object, str]:
    """`anytrain predict`'s images of the run's image column, prepared as in training without augmentation:
    converted, resized and normalised."""
    from .sources import rows_to_predict

    ds, source = rows_to_predict(dataset)
    if columns[0] not in ds.column_names:
        raise ConfigError(
            f"--dataset: {source} lacks the run's image column {columns[0]} (it has {', '.join(ds.column_names)})"
        )
    look = ImageLook(saved["mode"], saved["size"], torch.tensor(saved["mean"]), torch.tensor(saved["std"]))
    rows = ImageRows(ds, columns[0], torch.zeros(len(ds), dtype=torch.long), "predict", look)
    batches = [rows.__getitems__(list(range(i, min(i + 256, len(ds)))))[0] for i in range(0, len(ds), 256)]
    return torch.cat(batches), ds, source
