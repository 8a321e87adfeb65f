"""What differs between tasks, and nothing else: the data, the model's outputs, the loss, the metrics,
what is saved with the weights and what `anytrain predict` prints. The loop in trainer.py is the
same for every task; each task fills in the `Task` contract below.

- classify: targets are class ids; the model returns logits (batch, classes); cross-entropy;
  accuracy.
- lm: targets are the input window shifted by one token; logits (batch, block, vocabulary);
  next-token cross-entropy; perplexity and accuracy.
- regress: targets are standardised values (batch, targets); the model returns values of that
  shape; MSE (or `--loss huber`); RMSE, MAE and R² in the original units.
- multilabel: targets are multi-hot rows (batch, classes); logits (batch, classes); BCE with
  logits; micro and macro F1 and exact match at `--threshold`.

Text classification is `classify` on token ids padded to each batch's longest text (data/textcls.py).

A model may also return an object or dict with a `loss` (the transformers convention; it is given
the targets as `labels=` or `targets=` when its forward takes one): the loop then trains on that loss.
`--loss module:fn` (or `loss_fn=` from Python) trains on your own `fn(outputs, targets) -> scalar`.
Validation and test metrics, early stopping included, always use the task's own per-sample loss.

Evaluation is written once (`evaluate`): the task turns a batch into per-sample statistics, those
are gathered over ranks (dropping padded samples) and summed, and the task turns the sums into metrics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F

from .config import ConfigError, TrainConfig, first_line
from .shape import DataShape
from .usermodel import import_factory, logits_of, loss_of, make_model


class Task(Protocol):
    """The contract every task fills in (the five below implement it)."""

    name: str

    def load_data(
        self, cfg: TrainConfig, given=None
    ): ...  # splits of (inputs, targets) batches, ConfigError on bad data
    def build_model(self, cfg: TrainConfig, data, given=None) -> nn.Module: ...
    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor: ...  # the task's training loss
    def per_sample(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]: ...
    def metrics(self, sums: dict[str, torch.Tensor], count: int) -> dict[str, float]: ...  # with a "loss"
    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor: ...  # to check a model and a loss
    def weights_metadata(self, data) -> dict[str, str]: ...  # what predict needs, saved with the weights
    def predictions(self, outputs: torch.Tensor, meta: dict) -> list[dict]: ...  # what predict prints per row
    def train_batches(self, batches, loader, epoch: int, skipped: int): ...  # the batches, with what a step adds
    def export(self, model: nn.Module, run_dir) -> None: ...  # files beside model.safetensors at the end


# --------------------------------------------------------------------------- what a model returns


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


def check_loss(loss: Callable, model: nn.Module, task: Task, shape: DataShape, forward: Callable) -> None:
    """One forward pass and one loss on a batch of 2 (eval mode, no gradients): the loss must be a float scalar."""
    inputs, targets = shape.example_inputs(2), task.example_targets(shape, 2)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            value = loss(forward(model, inputs, targets), targets)
    except Exception as e:  # noqa: BLE001 - the user's loss (or model): one line, not its traceback
        raise ConfigError(f"--loss: computing the loss on a batch of 2 failed: {first_line(e)}") from None
    finally:
        model.train(was_training)
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.dtype.is_floating_point:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ConfigError(f"--loss: the loss must be a scalar float tensor; got {got}")


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
            stats = task.per_sample(forward(model, inputs, targets), targets)
            if gather is not None:
                stats = gather(stats)
            batch = {k: v.double().sum(0) for k, v in stats.items()}  # summed on the device: no host sync per batch
            sums = batch if sums is None else {k: sums[k] + batch[k] for k in sums}
            count += len(stats["loss"])
    return {**task.metrics({k: v.cpu() for k, v in sums.items()}, count), "samples": count}


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


def run_files(data) -> dict:
    """{name: text} the run folder needs besides the weights, for any task: a BPE run's tokenizer.json."""
    vocab = getattr(data, "vocab", None)
    return vocab.files() if vocab is not None else {}


# --------------------------------------------------------------------------- the tasks


