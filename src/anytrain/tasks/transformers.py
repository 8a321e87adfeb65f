"""What every transformers task (`--model hf:FOLDER_OR_ID`) shares: the model's own tokenizer loaded from
its folder, the model loaded with the task's Auto class under a config checked against the data
(hf.py), the weights reloadable from the transformers config saved with them, `save_pretrained` into
run_dir/hf at the end, predict tokenising with that folder's tokenizer, and the token-weighted loss
(`TokenWeighted`: its sum over the batch's share of the step's target tokens) for tasks whose loss is a mean
over tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F

from .. import lora
from ..best import HIGHER, LOWER
from ..config import TrainConfig
from ..data.splits import Splits
from ..hf import Head
from ..shape import IGNORE
from ..usermodel import logits_of
from .contract import Task


class Transformers(Task):
    """A transformers task's model, tokenizer, metadata, export and predict inputs: the base of the transformers
    classifiers, taggers, masked and encoder-decoder LMs and the reward model (the causal LMs stand on
    tasks/causal_lm/task.py, which composes this module's functions). Its loss, metrics and predictions are the
    task's own, or composed from a labelled base (HFClassification(ClassIds, Transformers)). `head` names the
    transformers model class the task trains (hf.Head)."""

    head: Head
    offers = frozenset({"export"})

    @classmethod
    def settle(cls, cfg: TrainConfig) -> tuple[TrainConfig, tuple[str, ...]]:
        return fitted_max_length(cls.head, cfg)

    @classmethod
    def positions(cls, cfg: TrainConfig) -> str | None:
        return "max_length" if cls.head.positions else None

    def load_data(self, given=None) -> Splits:
        from .. import hf
        from ..data.hftext import load_hf_splits

        self.tokenizer = hf.load_tokenizer(self.cfg)
        self.data = load_hf_splits(self.cfg, self.tokenizer, given, **self.texts(), multiple=self.run.pad_multiple)
        self.model_config = self.checked_config(self.tokenizer.pad_token_id)
        return self.data

    def texts(self) -> dict:
        """Which column load_hf_splits tokenises, with class labels or not, each text whole or not."""
        return {"column": self.cfg.data.text_column, "labelled": self.head.labelled}

    def checked_config(self, pad_id: int | None):
        """The model's transformers config for this task and data, checked before anything is written."""
        labels = None
        if self.head.labelled:  # the classes, from the data
            data = self.data
            labels = data.class_names or [str(k) for k in range(data.num_classes)]
        return checked_config(self.cfg, self.head, self.name, pad_id, getattr(self, "tokenizer", None), labels)

    def build_model(self, given=None) -> nn.Module:
        from .. import hf

        model = hf.load_model(self.cfg, self.head, self.model_config)
        if self.cfg.model.gradient_checkpointing:
            hf.checkpoint_activations(model)
        if self.cfg.model.lora_r:  # the weights frozen, adapters beside them trained
            model = lora.wrap(model, lora.settings(self.cfg), self.head.auto_class, self.say)
        return model

    def model_from_metadata(self, meta: dict, given=None) -> nn.Module:
        return model_from_metadata(self.head, meta)

    def describe_data(self, model: nn.Module) -> dict:
        from ..hf import checkpoints_activations

        return {**super().describe_data(model), "gradient_checkpointing": checkpoints_activations(model)}

    def weights_metadata(self) -> dict:
        return saved_metadata(self.cfg, self.data, self.model_config)

    def export(self, model: nn.Module, run_dir: Path) -> None:
        export(self.cfg, model, self.tokenizer, run_dir)

    def predict_inputs(self, dataset: str, meta: dict, folder: Path) -> tuple:
        from ..data.hftext import predict_hf_texts
        from ..hf import tokenizer_of_run

        return predict_hf_texts(dataset, meta["input_columns"], tokenizer_of_run(folder), meta["data_shape"].max_length)


# --------------------------------------------------------------------------- what every transformers task composes


def fitted_max_length(head: Head, cfg: TrainConfig) -> tuple[TrainConfig, tuple[str, ...]]:
    """--max-length left at its default, fitted to the model's positions (a model with 128 positions trains on 128
    tokens rather than being refused)."""
    if not head.positions or "max_length" in cfg.given:
        return cfg, ()
    from .. import hf

    positions = hf.max_positions(hf.read_config(hf.check_folder(cfg)))
    if positions is None or positions >= cfg.data.max_length:
        return cfg, ()
    default = cfg.data.max_length
    note = f"--max-length {positions}: the positions of {cfg.model.name} (the default {default} exceeds them)"
    return cfg.replace(max_length=positions), (note,)


def checked_config(cfg: TrainConfig, head: Head, task: str, pad_id: int | None, tokenizer, labels=None):
    """The model's transformers config for the task (and its labels), its vocabulary checked against the tokenizer."""
    from .. import hf

    config = hf.model_config(cfg, head, task, pad_id, labels)
    if tokenizer is not None:
        hf.check_vocabulary(cfg, tokenizer, config)
    return config


def model_from_metadata(head: Head, meta: dict) -> nn.Module:
    """The model a run's saved weights load into: its transformers config, with its LoRA adapters where it had some."""
    from .. import hf

    return lora.rebuild(hf.model_from_config(head, meta["hf_config"]), meta, head.auto_class)


def saved_metadata(cfg: TrainConfig, data: Splits, model_config) -> dict[str, Any]:
    """What reloading needs, saved with the weights: the data's shape, the transformers config, the classes."""
    from ..hf import FOLDER

    config = model_config.to_json_string(use_diff=False)  # load_model rebuilds the model from it
    meta: dict[str, Any] = {"data_shape": data.shape, "hf_config": config, "hf": FOLDER}
    if data.num_classes:
        meta["class_names"] = data.class_names or [str(k) for k in range(data.num_classes)]
    return {**meta, **lora.metadata(cfg), "input_columns": data.input_columns}


def export(cfg: TrainConfig, model: nn.Module, tokenizer, run_dir: Path, use_cache: bool | None = None) -> None:
    """The model into run_dir/hf (save_pretrained) with its tokenizer; with LoRA the adapter into run_dir/adapter and
    the merged model into run_dir/hf. `use_cache`: the config's as loaded (a causal LM trains without its cache)."""
    from .. import hf

    if cfg.model.lora_r:
        model = lora.export(model, run_dir)
    if use_cache is not None:
        cast(Any, model).config.use_cache = use_cache  # generating wants its cache again
    hf.save_pretrained(model, tokenizer, run_dir)


def token_sums(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per row of (B, T, V) logits and (B, T) targets (IGNORE: none): summed loss, target tokens, correct ones."""
    losses = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE, reduction="none")
    real = targets != IGNORE
    return {"token_loss": losses.sum(1), "tokens": real.sum(1), "hits": ((logits.argmax(-1) == targets) & real).sum(1)}


def with_row_loss(sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """per_sample's answer: each row's mean loss over its target tokens, beside the sums."""
    return {"loss": sums["token_loss"] / sums["tokens"].clamp(min=1), **sums}


class TokenWeighted(Transformers):
    """A transformers task whose loss it computes itself from the model's logits (the model is not given the
    labels: BERT's and T5's own losses are plain per-batch means): the sum of the cross-entropy over the
    batch's target tokens (label -100: none) divided by its step's share of target tokens (step_shares),
    so the step's gradient is that of the mean over all its tokens on any number of ranks and accumulation
    steps. Evaluation: the mean over every target token of the split, and the accuracy of its tokens."""

    targets_to_model = False
    step_shares = True  # the loss: loss_sum over the batch's share of its step's target tokens (ctx.share)
    goals = {"loss": LOWER, "accuracy": HIGHER}

    def loss_sum(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, -2).float(), targets.flatten(), ignore_index=IGNORE, reduction="sum")

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss_sum(outputs, targets) / (targets != IGNORE).sum().clamp(min=1)

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        return with_row_loss(token_sums(logits_of(outputs).float(), targets))

    def metrics(self, sums: dict, count: int) -> dict:
        tokens = max(sums["tokens"].item(), 1)
        loss = sums["token_loss"].item() / tokens
        return {"loss": loss, "accuracy": sums["hits"].item() / tokens}
