"""The contract every task fills in (`Task`), the defaults most tasks share (`BaseTask`), and what the
loop does the same way for every task: the training loss it calls, the one-batch loss check, and
evaluation.

A task owns what differs between tasks and nothing else: reading and checking its data (returning
data.splits.Splits), the model (a registry or user factory, or a transformers Auto class), the loss,
the metrics, what is saved with the weights, what `anytrain predict` prints, what `anytrain sample`
writes, and files exported at the end. The loop in trainer.py is the same for every task.

A model may return an object or dict with a `loss` (the transformers convention; it is given the
targets as `labels=` or `targets=` when its forward takes one): the loop then trains on that loss.
`--loss module:fn` (or `loss_fn=` from Python) trains on your own `fn(outputs, targets) -> scalar`.
Validation and test metrics, early stopping included, always use the task's own per-sample loss.

Evaluation is written once (`evaluate`): the task turns a batch into per-sample statistics, those
are gathered over ranks (dropping padded samples) and summed, and the task turns the sums into metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import nn
from torch.nn import functional as F

from ..best import HIGHER, LOWER, Criterion
from ..config import ConfigError, TrainConfig, first_line
from ..data.splits import Splits
from ..shape import DataShape
from ..usermodel import import_factory, logits_of, loss_of


@runtime_checkable
class Task(Protocol):
    """What the trainer, `anytrain predict`, `anytrain sample` and load_model ask of a task. A task is
    made with the (settled) config, `Task(cfg)`; after load_data it keeps what it derived from the data
    (a tokenizer, target statistics, a transformers config)."""

    name: str  # the --task it trains: classify, regress, multilabel, lm, ...
    cfg: TrainConfig
    targets_to_model: bool  # the loop passes the targets to a model whose forward takes them (its own loss)
    goals: dict[str, str]  # every metric `metrics` returns, and which way it improves (best.HIGHER or LOWER)
    headline: str  # the metric users judge the task by: the best weights' and early stopping's by default

    def load_data(self, given=None) -> Splits: ...  # read, check, split; ConfigError (one line) on bad data
    def build_model(self, given=None) -> nn.Module: ...  # the model to train, checked on a batch of 2
    def model_from_metadata(self, meta: dict, given=None) -> nn.Module: ...  # the model saved weights load into
    def loss(self, outputs, targets: torch.Tensor) -> torch.Tensor: ...  # the task's training loss (a scalar)
    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]: ...  # with a "loss"
    def eval_batch(self, model: nn.Module, inputs, targets: torch.Tensor, forward: Callable) -> dict: ...  # per sample
    def metrics(self, sums: dict[str, torch.Tensor], count: int) -> dict[str, float]: ...  # with a "loss"
    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor: ...  # to check a model and a loss
    def train_batches(self, batches: Iterable, loader, epoch: int, skipped: int) -> Iterable: ...  # + what a step adds
    def rates(self, samples: int, tokens: int, seconds: float) -> dict: ...  # samples/s (and tokens/s for text)
    def describe_data(self, model: nn.Module) -> dict: ...  # the data's and the model's facts for summary.json
    def weights_metadata(self) -> dict[str, str]: ...  # what reloading and predict need, saved with the weights
    def predict_inputs(self, dataset: str, meta: dict, folder: Path) -> tuple: ...  # (inputs, rows, source)
    def predict_batch(self, model: nn.Module, inputs, meta: dict) -> list[dict]: ...  # what predict prints per row
    def predictions(self, outputs: torch.Tensor, meta: dict) -> list[dict]: ...  # ... from a batch's logits
    def sample(self, model: nn.Module, folder: Path, meta: dict, prompt: str, settings: dict) -> str: ...
    def export(self, model: nn.Module, run_dir: Path) -> None: ...  # files beside model.safetensors at the end


class BaseTask:
    """The defaults: no per-step additions to a batch, samples/s (and tokens/s where the data counts
    tokens), the data's facts and the parameter count, the data's metadata, no sampling, no export."""

    name = ""
    key = ""  # its registry line, set by tasks.make_task
    data: Splits
    targets_to_model = True
    goals: dict[str, str] = {"loss": LOWER}
    headline = "loss"

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg

    # what every task must say for itself (the contract's other half has defaults below)
    def load_data(self, given=None) -> Splits:
        raise NotImplementedError

    def build_model(self, given=None) -> nn.Module:
        raise NotImplementedError

    def model_from_metadata(self, meta: dict, given=None) -> nn.Module:
        raise NotImplementedError

    def loss(self, outputs, targets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def metrics(self, sums: dict[str, torch.Tensor], count: int) -> dict[str, float]:
        raise NotImplementedError

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        raise NotImplementedError

    def train_batches(self, batches: Iterable, loader, epoch: int, skipped: int) -> Iterable:
        return batches

    def eval_batch(self, model: nn.Module, inputs, targets: torch.Tensor, forward: Callable) -> dict:
        """Per-sample statistics of one evaluation batch: of the forward pass (a generating task also generates)."""
        return self.per_sample(forward(model, inputs, targets), targets)

    def rates(self, samples: int, tokens: int, seconds: float) -> dict:
        """samples/s; for text also tokens/s, as samples/s x the training samples' mean number of real tokens
        (exact over whole epochs; the padding a batch adds is not counted)."""
        per_second = samples / seconds if seconds > 0 else None
        per_sample = self.data.tokens_per_sample
        if per_sample is None:
            return {"samples_per_s": per_second}
        return {"samples_per_s": per_second, "tokens_per_s": per_second and per_second * per_sample}

    def describe_data(self, model: nn.Module) -> dict:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return {**self.data.facts, "parameters": model_parameters(model), "trainable_parameters": trainable}

    def weights_metadata(self) -> dict[str, str]:
        """The data's shape and facts (metadata), its classes and input columns."""
        import json

        data = self.data
        meta = {"data_shape": data.shape.to_json(), "num_classes": str(data.num_classes)}
        if data.class_names:
            meta["class_names"] = json.dumps(data.class_names)
        if data.input_columns:
            meta["input_columns"] = json.dumps(data.input_columns)
        return {**meta, **data.metadata}

    def predict_inputs(self, dataset: str, meta: dict, folder: Path) -> tuple:
        raise ConfigError(f"a {self.name} run has no predictions for rows")

    def predict_batch(self, model: nn.Module, inputs, meta: dict) -> list[dict]:
        """One forward pass (a dict of inputs, a transformers run's, as keyword arguments), then `predictions`."""
        from ..usermodel import forward_for

        return self.predictions(logits_of(forward_for(model)(model, inputs, None)), meta)

    def predictions(self, outputs: torch.Tensor, meta: dict) -> list[dict]:
        raise ConfigError(f"a {self.name} run has no predictions for rows")

    def sample(self, model: nn.Module, folder: Path, meta: dict, prompt: str, settings: dict) -> str:
        raise ConfigError(
            f"run_dir: {folder} is a {self.name} run; sampling needs a language-model run (--task lm) or seq2seq"
        )

    def export(self, model: nn.Module, run_dir: Path) -> None:
        """Nothing beyond model.safetensors."""