class Supervised:
    """What the tasks on labelled data share: data through data.load_splits, the model from the model
    section and the data's shape, rebuilt for inference from the shape saved with the weights."""

    name = "classify"

    def __init__(self, cfg: TrainConfig | None = None, data=None):
        self.cfg, self.data = cfg, data

    def load_data(self, cfg: TrainConfig, given=None):
        if cfg.data.text_column:  # text to classify
            from .data.textcls import load_text_class_splits

            return load_text_class_splits(cfg, given)
        from .data import load_splits

        return load_splits(cfg, given)

    def build_model(self, cfg: TrainConfig, data, given=None) -> nn.Module:
        shape = data.shape()
        return make_model(cfg.model, shape, given, self.example_targets(shape, 2))

    def model_from_metadata(self, cfg: TrainConfig, meta: dict, given=None) -> nn.Module:
        shape = DataShape.from_json(meta["data_shape"]) if "data_shape" in meta else self.legacy_shape(cfg, meta)
        return make_model(cfg.model, shape, given, self.example_targets(shape, 2))

    def legacy_shape(self, cfg: TrainConfig, meta: dict) -> DataShape:
        """The shape of a run saved before data_shape was stored with the weights."""
        return DataShape("tabular", num_classes=int(meta["num_classes"]), num_features=int(meta["num_features"]))

    def train_batches(self, batches, loader, epoch: int, skipped: int):
        return batches

    def export(self, model: nn.Module, run_dir) -> None:
        """Nothing beyond model.safetensors (a transformers model also saves itself with save_pretrained)."""

    def rates(self, samples: int, tokens: int, seconds: float) -> dict:
        """samples/s; for text to classify also tokens/s, counted as samples/s x the training texts' mean
        number of real tokens (exact over whole epochs; the padding a batch adds is not counted)."""
        per_second = samples / seconds if seconds > 0 else None
        per_text = getattr(self.data, "mean_tokens_per_text", None)
        if per_text is None:
            return {"samples_per_s": per_second}
        return {"samples_per_s": per_second, "tokens_per_s": per_second and per_second * per_text}

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


class Classification(Supervised):
    name = "classify"

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets)

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        return per_position(outputs, targets)

    def metrics(self, sums: dict, count: int) -> dict:
        return means(sums, count)

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return torch.zeros(batch, dtype=torch.long)

    def predictions(self, outputs: torch.Tensor, meta: dict) -> list[dict]:
        names = json.loads(meta["class_names"]) if "class_names" in meta else None
        best, ids = outputs.float().softmax(-1).max(-1)
        return [
            {"class_id": k, "class_name": names[k] if names else None, "probability": p}
            for k, p in zip(ids.tolist(), best.tolist())
        ]


class Regression(Supervised):
    """Targets are standardised with the training split's statistics (saved with the weights); the model
    predicts standardised values; metrics and predictions are in the original units."""

    name = "regress"

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.cfg is not None and self.cfg.optim.loss == "huber":
            return F.huber_loss(outputs.float(), targets)
        return F.mse_loss(outputs.float(), targets)

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        errors = logits_of(outputs).float() - targets
        huber = self.cfg is not None and self.cfg.optim.loss == "huber"
        losses = F.huber_loss(errors, torch.zeros_like(errors), reduction="none") if huber else errors.square()
        stats = {"se": errors.square(), "ae": errors.abs(), "z": targets, "z2": targets.square()}
        return {"loss": losses.mean(1), **stats}

    def metrics(self, sums: dict, count: int) -> dict:
        std = self.data.target_std.double()  # standardised errors back to the targets' units
        se, ae = sums["se"] * std.square(), sums["ae"] * std
        spread = (sums["z2"] - sums["z"].square() / count) * std.square()  # sum of squared deviations from the mean
        r2 = 1 - se / spread.clamp_min(1e-300)
        return {
            "loss": sums["loss"].item() / count,
            "rmse": math.sqrt(se.mean().item() / count),
            "mae": ae.mean().item() / count,
            "r2": r2.mean().item(),  # the mean over targets, like scikit-learn's r2_score
        }

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return torch.zeros(batch, shape.num_classes)

    def weights_metadata(self, data) -> dict:
        stats = {"mean": data.target_mean.tolist(), "std": data.target_std.tolist(), "names": data.target_names}
        return {**super().weights_metadata(data), "targets": json.dumps(stats)}

    def predictions(self, outputs: torch.Tensor, meta: dict) -> list[dict]:
        stats = json.loads(meta["targets"])
        values = outputs.float() * torch.tensor(stats["std"]) + torch.tensor(stats["mean"])
        return [dict(zip(stats["names"], row)) for row in values.tolist()]


