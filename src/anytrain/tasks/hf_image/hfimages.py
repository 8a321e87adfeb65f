"""Images for a transformers vision model (tasks/hf_image/): read as for any image classifier (a folder
with one subfolder per class, or a dataset with an Image column; labels checked and the missing splits
carved, data/targets.py), kept encoded in Arrow, and prepared per batch by the model's own image
processor (AutoImageProcessor from the model's folder: its resize, rescale and normalisation), as
transformers' run_image_classification prepares them for evaluation. No augmentation: the processor's
preparation alone, so a batch is a function of its rows only."""

from __future__ import annotations

from pathlib import Path

import torch

from ...config import ConfigError, TrainConfig, first_line
from ...data.images import auto_image_workers, decode, image_column, undecoded
from ...data.sources import ImageFolder, named_splits, open_dataset, rows_to_predict
from ...data.splits import BatchRows, Splits
from ...data.targets import labelled_rows
from ...shape import DataShape

PROCESSOR_FILE = "preprocessor_config.json"


def load_processor(folder: str):
    """The model's image processor (its own preparation of images); one line naming --model without one."""
    from transformers import AutoImageProcessor
    from transformers.utils import logging

    if Path(folder).is_dir() and not (Path(folder) / PROCESSOR_FILE).is_file():
        raise ConfigError(
            f"--model hf:{folder}: no {PROCESSOR_FILE} in this folder: a vision model's image processor is saved "
            "beside it (image_processor.save_pretrained)"
        )
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # without torchvision it says it uses its PIL backend, as intended here
    try:
        return AutoImageProcessor.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"--model hf:{folder}: its image processor does not load ({first_line(e)})") from None
    finally:
        logging.set_verbosity(verbosity)


class ProcessedImages(BatchRows):
    """One split: rows in Arrow (images encoded) and labels; a batch is ({"pixel_values"}, labels), the images
    decoded and prepared by the processor only when the DataLoader asks for them."""

    def auto_workers(self, local_processes: int = 1) -> int:
        return auto_image_workers(local_processes)

    def __init__(self, rows, column: str, targets: torch.Tensor, processor, mode: str, split: str):
        self.rows = rows.select_columns([column]).cast_column(column, undecoded())
        self.column, self.targets, self.processor, self.mode, self.split = column, targets, processor, mode, split

    def __getitems__(self, indices: list[int]):
        values = self.rows[list(indices)][self.column]
        images = [decode(v, f"row {i} of the {self.split} split").convert(self.mode) for i, v in zip(indices, values)]
        pixels = self.processor(images, return_tensors="pt")["pixel_values"]
        return {"pixel_values": pixels}, self.targets[torch.as_tensor(indices)]


def image_splits(cfg: TrainConfig, processor, channels: int, given=None) -> Splits:
    """The images and labels, checked and carved; batches prepared by `processor` for a `channels`-channel model."""
    folder = ImageFolder.scan(cfg.data.dataset) if given is None else None
    if folder is not None:
        folder.check_classes()
    raw, source = open_dataset(cfg.data.dataset, folder=folder) if given is None else (given, "datasets object")
    splits = named_splits(raw)
    column = image_column(splits["train"], cfg)
    if column is None:
        raise ConfigError(f"--dataset: {source} holds no images (an image folder, or a dataset with an Image column)")
    parts, num_classes, class_names = labelled_rows(splits, cfg, source)
    mode = "RGB" if channels == 3 else "L"
    rows = {name: ProcessedImages(ds, column, y, processor, mode, name) for name, (ds, y) in parts.items()}
    size = pixel_size(processor)
    facts = {
        "num_classes": num_classes,
        "train_samples": len(rows["train"]),
        "image_processor": type(processor).__name__,
        "image_size": size,
        "data_path": "arrow (memory-mapped), images prepared per batch by the model's image processor",
    }
    if folder is not None:
        facts["skipped_files"] = folder.skipped
    shape = DataShape("image", num_classes=num_classes, channels=channels, image_size=size)
    notes = [folder.note()] if folder is not None and folder.note() else []
    return Splits.of(rows, shape, source, class_names=class_names, input_columns=[column], facts=facts, notes=notes)


def pixel_size(processor) -> int:
    """The side of the square the processor resizes to (its `size`: height/width or shortest_edge)."""
    size = getattr(processor, "size", None)
    if isinstance(size, int):
        return size
    for key in ("height", "shortest_edge"):  # a dict, or transformers 5's SizeDict
        value = size.get(key) if isinstance(size, dict) else getattr(size, key, None)
        if value:
            return int(value)
    return 0


def predict_images(dataset: str, column: str, processor, channels: int) -> tuple[ProcessedImages, object, str]:
    """`anytrain predict`'s images of the run's image column, prepared by the run's own image processor."""
    ds, source = rows_to_predict(dataset)
    if column not in ds.column_names:
        raise ConfigError(
            f"--dataset: {source} lacks the run's image column {column} (it has {', '.join(ds.column_names)})"
        )
    targets = torch.zeros(len(ds), dtype=torch.long)
    return ProcessedImages(ds, column, targets, processor, "RGB" if channels == 3 else "L", "predict"), ds, source
