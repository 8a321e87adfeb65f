"""What the loop does the same way for every task (the contract is contract.Task): the training loss it
calls, the one-batch loss check, and evaluation.

A model may return an object or dict with a `loss` (the transformers convention; it is given the
targets as `labels=` or `targets=` when its forward takes one): the loop then trains on that loss.
`--loss module:fn` (or `loss_fn=` from Python) trains on your own `fn(outputs, targets) -> scalar`.
Validation and test metrics, early stopping included, always use the task's own per-sample loss (a task whose
`goals` name no "loss", grpo, has no evaluation loss: its validation and test metrics are its others alone).

Evaluation is written once (`evaluate`): the task turns a batch into per-sample statistics, those
are gathered over ranks (dropping padded samples) and summed, and the task turns the sums into metrics.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..best import HIGHER, Criterion
from ..config import ConfigError, first_line
from ..shape import DataShape
from ..usermodel import import_factory, logits_of, loss_of
from . import is_own
from .contract import Task


def best_criterion(task: Task) -> Criterion:
    """What picks the best validation: --best-metric, by default (auto) the task's headline metric."""
    metric = task.headline if task.cfg.eval.best_metric == "auto" else task.cfg.eval.best_metric
    return Criterion(metric, task.goals[metric] == HIGHER)


# --------------------------------------------------------------------------- the loss the loop trains on


def training_loss(task: Task, user_loss: Callable | None = None) -> Callable:
    """The loss the loop trains on, `loss(outputs, targets, share=None)`: the model's own when it returns one,
    else `--loss`, else the task's: Task.loss, or for a batch with a step share (Task.step_shares)
    Task.loss_sum divided by it."""

    def loss(outputs, targets, share=None):
        own = loss_of(outputs)
        if own is not None:
            return own
        if user_loss is not None:
            return user_loss(logits_of(outputs), targets)
        if share:  # a step_shares task: its sum over the batch's counted items, over the batch's share of the step
            return task.loss_sum(logits_of(outputs), targets) / share
        return task.loss(logits_of(outputs), targets)

    return loss


def user_loss_function(spec: str) -> Callable:
    """--loss module:fn or file.py:fn -> the function; ConfigError naming --loss when it cannot be imported."""
    try:
        fn = import_factory(spec)
    except ConfigError as err:
        raise ConfigError(str(err).replace("--model", "--loss", 1)) from None
    return fn


def loss_owner(task: Task, model: str, user_loss: Callable | None) -> str:
    """Whom a bad loss on the batch of 2 is blamed on: --loss, your own task's loss (--task FILE.py:Class),
    else --model (a registry task's loss is given what the model returned)."""
    if user_loss is not None:
        return "--loss"
    if is_own(task.key):
        return f"--task {task.key}'s loss"
    return f"--model {model}"


def step_loss(loss, task: Task) -> torch.Tensor:
    """What task.train_step returned, checked to be the batch's scalar float loss (shapes only: no host sync);
    else one line naming the task's train_step."""
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.dtype.is_floating_point:
        return loss
    got = f"a {loss.dtype} tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else repr(loss)[:80]
    raise ConfigError(f"--task {task.key}'s train_step returned {got}, not the batch's loss (a scalar float tensor)")


def owns_step(task: Task | type[Task]) -> bool:
    """Whether the task's step is its own (train_step overridden): the start-up check then runs that step."""
    cls = task if isinstance(task, type) else type(task)
    return cls.train_step is not Task.train_step


def check_loss(loss: Callable, model: nn.Module, task: Task, shape: DataShape, forward: Callable, who: str) -> None:
    """The default step's start-up check: one forward pass and one loss on a batch of 2, whatever the model returns
    or its forward takes (eval mode: no dropout, so no random numbers drawn): the loss must be a finite float scalar
    that requires grad. `who` names the option to blame: --loss, or --model for a model's own loss."""
    inputs, targets = shape.example_inputs(2), task.example_targets(shape, 2)
    was_training = model.training
    model.eval()
    try:
        value = loss(forward(model, inputs, targets), targets)
    except Exception as e:  # noqa: BLE001 - the user's loss (or model): one line, not its traceback
        raise ConfigError(f"{who}: computing the loss on a batch of 2 failed: {first_line(e)}") from None
    finally:
        model.train(was_training)
    check_value(value, who, "a batch of 2")