class MultiLabel(Supervised):
    """Each sample holds any number of the classes: one sigmoid per class, counted at --threshold."""

    name = "multilabel"

    def threshold(self) -> float:
        return self.cfg.eval.threshold if self.cfg is not None else 0.5

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs.float(), targets)

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = logits_of(outputs).float()
        losses = F.binary_cross_entropy_with_logits(logits, targets, reduction="none").mean(1)
        predicted, actual = (logits.sigmoid() > self.threshold()).float(), targets
        hits = predicted * actual
        exact = (predicted == actual).all(1).float()
        return {"loss": losses, "tp": hits, "fp": predicted - hits, "fn": actual - hits, "exact_match": exact}

    def metrics(self, sums: dict, count: int) -> dict:
        tp, fp, fn = sums["tp"], sums["fp"], sums["fn"]
        per_class = 2 * tp / (2 * tp + fp + fn).clamp_min(1e-300)  # 0 for a class never present nor predicted
        return {
            "loss": sums["loss"].item() / count,
            "micro_f1": (2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum()).clamp_min(1e-300)).item(),
            "macro_f1": per_class.mean().item(),
            "exact_match": sums["exact_match"].item() / count,
        }

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return torch.zeros(batch, shape.num_classes)

    def weights_metadata(self, data) -> dict:
        return {**super().weights_metadata(data), "threshold": str(self.threshold())}

    def predictions(self, outputs: torch.Tensor, meta: dict) -> list[dict]:
        names = json.loads(meta["class_names"]) if "class_names" in meta else None
        threshold = float(meta.get("threshold", 0.5))
        rows = []
        for probs in outputs.float().sigmoid().tolist():
            chosen = [(k, p) for k, p in enumerate(probs) if p > threshold]
            rows.append(
                {"labels": [names[k] if names else k for k, _ in chosen], "probabilities": [p for _, p in chosen]}
            )
        return rows


class LanguageModel:
    name = "lm"

    def __init__(self, cfg: TrainConfig | None = None, data=None):
        self.cfg, self.data = cfg, data

    def load_data(self, cfg: TrainConfig, given=None):
        from .data.text import load_text_splits

        return load_text_splits(cfg, given)

    def build_model(self, cfg: TrainConfig, data, given=None) -> nn.Module:
        shape = data.shape()
        return make_model(cfg.model, shape, given, self.example_targets(shape, 2))

    def model_from_metadata(self, cfg: TrainConfig, meta: dict, given=None) -> nn.Module:
        from .data.text import Vocab

        if "data_shape" in meta:
            shape = DataShape.from_json(meta["data_shape"])
        else:  # runs saved before data_shape was stored with the weights
            shape = DataShape("text", vocab_size=Vocab.from_json(meta["vocab"]).size, block_size=cfg.data.block_size)
        return make_model(cfg.model, shape, given)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, 1), targets.flatten())  # every position of every window

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        return per_position(outputs, targets)

    def metrics(self, sums: dict, count: int) -> dict:
        values = means(sums, count)
        return {"loss": values["loss"], "perplexity": math.exp(min(values["loss"], 700.0)), **values}

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return torch.zeros(batch, shape.block_size, dtype=torch.long)

    def train_batches(self, batches, loader, epoch: int, skipped: int):
        return batches

    def export(self, model: nn.Module, run_dir) -> None:
        """Nothing beyond model.safetensors."""

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

    def predictions(self, outputs: torch.Tensor, meta: dict) -> list[dict]:
        raise ConfigError("a language-model run has no predictions for rows; use `anytrain sample RUN_DIR`")


# --------------------------------------------------------------------------- transformers models (hf.py)


class Transformers:
    """What a transformers model (`--model hf:...`) changes in a task: the data is tokenised by the
    model's own tokenizer (data/hftext.py), the model comes from its folder with the task's head, the
    batches' inputs are dicts, and the run ends with save_pretrained into run_dir/hf."""

    def load_data(self, cfg: TrainConfig, given=None):
        from . import hf
        from .data.hftext import load_hf_splits

        data = load_hf_splits(cfg, hf.load_tokenizer(cfg), self.name, given)
        data.model_config = hf.model_config(cfg, self.name, data.tokenizer, data.class_names, data.num_classes)
        return data

    def build_model(self, cfg: TrainConfig, data, given=None) -> nn.Module:
        from . import hf

        return hf.load_model(cfg, self.name, data.model_config)

    def model_from_metadata(self, cfg: TrainConfig, meta: dict, given=None) -> nn.Module:
        from . import hf

        return hf.model_from_config(self.name, meta["hf_config"])

    def weights_metadata(self, data) -> dict:
        from .hf import FOLDER

        config = data.model_config.to_json_string(use_diff=False)  # load_model rebuilds the model from it
        meta = {"data_shape": data.shape().to_json(), "hf_config": config, "hf": FOLDER}
        if data.num_classes:
            meta["class_names"] = json.dumps(data.class_names or [str(k) for k in range(data.num_classes)])
        return {**meta, "input_columns": json.dumps(data.input_columns)}

    def describe_data(self, data, model: nn.Module) -> dict:
        return {**data.describe(), "parameters": model_parameters(model)}

    def export(self, model: nn.Module, run_dir) -> None:
        from . import hf

        hf.save_pretrained(model, self.data.tokenizer, run_dir)

    def rates(self, samples: int, tokens: int, seconds: float) -> dict:
        per_second = samples / seconds if seconds > 0 else None
        return {"samples_per_s": per_second, "tokens_per_s": per_second and per_second * self.data.mean_tokens_per_text}