def best_criterion(task: Task) -> Criterion:
    """What picks the best validation: --best-metric, by default (auto) the task's headline metric."""
    metric = task.headline if task.cfg.eval.best_metric == "auto" else task.cfg.eval.best_metric
    return Criterion(metric, task.goals[metric] == HIGHER)


# --------------------------------------------------------------------------- the loss the loop trains on


def training_loss(task: Task, user_loss: Callable | None = None) -> Callable:
    """The loss the loop trains on: the model's own when it returns one, else `--loss` or the task's."""
    base = user_loss or task.loss

    def loss(outputs, targets):
        own = loss_of(outputs)
        return own if own is not None else base(logits_of(outputs), targets)

    return loss


def user_loss_function(spec: str) -> Callable:
    """--loss module:fn or file.py:fn -> the function; ConfigError naming --loss when it cannot be imported."""
    try:
        fn = import_factory(spec)
    except ConfigError as err:
        raise ConfigError(str(err).replace("--model", "--loss", 1)) from None
    return fn


def check_loss(loss: Callable, model: nn.Module, task: Task, shape: DataShape, forward: Callable, who: str) -> None:
    """One forward pass and one loss on a batch of 2, whatever the model returns or its forward takes (eval
    mode: no dropout, so no random numbers drawn): the loss must be a finite float scalar that requires grad.
    `who` names the option to blame: --loss, or --model for a model's own loss."""
    inputs, targets = shape.example_inputs(2), task.example_targets(shape, 2)
    was_training = model.training
    model.eval()
    try:
        value = loss(forward(model, inputs, targets), targets)
    except Exception as e:  # noqa: BLE001 - the user's loss (or model): one line, not its traceback
        raise ConfigError(f"{who}: computing the loss on a batch of 2 failed: {first_line(e)}") from None
    finally:
        model.train(was_training)
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.dtype.is_floating_point:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ConfigError(f"{who}: the loss must be a scalar float tensor; got {got}")
    if not torch.isfinite(value.detach()):
        raise ConfigError(f"{who}: the loss on a batch of 2 is {value.item()} before any training")
    if not value.requires_grad:
        raise ConfigError(f"{who}: the loss does not require grad: it is not computed from the model's weights")


# --------------------------------------------------------------------------- evaluation


def evaluate(model: nn.Module, batches, task: Task, gather=None, forward: Callable | None = None) -> dict:
    """The task's metrics over a split of (inputs, targets) batches. With several processes, `gather`
    is accelerator.gather_for_metrics: it is given per-sample values, so it can drop the samples
    padded into the last batch, and the result equals a single-process evaluation."""
    forward = forward or (lambda m, inputs, targets: m(inputs))
    model.eval()
    sums, count = None, 0
    with torch.no_grad():
        for inputs, targets in batches:
            stats = task.eval_batch(model, inputs, targets, forward)
            if gather is not None:
                stats = gather(stats)
            batch = {k: v.double().sum(0) for k, v in stats.items()}  # summed on the device: no host sync per batch
            sums = batch if sums is None else {k: sums[k] + batch[k] for k in sums}
            count += len(stats["loss"])
    if sums is None:
        raise ConfigError("evaluation: a split has no batches")
    metrics = task.metrics({k: v.cpu() for k, v in sums.items()}, count)
    if "loss" not in metrics or not metrics.keys() <= task.goals.keys():  # each metric's direction is declared
        raise TypeError(f"task {task.name}: metrics() returned {sorted(metrics)}, its goals name {sorted(task.goals)}")
    return {**metrics, "samples": count}


def per_position(outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each sample's mean cross-entropy and accuracy over its target positions (one for a class, block_size
    for a window); a model that returned only its own loss gets that batch-mean loss for each sample."""
    logits = logits_of(outputs)
    if logits is None:
        return {"loss": loss_of(outputs).detach().float().expand(len(targets))}
    losses = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), reduction="none")
    hits = logits.argmax(-1) == targets
    return {"loss": losses.view(len(targets), -1).mean(1), "accuracy": hits.view(len(targets), -1).float().mean(1)}


def means(sums: dict, count: int) -> dict:
    return {k: v.item() / count for k, v in sums.items()}


def model_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
