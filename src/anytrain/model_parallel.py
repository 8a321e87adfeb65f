"""Model parallelism: one model split into two stages on two devices, naive or pipelined (GPipe-style).

Data parallelism (the trainer, DDP) copies the whole model to every device and splits the *batch*;
it needs the model to fit on one device. When it does not, split the *model*: the first layers
(stage 1) live on one device, the rest (stage 2) on another, and the activations travel between
them. This module does that for any model built as a flat `nn.Sequential` (every model of
`anytrain.models`), in one process:

    python -m anytrain.model_parallel --mode pipelined --micro-batches 4

- naive (`TwoStageModel`): the whole batch goes through stage 1, then through stage 2. Only one
  device works at a time, so it is no faster than one device (a little slower: the copy).
- pipelined (`PipelinedTwoStageModel`): the batch is cut into micro-batches; stage 2 works on
  micro-batch i while stage 1 works on micro-batch i+1. The outputs are concatenated and the loss
  is taken once over the whole batch, so the gradients are those of the full batch.

Devices: cuda:0 and cuda:1 with two or more GPUs, both stages on cuda:0 with one, both on the CPU
without one; the placement is printed. The run ends with the last step's weights (the trainer's
--final-weights last; it keeps the best validation's by default). See docs/model_parallel.md.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler

from .config import OPTIONS, ConfigError, OneLineParser, TrainConfig, add_options, check_config
from .shape import DataShape
from .tasks.base import evaluate
from .tasks.classify import Classification

MODES = ("single", "naive", "pipelined")


# --------------------------------------------------------------------------- placement


def pick_devices(gpu_count: int | None = None, use_cpu: bool | None = None) -> tuple[torch.device, torch.device, str]:
    """(stage 1 device, stage 2 device, why); gpu_count defaults to the GPUs this process sees,
    use_cpu to what `accelerate launch` asked for (its --cpu flag or use_cpu in a config file)."""
    if use_cpu is None:
        use_cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true"
    if use_cpu:
        return torch.device("cpu"), torch.device("cpu"), "the accelerate launch asked for the CPU"
    n = torch.cuda.device_count() if gpu_count is None else gpu_count
    if n >= 2:
        return torch.device("cuda:0"), torch.device("cuda:1"), f"{n} GPUs found"
    if n == 1:
        return torch.device("cuda:0"), torch.device("cuda:0"), "only 1 GPU found: no memory saved, nothing overlaps"
    return torch.device("cpu"), torch.device("cpu"), "no GPU found"


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def balanced_split(layers: Sequence[nn.Module]) -> int:
    """The split point (index of stage 2's first layer) that best balances parameter counts.

    Ties (cuts around parameter-free layers such as ReLU) go to the latest cut, so stage 1 ends
    with its activation and stage 2 starts with a layer that has weights.
    """
    if len(layers) < 2:
        raise ConfigError(f"--split-at: a model of {len(layers)} layer(s) cannot be split into two stages")
    counts = [count_params(layer) for layer in layers]
    total = sum(counts)
    best, best_gap = 1, math.inf
    for split_at in range(1, len(layers)):
        gap = abs(total - 2 * sum(counts[:split_at]))
        if gap <= best_gap:
            best, best_gap = split_at, gap
    return best


def check_split_at(num_layers: int, split_at: int) -> int:
    if isinstance(split_at, bool) or not isinstance(split_at, int):
        raise ConfigError(f"--split-at must be an integer layer index, got {split_at!r}")
    if not 1 <= split_at <= num_layers - 1:
        raise ConfigError(
            f"--split-at {split_at} is out of range: the model has {num_layers} layers (0-{num_layers - 1}), "
            f"so stage 2 must start at a layer from 1 to {num_layers - 1}"
        )
    return split_at


def check_micro_batches(micro_batches: int) -> int:
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ConfigError(f"--micro-batches must be a positive integer, got {micro_batches!r}")
    return micro_batches


# --------------------------------------------------------------------------- the split model


class TwoStageModel(nn.Module):
    """Naive model parallelism: layers [0, split_at) on devices[0], [split_at, end) on devices[1].

    The layers of `model` are moved, not copied (a model too big for one device is not
    duplicated). Parameter names change from `3.weight` to `stage2.0.weight`; `to_sequential()`
    gives the original model back.
    """

    def __init__(
        self,
        model: nn.Sequential,
        split_at: int | None = None,
        devices: tuple[torch.device, torch.device] | None = None,
    ):
        super().__init__()
        layers = list(model)
        self.split_at = balanced_split(layers) if split_at is None else check_split_at(len(layers), split_at)
        if devices is None:
            first, second, self.device_note = pick_devices()
        else:
            (first, second), self.device_note = devices, "devices given"
        self.devices = (torch.device(first), torch.device(second))
        self.num_layers = len(layers)
        self.stage1 = nn.Sequential(*layers[: self.split_at]).to(self.devices[0])
        self.stage2 = nn.Sequential(*layers[self.split_at :]).to(self.devices[1])

    @property
    def input_device(self) -> torch.device:
        return self.devices[0]

    @property
    def output_device(self) -> torch.device:
        return self.devices[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage1(x.to(self.devices[0], non_blocking=True))
        # The activations move to stage 2's device; on the CPU (or one GPU) this is a no-op.
        return self.stage2(x.to(self.devices[1], non_blocking=True))

    def describe(self) -> str:
        return "naive"

    def placement(self) -> str:
        """One line: which layers and how many parameters sit on which device."""

        def layers(first: int, last: int) -> str:
            return f"layer {first}" if first == last else f"layers {first}-{last}"

        s1 = f"stage 1 ({layers(0, self.split_at - 1)}, {count_params(self.stage1):,} params)"
        s2 = f"stage 2 ({layers(self.split_at, self.num_layers - 1)}, {count_params(self.stage2):,} params)"
        if self.devices[0] == self.devices[1]:
            where = f"{s1} and {s2}, both on {self.devices[0]} ({self.device_note})"
        else:
            where = f"{s1} on {self.devices[0]}, {s2} on {self.devices[1]} ({self.device_note})"
        return f"model parallel, {self.describe()}: {where}"

    def to_sequential(self) -> nn.Sequential:
        """The unsplit model on the CPU, with the original layer names (for `save_weights`/`load_model`)."""
        return nn.Sequential(*self.stage1, *self.stage2).cpu()


class PipelinedTwoStageModel(TwoStageModel):
    """GPipe-style pipelining: stage 2 works on micro-batch i while stage 1 works on micro-batch i+1.

    The batch is cut into `micro_batches` parts whose sizes differ by at most one (a batch that
    does not divide evenly is fine). Outputs are concatenated in order, so a loss over the
    returned tensor, and its gradients, are those of the full batch.
    """

    def __init__(self, model: nn.Sequential, split_at: int | None = None, micro_batches: int = 4, devices=None):
        micro_batches = check_micro_batches(micro_batches)  # before any layer moves
        super().__init__(model, split_at, devices)
        self.micro_batches = micro_batches

    def describe(self) -> str:
        return f"pipelined, {self.micro_batches} micro-batches"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(x) < self.micro_batches:
            raise ConfigError(f"--micro-batches {self.micro_batches} is more than the {len(x)} samples in this batch")
        chunks = iter(torch.tensor_split(x.to(self.devices[0], non_blocking=True), self.micro_batches))
        outputs = []
        # Fill the pipeline: stage 1 on micro-batch 0.
        in_flight = self.stage1(next(chunks)).to(self.devices[1], non_blocking=True)
        for chunk in chunks:
            # CUDA calls return before the work is done and each GPU has its own queue, so these two
            # lines put work on both GPUs at once: stage 2 on micro-batch i (cuda:1) ...
            outputs.append(self.stage2(in_flight))
            # ... and stage 1 on micro-batch i+1 (cuda:0). Its copy to cuda:1 waits for both.
            in_flight = self.stage1(chunk).to(self.devices[1], non_blocking=True)
        # Drain: stage 2 on the last micro-batch.
        outputs.append(self.stage2(in_flight))
        return torch.cat(outputs)


def split_model(
    model: nn.Sequential, mode: str = "pipelined", split_at: int | None = None, micro_batches: int = 4, devices=None
) -> nn.Module:
    """The model for `mode`: 'single' (all on the first device), 'naive' or 'pipelined'."""
    if mode not in MODES:
        raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "pipelined":
        return PipelinedTwoStageModel(model, split_at, micro_batches, devices)
    if mode == "naive":
        return TwoStageModel(model, split_at, devices)
    # 'single': the unsplit model on the device stage 1 would use (split_at does not apply).
    return model.to(pick_devices()[0] if devices is None else devices[0])


def input_output_devices(model: nn.Module) -> tuple[torch.device, torch.device]:
    if isinstance(model, TwoStageModel):
        return model.input_device, model.output_device
    device = next(model.parameters()).device
    return device, device


def placement(model: nn.Module) -> str:
    if isinstance(model, TwoStageModel):
        return model.placement()
    device = next(model.parameters()).device
    return f"single device: all {len(list(model.children()))} layers ({count_params(model):,} params) on {device}"


# --------------------------------------------------------------------------- training


def make_train_loader(data, cfg: TrainConfig) -> tuple[DataLoader, RandomSampler]:
    """Shuffled like the trainer's: epoch e's order is torch.randperm(n, generator seeded with seed + e)."""
    from .data.splits import keep_batch

    sampler = RandomSampler(data, generator=torch.Generator())
    loader = DataLoader(
        data, batch_size=cfg.optim.batch_size, sampler=sampler, collate_fn=keep_batch, pin_memory=cfg.data.pin_memory
    )
    return loader, sampler


def check_batches_fit(model: nn.Module, cfg: TrainConfig, data) -> None:
    """Every batch, the short last one of each split included, must hold at least one sample per micro-batch."""
    if not isinstance(model, PipelinedTwoStageModel):
        return
    for name in ("train", "validation", "test"):
        n = len(getattr(data, name))
        smallest = min(n, cfg.optim.batch_size, n % cfg.optim.batch_size or cfg.optim.batch_size)
        if smallest < model.micro_batches:
            raise ConfigError(
                f"--micro-batches {model.micro_batches} is more than the {smallest} samples of the smallest {name} "
                "batch "
                f"({n} samples in batches of {cfg.optim.batch_size}); use at most {smallest} micro-batches or change "
                "--batch-size"
            )


def on_devices(model: nn.Module, loader):
    """A split's batches, each input on stage 1's device and each target where stage 2 leaves the outputs."""
    first, last = input_output_devices(model)
    for inputs, targets in loader:
        yield inputs.to(first, non_blocking=True), targets.to(last, non_blocking=True)


def prepare(cfg: TrainConfig, mode: str, split_at: int | None, micro_batches: int, devices) -> tuple:
    """(data, the split model, its loaders and sampler, optimizer, scheduler): the trainer's data,
    initial weights, optimizer and schedule, one process, fp32."""
    from accelerate.utils import set_seed

    from .data.splits import make_loader
    from .optim import build_optimizer, build_scheduler
    from .tasks import make_task
    from .tasks.settle import settle
    from .usermodel import make_model

    set_seed(cfg.run.seed)  # the same initial weights as the trainer and as every other mode
    settled = settle(cfg)  # the one place a task is decided, as for the trainer
    task = make_task(settled.cfg, settled.key)
    if type(task) is not Classification:
        said = f"--task {cfg.data.task}" if cfg.data.task != "auto" else f"the labels of {cfg.data.dataset} make"
        raise ConfigError(
            f"model_parallel trains classifiers (tables of numbers); {said} a {settled.cfg.data.task} task"
        )
    data = task.load_data()
    model = make_model(cfg.model, data.shape)
    if not isinstance(model, nn.Sequential):
        raise ConfigError(
            f"--model {cfg.model.name}: model parallelism cuts a flat nn.Sequential into two stages; got "
            f"{type(model).__name__}"
        )
    model = split_model(model, mode, split_at, micro_batches, devices)
    if data.test is None:
        raise ConfigError(f"--dataset: {cfg.data.dataset} has no test split")
    train_loader, sampler = make_train_loader(data.train, cfg)
    loaders = train_loader, make_loader(data.validation, cfg, shuffle=False), make_loader(data.test, cfg, shuffle=False)
    check_batches_fit(model, cfg, data)
    optimizer = build_optimizer(cfg.optim, model)
    total_steps = min(cfg.optim.max_steps or math.inf, cfg.optim.epochs * len(train_loader))
    return data, model, loaders, sampler, optimizer, build_scheduler(cfg.optim, optimizer, total_steps), total_steps


def train_epoch(cfg: TrainConfig, model: nn.Module, loader, optimizer, scheduler, step: int, total_steps) -> tuple:
    """One pass over the training batches, or up to total_steps; returns (step, samples trained, last loss)."""
    criterion, samples = nn.CrossEntropyLoss(), 0
    # Each batch enters on stage 1's device; the loss is taken where stage 2 leaves the outputs.
    for inputs, targets in on_devices(model, loader):
        outputs = model(inputs)
        loss = criterion(outputs, targets)
        optimizer.zero_grad()
        loss.backward()  # autograd carries the gradients back across the device boundary
        if cfg.optim.max_grad_norm:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm)  # one norm over both stages
        optimizer.step()
        scheduler.step()
        step += 1
        samples += len(targets)
        if step >= total_steps:
            break
    return step, samples, loss


def train_model_parallel(
    cfg: TrainConfig, mode="pipelined", split_at=None, micro_batches=4, devices=None, verbose=True
):
    """Train cfg's model on cfg's data with one of the MODES (split_at: stage 2's first layer, default
    balanced; devices: the two stages' devices, default pick_devices()); returns (model, summary)."""
    say = print if verbose else (lambda *a, **k: None)
    started = time.perf_counter()
    data, model, (train_loader, val_loader, test_loader), sampler, optimizer, scheduler, total_steps = prepare(
        cfg, mode, split_at, micro_batches, devices
    )
    say(placement(model))
    step, samples, train_seconds, val = 0, 0, 0.0, {}
    for epoch in range(cfg.optim.epochs):
        sampler.generator.manual_seed(cfg.run.seed + epoch)
        model.train()
        epoch_start = time.perf_counter()
        step, seen, loss = train_epoch(cfg, model, train_loader, optimizer, scheduler, step, total_steps)
        samples += seen
        train_seconds += time.perf_counter() - epoch_start
        val = evaluate(model, on_devices(model, val_loader), Classification(cfg))
        metrics = f"loss {loss.item():.4f}, val_loss {val['loss']:.4f}, val_accuracy {val['accuracy']:.4f}"
        say(f"epoch {epoch}: step {step}, {metrics}")
        if step >= total_steps:
            break
    test = evaluate(model, on_devices(model, test_loader), Classification(cfg))
    summary = {
        "mode": mode,
        "placement": placement(model),
        "split_at": getattr(model, "split_at", None),
        "micro_batches": getattr(model, "micro_batches", 1),
        **{f"test_{k}": test[k] for k in ("accuracy", "loss")},
        **{f"val_{k}": val.get(k) for k in ("accuracy", "loss")},
        "optimizer_steps": step,
        "epochs_completed": epoch + 1,
        "samples_per_s": samples / train_seconds if train_seconds else None,
        "train_seconds": train_seconds,
        "wall_time_s": time.perf_counter() - started,
        "dataset": data.source,
        "num_features": data.shape.num_features,
        "num_classes": data.num_classes,
        "data_shape": data.shape.to_json(),  # saved with the weights, as every run's (save_run)
        "input_columns": data.input_columns,
    }
    results = f"test_accuracy {test['accuracy']:.4f}, test_loss {test['loss']:.4f}, {summary['wall_time_s']:.1f}s"
    say(f"model_parallel: {mode}: {results}")
    return model, summary


def save_run(model: nn.Module, summary: dict, cfg: TrainConfig, output_dir: str) -> None:
    """model.safetensors (loadable with anytrain.load_model, whatever the mode) and summary.json."""
    from .outputs import WEIGHTS, save_weights, write_json
    from .tasks import META_KEY, classes

    task_key = next(key for key, cls in classes().items() if cls is Classification)  # the line reload finds

    run_dir = Path(output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    merged = model.to_sequential() if isinstance(model, TwoStageModel) else model
    save_weights(
        merged.state_dict(),
        run_dir / WEIGHTS,
        cfg,
        {
            "data_shape": DataShape.from_json(summary["data_shape"]),
            "num_features": summary["num_features"],
            "num_classes": summary["num_classes"],
            **({"input_columns": summary["input_columns"]} if summary["input_columns"] else {}),
            META_KEY: task_key,
        },
    )
    write_json(run_dir / "summary.json", summary)


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m anytrain.model_parallel",
        description="Train a model split into two stages on two devices (cuda:0 and cuda:1; one GPU or the CPU "
        "when there are fewer), naively or pipelined over micro-batches. One process.",
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="pipelined",
        help="single: the whole model on one device; naive: stage 1 "
        "then stage 2 on the whole batch; pipelined: GPipe-style micro-batches (default: %(default)s)",
    )
    parser.add_argument(
        "--split-at",
        type=int,
        default=None,
        help="index of stage 2's first layer (layer 0 is the Standardize layer); default: balanced by parameter count",
    )
    parser.add_argument(
        "--micro-batches",
        type=int,
        default=4,
        help="pipelined mode: micro-batches per batch, at least 1 and at most "
        "the smallest batch (default: %(default)s)",
    )
    parser.add_argument(
        "--output-dir", default="", help="if given, write model.safetensors and summary.json there (default: none)"
    )
    # The trainer's options that mean the same here (config.py marks them); its others (accumulation,
    # early stopping, logging, workers) belong to its loop and are not offered.
    add_options(parser, [o for o in OPTIONS.values() if o.model_parallel], defaults=True)
    return parser


def main(argv: list[str] | None = None) -> None:
    try:
        args = vars(build_parser().parse_args(argv))
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            if int(os.environ.get("RANK", "0")) == 0:
                print(
                    "model_parallel: error: this runs as one process that drives both devices; launch it with "
                    "`python -m anytrain.model_parallel` or `accelerate launch --num_processes 1`",
                    file=sys.stderr,
                )
            sys.exit(1)
        mode, split_at, micro_batches, output_dir = (
            args.pop(k) for k in ("mode", "split_at", "micro_batches", "output_dir")
        )
        check_micro_batches(micro_batches)
        cfg = check_config(TrainConfig(**args))
        if mode == "pipelined" and micro_batches > cfg.optim.batch_size:
            raise ConfigError(
                f"--micro-batches {micro_batches} is more than the {cfg.optim.batch_size} samples of a batch "
                "(--batch-size)"
            )
        model, summary = train_model_parallel(cfg, mode, split_at, micro_batches)
        if output_dir:
            save_run(model, summary, cfg, output_dir)
    except ConfigError as err:
        print(f"model_parallel: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
