"""The base of the tasks on labelled data (classify, regress, multilabel and the transformers classifiers of texts
and images): what two or more of them share, so that none imports another.

`Labelled` is the task base of classify, regress and multilabel: the model from the model section and the data's
shape, rebuilt for inference from the shape saved with the weights, and predict's reading of new rows (numbers,
images or texts, as the run trained on); `tables_only` is regress's and multilabel's refusal of text. Two parts,
not tasks: `LogitPredictions`, predict's batch of every labelled task (one forward pass, its logits turned into
rows by the task's `predictions`), and `ClassIds`, what a classifier over class ids computes, composed by classify
(beside Labelled) and by the transformers classifiers hf_text.py and hf_image/ (beside Transformers).
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from ..best import HIGHER, LOWER
from ..config import ConfigError, TrainConfig
from ..data.splits import Splits
from ..data.targets import CLASSES
from ..models import LABELLED
from ..shape import DataShape
from ..usermodel import make_model
from .base import means, per_position, predicted_logits
from .contract import Task


class LogitPredictions(abc.ABC):
    """predict's batch of a labelled task (a part, not a task): one forward pass over new rows, its logits turned into
    the rows predict prints by the task's own `predictions`."""

    def predict_batch(self, model: nn.Module, inputs, meta: dict) -> list[dict]:
        return self.predictions(predicted_logits(model, inputs), meta)

    @abc.abstractmethod
    def predictions(self, outputs: torch.Tensor, meta: dict) -> list[dict]: ...  # what predict prints per row


class Labelled(LogitPredictions, Task):
    offers = frozenset({"predict"})
    labelled = True
    label_form: ClassVar[str] = CLASSES  # what its labels hold (data.targets): class ids, values or lists

    def load_data(self, given=None) -> Splits:
        from ..data.tables import load_labelled

        self.data = load_labelled(self.cfg, given, self.label_form)
        return self.data

    def build_model(self, given=None) -> nn.Module:
        shape = self.data.shape
        return make_model(self.cfg.model, shape, given, self.example_targets(shape, 2))

    def model_from_metadata(self, meta: dict, given=None) -> nn.Module:
        shape = meta["data_shape"] if "data_shape" in meta else self.legacy_shape(meta)
        return make_model(self.cfg.model, shape, given, self.example_targets(shape, 2))

    @classmethod
    def detect(cls, source) -> str | None:
        """The training labels hold what this task learns (data.targets: values, lists), said as why."""
        form = source.labels
        return f"auto: {form[1]}" if form is not None and form[0] == cls.label_form else None

    @classmethod
    def fits(cls, cfg: TrainConfig) -> tuple[tuple[str, ...] | None, str]:
        return LABELLED, f"--task {cls.name}"

    @classmethod
    def positions(cls, cfg: TrainConfig) -> str | None:
        return "max_length" if cfg.data.text_column else None

    def legacy_shape(self, meta: dict) -> DataShape:
        """The shape of a run saved before data_shape was stored with the weights."""
        return DataShape("tabular", num_classes=meta["num_classes"], num_features=meta["num_features"])

    def predict_inputs(self, dataset: str, meta: dict, folder: Path) -> tuple:
        """(inputs, the file's rows, its name): numbers, images or texts, prepared as the run's were."""
        from ..data.tables import predict_rows

        if "input_columns" not in meta:
            raise ConfigError(
                f"run_dir: no input columns were saved with {folder} (trained on generated data, or by an older "
                "anytrain)"
            )
        columns = meta["input_columns"]
        if "image_look" in meta:
            from ..data.images import predict_images

            return predict_images(dataset, columns, meta["image_look"])
        shape = meta.get("data_shape")
        if shape is not None and shape.kind == "tokens":
            from ..data.textcls import predict_texts
            from ..data.tokenizer import read_tokenizer

            return predict_texts(dataset, columns, read_tokenizer(meta["vocab"], folder), shape.max_length)
        return predict_rows(dataset, columns, meta.get("num_features"))


def tables_only(cfg: TrainConfig, name: str) -> None:
    """regress and multilabel learn from tables of numbers, not text."""
    if cfg.data.text_column:
        raise ConfigError(
            f"--task {name} learns from tables of numbers; text (--text-column) is classified (--task classify) "
            "or modelled (--task lm)"
        )


class ClassIds(LogitPredictions):
    """What a classifier over class ids computes, composed by classify and the transformers classifiers (a part, not
    a task): it reads labels, fits any data it is offered (labels of class ids or names, or none to read: images,
    streams, generated data), cross-entropy, each sample's loss and correctness, their means, example targets,
    predict's rows."""

    labelled = True
    goals = {"loss": LOWER, "accuracy": HIGHER}
    headline = "accuracy"

    @classmethod
    def detect(cls, source) -> str | None:
        return "auto"

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets)

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        return per_position(outputs, targets)

    def metrics(self, sums: dict, count: int) -> dict:
        return means(sums, count)

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return torch.zeros(batch, dtype=torch.long)

    def predictions(self, outputs: torch.Tensor, meta: dict) -> list[dict]:
        """What predict prints for a classifier's rows: the most likely class, its name and probability."""
        names = meta.get("class_names")
        best, ids = outputs.float().softmax(-1).max(-1)
        return [
            {"class_id": k, "class_name": names[k] if names else None, "probability": p}
            for k, p in zip(ids.tolist(), best.tolist())
        ]