def check_value(value, who: str, what: str) -> None:
    """A start-up check's loss: a finite float scalar that requires grad, else one line naming `who`."""
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.dtype.is_floating_point:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ConfigError(f"{who}: the loss must be a scalar float tensor; got {got}")
    if not torch.isfinite(value.detach()):
        raise ConfigError(f"{who}: the loss on {what} is {value.item()} before any training")
    if not value.requires_grad:
        raise ConfigError(f"{who}: the loss does not require grad: it is not computed from the model's weights")


def check_step(task: Task, ctx, rows: int = 2) -> None:
    """The start-up check of a task that owns its step: that step, as training will run it (the prepared model, the
    task started), on its first `rows` training rows, in eval mode without gradient sync and without a backward pass,
    every random number generator's state kept; then the task's kept state (state_dict) is restored and it forgets
    the rest (after_check). Its loss must be a finite float scalar that requires grad, else one line naming the
    task's train_step."""
    from accelerate.utils import send_to_device

    who = f"--task {task.key}'s train_step"
    train = cast(Any, task.data.train)  # rows by index (Rows: __getitems__, as the loader fetches them)
    batch = send_to_device(train.__getitems__(list(range(min(rows, len(train))))), ctx.accelerator.device)
    model, accelerator = ctx.model, ctx.accelerator
    was_training, kept = model.training, task.state_dict()
    model.eval()
    try:
        with kept_random_states(accelerator.device), accelerator.no_sync(model):
            value = task.train_step(ctx, batch)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the task's step (or its model): one line, not its traceback
        raise ConfigError(f"{who}: it failed on {rows} training rows at start: {first_line(e)}") from None
    finally:
        model.train(was_training)
    check_value(step_loss(value, task), who, f"{rows} training rows")
    task.load_state_dict(kept)  # what the step changed of the task's kept state (a running statistic) undone
    task.after_check()


@contextmanager
def kept_random_states(device: torch.device):
    """Every generator a step may draw from (python, numpy, torch's CPU and the device's), as it was before."""
    python, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(numpy_state)


# --------------------------------------------------------------------------- evaluation


def evaluate(model: nn.Module, batches, task: Task, gather=None, forward: Callable | None = None) -> dict:
    """The task's metrics over a split's batches (each as the task's rows collate it: eval_batch reads it). With
    several processes, `gather` is accelerator.gather_for_metrics: it is given per-sample values, so it can drop the
    samples padded into the last batch, and the result equals a single-process evaluation."""
    forward = forward or (lambda m, inputs, targets: m(inputs))
    model.eval()
    sums, count = None, 0
    with torch.no_grad():
        for batch in batches:
            stats = task.eval_batch(model, batch, forward)
            if gather is not None:
                stats = gather(stats)
            batch = {k: v.double().sum(0) for k, v in stats.items()}  # summed on the device: no host sync per batch
            sums = batch if sums is None else {k: sums[k] + batch[k] for k in sums}
            count += len(next(iter(stats.values())))  # every statistic is per sample
    if sums is None:
        raise ConfigError("evaluation: a split has no batches")
    metrics = task.metrics({k: v.cpu() for k, v in sums.items()}, count)
    if not metrics_fit(metrics, task):
        raise TypeError(f"task {task.name}: metrics() returned {sorted(metrics)}, its goals name {sorted(task.goals)}")
    return {**metrics, "samples": count}


def metrics_fit(metrics: dict, task: Task) -> bool:
    """Each metric's direction is declared (in goals); a task with an evaluation loss returns it (a model that returns
    its loss alone gives nothing else), one without returns every metric it declares (the best weights' among them)."""
    if not metrics.keys() <= task.goals.keys():
        return False
    return "loss" in metrics if "loss" in task.goals else metrics.keys() == task.goals.keys()


def per_position(outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each sample's mean cross-entropy and accuracy over its target positions (one for a class, block_size
    for a window); a model that returned only its own loss gets that batch-mean loss for each sample."""
    logits = logits_of(outputs)
    if logits is None:
        return {"loss": loss_of(outputs).detach().float().expand(len(targets))}
    losses = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), reduction="none")
    hits = logits.argmax(-1) == targets
    return {"loss": losses.view(len(targets), -1).mean(1), "accuracy": hits.view(len(targets), -1).float().mean(1)}


def predicted_logits(model: nn.Module, inputs) -> torch.Tensor:
    """One forward pass for predict (a dict of inputs, a transformers run's, as keyword arguments)."""
    from ..usermodel import forward_for

    return logits_of(forward_for(model)(model, inputs, None))


def means(sums: dict, count: int) -> dict:
    return {k: v.item() / count for k, v in sums.items()}
