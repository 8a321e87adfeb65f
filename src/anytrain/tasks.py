"""What differs between tasks, and nothing else: the data, the model, the loss and the metrics.

The loop in trainer.py is the same for both. A batch is `(inputs, targets)`, the model maps
inputs to logits, and the loss is cross-entropy of the logits against the targets:

- classify: inputs are feature rows, images, or texts as token ids padded to the batch's longest
  (data/textcls.py), targets one class id per sample, logits (batch, classes);
- lm: inputs are windows of block_size token ids, targets the same windows shifted by one
  token, logits (batch, block_size, vocabulary): next-token cross-entropy over every position.

Evaluation is written once for both (`evaluate`, `per_sample`): each sample's mean loss and accuracy over its
positions (one position for a class label, block_size for a window).
"""

from __future__ import annotations

import json
import math

import torch
from torch import nn
from torch.nn import functional as F

from .config import TrainConfig
from .shape import DataShape
from .usermodel import make_model


def per_sample(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's mean cross-entropy and accuracy over its target positions (shape: batch)."""
    losses = F.cross_entropy(outputs.flatten(0, -2).float(), targets.flatten(), reduction="none")
    hits = outputs.argmax(-1) == targets
    return losses.view(len(targets), -1).mean(1), hits.view(len(targets), -1).float().mean(1)


def evaluate(model: nn.Module, batches, gather=None) -> dict:
    """Mean loss and accuracy over a split of (inputs, targets) batches. With several processes,
    `gather` is accelerator.gather_for_metrics: it is given per-sample values, so it can drop the
    samples padded into the last batch, and the result equals a single-process evaluation."""
    model.eval()
    totals, count = None, 0
    with torch.no_grad():
        for inputs, targets in batches:
            losses, hits = per_sample(model(inputs), targets)
            if gather is not None:
                losses, hits = gather((losses, hits))
            batch = torch.stack(
                [losses.double().sum(), hits.double().sum()]
            )  # summed on the device: no host sync per batch
            totals = batch if totals is None else totals + batch
            count += len(hits)
    loss_sum, hit_sum = totals.tolist()
    return {"loss": loss_sum / count, "accuracy": hit_sum / count, "samples": count}


class TokenCrossEntropy(nn.Module):
    """Next-token cross-entropy averaged over every position of every window."""

    def forward(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, 1), targets.flatten())


def model_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class Task:
    """What every task shares: the model is built from the model section and the data's shape, and
    rebuilt for inference from the shape saved with the weights."""

    name: str

    def build_model(self, cfg: TrainConfig, data, given=None) -> nn.Module:
        return make_model(cfg.model, data.shape(), given)

    def model_from_metadata(self, cfg: TrainConfig, meta: dict, given=None) -> nn.Module:
        shape = DataShape.from_json(meta["data_shape"]) if "data_shape" in meta else self.legacy_shape(cfg, meta)
        return make_model(cfg.model, shape, given)

    def legacy_shape(self, cfg: TrainConfig, meta: dict) -> DataShape:
        """The shape of a run saved before data_shape was stored with the weights."""
        raise NotImplementedError

    def run_files(self, data) -> dict:
        """{name: text} the run folder needs besides the weights: a BPE run's tokenizer.json."""
        vocab = getattr(data, "vocab", None)
        return vocab.files() if vocab is not None else {}


class Classification(Task):
    name = "classify"

    def load_data(self, cfg: TrainConfig, given=None):
        if cfg.data.text_column:  # text to classify
            from .data.textcls import load_text_class_splits

            return load_text_class_splits(cfg, given)
        from .data import load_splits

        return load_splits(cfg, given)

    def criterion(self) -> nn.Module:
        return nn.CrossEntropyLoss()

    def eval_metrics(self, loss: float, accuracy: float) -> dict:
        return {"loss": loss, "accuracy": accuracy}

    def rates(self, samples: int, tokens: int, seconds: float) -> dict:
        return {"samples_per_s": samples / seconds if seconds > 0 else None}

    def describe_data(self, data, model: nn.Module) -> dict:
        return {**data.describe(), "parameters": model_parameters(model)}

    def weights_metadata(self, data) -> dict:
        shape = data.shape()
        extra = {"class_names": json.dumps(data.class_names)} if data.class_names else {}
        if data.input_columns:
            extra["input_columns"] = json.dumps(data.input_columns)
        if shape.kind == "image":  # what predict needs to prepare new images the same way
            look = data.look
            extra["image_look"] = json.dumps(
                {"mode": look.mode, "size": look.size, "mean": look.mean.tolist(), "std": look.std.tolist()}
            )
        elif shape.kind == "tokens":  # and to tokenise new texts the same way (max_length is in the shape)
            extra["vocab"] = data.vocab.to_json()
        else:
            extra["num_features"] = str(data.num_features)
        return {"data_shape": shape.to_json(), "num_classes": str(data.num_classes), **extra}

    def legacy_shape(self, cfg: TrainConfig, meta: dict) -> DataShape:
        return DataShape("tabular", num_classes=int(meta["num_classes"]), num_features=int(meta["num_features"]))


class LanguageModel(Task):
    name = "lm"

    def load_data(self, cfg: TrainConfig, given=None):
        from .data.text import load_text_splits

        return load_text_splits(cfg, given)

    def criterion(self) -> nn.Module:
        return TokenCrossEntropy()

    def eval_metrics(self, loss: float, accuracy: float) -> dict:
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "accuracy": accuracy}

    def rates(self, samples: int, tokens: int, seconds: float) -> dict:
        if seconds <= 0:
            return {"samples_per_s": None, "tokens_per_s": None}
        return {"samples_per_s": samples / seconds, "tokens_per_s": tokens / seconds}

    def describe_data(self, data, model: nn.Module) -> dict:
        described = {**data.describe(), "parameters": model_parameters(model)}
        if hasattr(model, "flops_per_token"):  # the registry's GPT (MFU in benchmarks/lm_gpu.py)
            described.update(parameters=model.num_parameters(), flops_per_token=model.flops_per_token())
        return described

    def weights_metadata(self, data) -> dict:
        return {"vocab": data.vocab.to_json(), "data_shape": data.shape().to_json()}

    def legacy_shape(self, cfg: TrainConfig, meta: dict) -> DataShape:
        from .data.text import Vocab

        return DataShape("text", vocab_size=Vocab.from_json(meta["vocab"]).size, block_size=cfg.data.block_size)


TASKS = {"classify": Classification(), "lm": LanguageModel()}


def get_task(cfg: TrainConfig) -> Task:
    return TASKS[cfg.data.task]


def vocab_of(meta: dict, folder):
    """The tokenizer saved with a text run's weights (a BPE's tokenizer.json is in `folder`, beside
    them); None for a run on numbers or images."""
    from .data.tokenizer import read_tokenizer

    return read_tokenizer(meta["vocab"], folder) if "vocab" in meta else None