class HFClassification(Transformers, Classification):
    """classify with AutoModelForSequenceClassification: the model's own loss (cross-entropy per text)."""


class HFCausalLM(Transformers, LanguageModel):
    """lm with AutoModelForCausalLM, one text per sequence. The loss is the mean over every target token
    of the optimizer step's global batch, whatever the number of ranks or accumulation steps
    (train_batches); validation and test loss are the mean over every target token of the split."""

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        logits, labels = logits_of(outputs)[:, :-1].float(), targets[:, 1:]  # position t predicts token t + 1
        losses = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
        real = labels != -100
        hits = (logits.argmax(-1) == labels) & real
        tokens = real.sum(1)
        sums = losses.sum(1)
        return {"loss": sums / tokens.clamp(min=1), "token_loss": sums, "tokens": tokens, "hits": hits.sum(1)}

    def metrics(self, sums: dict, count: int) -> dict:
        tokens = max(sums["tokens"].item(), 1)
        loss = sums["token_loss"].item() / tokens
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "accuracy": sums["hits"].item() / tokens}

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return shape.example_inputs(batch)

    def train_batches(self, batches, loader, epoch: int, skipped: int):
        """Each batch's inputs get `num_items_in_batch`, so that transformers' loss is the sum over its
        target tokens divided by it: the global count of target tokens in the batch's optimizer step
        over (processes x accumulation steps). accelerator.backward divides by the accumulation steps and
        DDP averages over processes, so the step's gradient is that of the mean over all its tokens.
        The counts come from this epoch's batch indices (the sampler is a function of seed and epoch),
        with one all-reduce per epoch: no batch is read ahead."""
        from accelerate.state import PartialState
        from accelerate.utils import reduce

        accum, state = self.cfg.optim.grad_accum_steps, PartialState()
        per_row = self.data.train.targets_per_row
        loader.set_epoch(epoch)
        per_batch = [int(per_row[list(indices)].sum()) for indices in loader.batch_sampler]
        loader.set_epoch(epoch)  # iterating the sampler moved it on
        steps = torch.zeros(math.ceil(len(per_batch) / accum), dtype=torch.float64)
        for k, count in enumerate(per_batch):
            steps[k // accum] += count
        if state.num_processes > 1:
            steps = reduce(steps.to(state.device), "sum").cpu()
        share = (steps / (state.num_processes * accum)).tolist()
        for k, (inputs, targets) in enumerate(batches, start=skipped):
            yield {**inputs, "num_items_in_batch": share[k // accum]}, targets


TASKS = {"classify": Classification, "lm": LanguageModel, "regress": Regression, "multilabel": MultiLabel}
HF_TASKS = {"classify": HFClassification, "lm": HFCausalLM}


def get_task(cfg: TrainConfig, data=None) -> Task:
    """The task the config names (auto: classify until the labels say otherwise, see load_task); for a
    transformers model (`--model hf:...`) its transformers flavour."""
    name = "classify" if cfg.data.task == "auto" else cfg.data.task
    if cfg.model.name.startswith("hf:"):
        if name not in HF_TASKS:
            raise ConfigError(f"--model {cfg.model.name}: transformers models train --task classify or lm here")
        return HF_TASKS[name](cfg, data)
    return TASKS[name](cfg, data)


def load_task(cfg: TrainConfig, given=None) -> tuple[Task, object]:
    """Load the data and settle --task auto by it: a float label that is not all integers is regression,
    a label of lists multi-label (data.load_splits decides and says so). cfg.data.task then names the
    task that runs, so config.yaml and the checkpoints hold it."""
    data = get_task(cfg).load_data(cfg, given)
    cfg.data.task = getattr(data, "task", "classify" if cfg.data.task == "auto" else cfg.data.task)
    if cfg.optim.loss in ("mse", "huber") and cfg.data.task != "regress":
        raise ConfigError(f"--loss {cfg.optim.loss} is a regression loss; this data is a {cfg.data.task} task")
    return get_task(cfg, data), data


def vocab_of(meta: dict, folder):
    """The tokenizer saved with a text run's weights (a BPE's tokenizer.json is in `folder`, beside
    them); None for a run on numbers or images."""
    from .data.tokenizer import read_tokenizer

    return read_tokenizer(meta["vocab"], folder) if "vocab" in meta else None
