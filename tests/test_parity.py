"""In-process equivalences (issue 3): the trainer against a plain PyTorch-tutorial loop, gradient
accumulation, and mixed precision. Tolerances and the reasons for them: docs/equivalence.md.

The GPU tests at the end are marked `gpu` and skipped without CUDA; scripts/gpu_checks.py runs
them together with launched fp32/fp16/bf16 runs on a CUDA machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from accelerate.utils import set_seed
from conftest import max_abs_diff, read_metrics
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

import anytrain
from anytrain import TrainConfig, load_model
from anytrain.optim import lr_factor
from anytrain.tasks.classify import Classification
from anytrain.tasks.settle import load
from anytrain.trainer import train
from anytrain.usermodel import make_model

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# --------------------------------------------------------------------------- the reference loop
# Built here in plain torch, none of it with anytrain's code: the digits split and its standardisation, the
# model, the optimizer's weight-decay groups and the LR schedule. A fault in anytrain's builders (models.py,
# optim.param_groups, optim.lr_factor, the carving of splits) then makes the trainer differ from this loop
# instead of being copied into it. test_the_reference_starts_from_the_trainers_data_and_weights checks the
# starting point: the same split and the same initial weights.

DIGITS = Path(anytrain.__file__).parent / "data" / "digits.parquet"  # the bundled file, read with pandas


def digits_splits(cfg: TrainConfig) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{split: (float32 pixels, int64 labels)} of the bundled digits, split as the trainer splits a dataset with
    only a train split: one permutation of the rows seeded with the run's seed, its first val_fraction of the rows
    (rounded down) for validation, the next test_fraction for test, the rest for training in the file's order."""
    table = pd.read_parquet(DIGITS)
    inputs = torch.from_numpy(np.stack(table["pixels"].to_numpy()).astype(np.float32))
    targets = torch.from_numpy(table["label"].to_numpy().astype(np.int64))
    n = len(targets)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.run.seed))
    val, test = math.floor(n * cfg.data.val_fraction), math.floor(n * cfg.data.test_fraction)
    rows = {"train": order[val + test :].sort().values, "validation": order[:val], "test": order[val : val + test]}
    return {name: (inputs[index], targets[index]) for name, index in rows.items()}


class Standardize(nn.Module):
    """(x - mean) / std with the training split's statistics, held as buffers (they are in the state dict)."""

    def __init__(self, inputs: torch.Tensor):
        super().__init__()
        std = inputs.std(0)
        self.register_buffer("mean", inputs.mean(0))
        self.register_buffer("std", torch.where(std > 0, std, torch.ones_like(std)))  # blank pixels: std 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def reference_model(cfg: TrainConfig, train_inputs: torch.Tensor, num_classes: int) -> nn.Sequential:
    """The trainer's model for a table (`--model auto`: an MLP): standardisation, then Linear + ReLU (+ Dropout)
    for each hidden size, then a Linear to the classes. Built right after torch.manual_seed(seed), its Linear
    layers draw the trainer's initial weights (PyTorch's default initialisation, the layers in the same order)."""
    layers: list[nn.Module] = [Standardize(train_inputs)]
    width = train_inputs.shape[1]
    for hidden in cfg.model.hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        if cfg.model.dropout:
            layers.append(nn.Dropout(cfg.model.dropout))
        width = hidden
    return nn.Sequential(*layers, nn.Linear(width, num_classes))


def reference_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    """AdamW or SGD with two groups, minGPT's rule by module and name: weight decay on the Linear layers' weight
    matrices, none on their biases (the Standardize statistics are buffers, not parameters)."""
    decay, no_decay = [], []
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            (decay if isinstance(module, nn.Linear) and name == "weight" else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": cfg.optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg.optim.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.optim.lr, momentum=cfg.optim.momentum)
    # fused: the one-kernel AdamW the trainer uses on the CPU (torch >= 2.4), rounding as it does
    return torch.optim.AdamW(groups, lr=cfg.optim.lr, betas=(cfg.optim.adam_beta1, cfg.optim.adam_beta2), fused=True)


def lr_at(step: int, cfg: TrainConfig, total_steps: float) -> float:
    """The LR of the update made at optimizer step `step` (0-based): a linear warm-up reaching lr at step
    warmup_steps - 1, then a cosine from lr down to min_lr at step total_steps. The multiplier is taken first
    and scales lr, as torch's LambdaLR does (base_lr x factor), so with min_lr 0 the floats are exact."""
    o = cfg.optim
    if step < o.warmup_steps:
        return o.lr * ((step + 1) / o.warmup_steps)
    progress = min(1.0, (step - o.warmup_steps) / max(1, total_steps - o.warmup_steps))
    return o.min_lr + (o.lr - o.min_lr) * (0.5 * (1.0 + math.cos(math.pi * progress)))


def reference_start(cfg: TrainConfig) -> tuple[dict, nn.Sequential]:
    """(the splits, the model) as the reference starts: torch's global RNG seeded, then the model built."""
    assert (cfg.data.dataset, cfg.model.name, cfg.optim.schedule) == ("digits", "auto", "cosine")
    torch.manual_seed(cfg.run.seed)  # what set_seed does to torch, as the trainer does before building the model
    data = digits_splits(cfg)
    return data, reference_model(cfg, data["train"][0], num_classes=int(data["train"][1].max()) + 1)


@dataclass
class Tally:
    """The reference loop's running counts: optimizer steps, clipped steps, losses since the last log, the log."""

    step: int = 0
    clipped: int = 0
    window: list = field(default_factory=list)
    logged: list = field(default_factory=list)


def reference_loop(cfg: TrainConfig, *, train_loader_own_generator: bool = True) -> dict:
    """The training loop of the PyTorch tutorials, without accelerate, fed the trainer's samples in
    the trainer's order: epoch e visits `torch.randperm(n, generator=seed + e)` in batches of
    cfg.optim.batch_size, the last one partial. Validation runs at each epoch end, as in the trainer.

    `train_loader_own_generator=False` is the tutorial's `DataLoader(...)` without a generator: each
    epoch's iterator then draws its base seed from the global RNG, which dropout also uses."""
    torch.set_flush_denormal(True)  # as the trainer does on CPU (3x faster once values get tiny)
    data, model = reference_start(cfg)
    optimizer = reference_optimizer(cfg, model)
    train_set = TensorDataset(*data["train"])
    val_loader = DataLoader(TensorDataset(*data["validation"]), batch_size=cfg.optim.batch_size)
    n = len(train_set)
    batches_per_epoch = math.ceil(n / cfg.optim.batch_size)
    total_steps = min(
        cfg.optim.max_steps or math.inf, cfg.optim.epochs * math.ceil(batches_per_epoch / cfg.optim.grad_accum_steps)
    )
    set_lr(optimizer, lr_at(0, cfg, total_steps))
    tally = Tally()
    for epoch in range(cfg.optim.epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.run.seed + epoch))
        generator = torch.Generator() if train_loader_own_generator else None
        train_loader = DataLoader(
            Subset(train_set, order.tolist()), batch_size=cfg.optim.batch_size, generator=generator
        )
        train_epoch(cfg, model, optimizer, train_loader, total_steps, tally)
        model.eval()
        with torch.no_grad():
            for inputs, _ in val_loader:
                model(inputs)
        if tally.step >= total_steps:
            break
    return {"model": model, "logged": tally.logged, "clipped": tally.clipped, "steps": tally.step, "data": data}


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def train_epoch(cfg: TrainConfig, model, optimizer, loader: DataLoader, total_steps: float, tally: Tally) -> None:
    """One epoch's batches: each backward, and an optimizer step every grad_accum_steps batches and at the end."""
    model.train()
    criterion = nn.CrossEntropyLoss()
    n, accum, size = len(loader.dataset), cfg.optim.grad_accum_steps, cfg.optim.batch_size
    for i, (inputs, targets) in enumerate(loader):
        outputs = model(inputs)
        loss = criterion(outputs, targets)
        # a cycle's gradient is the mean over its rows, also the epoch's last, short cycle: each batch's mean
        # weighted by its rows' share (1 where the cycle holds accum full batches), then divided by accum
        start = i // accum * accum
        rows = min(n, (start + accum) * size) - start * size
        weight = len(targets) * accum / rows
        loss = loss if weight == 1 else loss * weight
        (loss / accum).backward()
        tally.window.append(loss.detach())
        if (i + 1) % accum and i + 1 < len(loader):
            continue  # accumulate; the last, short cycle of an epoch still steps
        update(cfg, model, optimizer, total_steps, tally)
        if tally.step >= total_steps:
            return


def update(cfg: TrainConfig, model, optimizer, total_steps: float, tally: Tally) -> None:
    """One optimizer step: clip, step, the next step's LR, and the log line every log_every_steps."""
    if cfg.optim.max_grad_norm:
        norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm)
        tally.clipped += bool(norm > cfg.optim.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad()
    tally.step += 1
    lr = lr_at(tally.step, cfg, total_steps)  # the LR of the next update, which the trainer logs after this one
    set_lr(optimizer, lr)
    if tally.step % cfg.run.log_every_steps == 0:  # the weighted losses' float32 sum over accum x the steps
        mean = (torch.stack(tally.window).float().sum() / (cfg.optim.grad_accum_steps * cfg.run.log_every_steps)).item()
        tally.logged.append({"step": tally.step, "loss": mean, "lr": lr})
        tally.window = []


def evaluate_plain(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int) -> dict:
    """Mean per-sample loss (summed in float64) and accuracy, one process, no accelerate."""
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(targets), batch_size):
            out = model(inputs[start : start + batch_size])
            y = targets[start : start + batch_size]
            loss_sum += nn.functional.cross_entropy(out.float(), y, reduction="none").double().sum().item()
            correct += (out.argmax(-1) == y).sum().item()
    return {"loss": loss_sum / len(targets), "accuracy": correct / len(targets)}


def train_log(run_dir) -> list[dict]:
    return [{k: m[k] for k in ("step", "loss", "lr")} for m in read_metrics(run_dir) if m["kind"] == "train"]


COMMON = {
    "dataset": "digits",
    "hidden_sizes": [32],
    "epochs": 3,
    "schedule": "cosine",
    "warmup_steps": 5,
    "max_grad_norm": 0.5,
    "log_every_steps": 3,
    "progress": False,
    "final_weights": "last",  # the tutorial loop ends with its last step's weights
}


# --------------------------------------------------------------------------- parity with the plain loop


@pytest.mark.parametrize(
    "optimizer, batch_size, grad_accum_steps, max_steps",
    [
        ("adamw", 64, 1, 50),  # 1259 rows: 20 batches (last of 43), 20 steps/epoch; max_steps cuts epoch 2 at step 50
        ("sgd", 48, 2, 0),  # 27 batches (last of 11): 14 steps/epoch, the last a 1-batch cycle
    ],
)
def test_trainer_equals_the_tutorial_loop_bit_for_bit(tmp_path, optimizer, batch_size, grad_accum_steps, max_steps):
    cfg = TrainConfig(
        **COMMON,
        dropout=0.0,
        optimizer=optimizer,
        lr=0.05 if optimizer == "sgd" else 3e-3,
        batch_size=batch_size,
        grad_accum_steps=grad_accum_steps,
        max_steps=max_steps,
        output_dir=str(tmp_path / "run"),
    )
    summary = train(cfg)
    ref = reference_loop(cfg)

    assert summary["optimizer_steps"] == ref["steps"] == (50 if max_steps else 42)
    assert ref["clipped"] > 0  # clipping really acted
    trained, reference = load_model(tmp_path / "run").state_dict(), ref["model"].state_dict()
    assert trained.keys() == reference.keys()
    for name in trained:
        assert torch.equal(trained[name], reference[name]), (
            f"{name}: max abs diff {max_abs_diff({name: trained[name]}, {name: reference[name]})}"
        )
    assert train_log(tmp_path / "run") == ref["logged"]  # same float32 losses and the same LR, every log step
    test = evaluate_plain(ref["model"], *ref["data"]["test"], cfg.optim.batch_size)
    assert (summary["test_loss"], summary["test_accuracy"]) == (test["loss"], test["accuracy"])


def test_dropout_matches_when_the_global_rng_is_drawn_alike(tmp_path):
    """Dropout draws from the global RNG (seeded by set_seed). The trainer's train DataLoader has its own
    generator, so starting an epoch draws nothing from it; its validation loader has none, so each
    validation pass draws one int64 (the iterator's base seed). A reference that does the same matches bit
    for bit; the tutorial's plain `DataLoader(train_set)` draws once more per epoch and does not."""
    cfg = TrainConfig(**COMMON, dropout=0.2, batch_size=64, max_steps=50, output_dir=str(tmp_path / "run"))
    train(cfg)
    trained = load_model(tmp_path / "run").state_dict()
    ref = reference_loop(cfg)
    assert all(torch.equal(trained[k], v) for k, v in ref["model"].state_dict().items())
    assert train_log(tmp_path / "run") == ref["logged"]
    plain = reference_loop(cfg, train_loader_own_generator=False)["model"].state_dict()
    assert max_abs_diff(trained, plain) > 1e-3  # other dropout masks from epoch 1 on: a different run


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_the_reference_starts_from_the_trainers_data_and_weights(tmp_path, dropout):
    """The reference's own split, standardisation and model against the trainer's (`load` and `make_model` after
    `set_seed`, as the trainer builds them): the same rows in each split, the same initial state dict. The parity
    tests above then check everything the trainer does from there."""
    cfg = TrainConfig(**COMMON, dropout=dropout, output_dir=str(tmp_path / "run"))
    set_seed(cfg.run.seed)
    data = load(cfg)[2]
    trainers = make_model(cfg.model, data.shape).state_dict()
    splits, model = reference_start(cfg)
    for name in ("train", "validation", "test"):
        split = getattr(data, name)
        assert torch.equal(splits[name][0], split.inputs) and torch.equal(splits[name][1], split.targets), name
    reference = model.state_dict()
    assert trainers.keys() == reference.keys()
    assert all(torch.equal(trainers[k], reference[k]) for k in trainers), max_abs_diff(trainers, reference)


# --------------------------------------------------------------------------- accumulation, one process

SYNTHETIC = {
    "dataset": "synthetic",
    "synthetic_samples": 716,
    "synthetic_features": 20,
    "synthetic_classes": 5,
    "val_fraction": 101.5 / 716,
    "test_fraction": 103.5 / 716,
    "hidden_sizes": [32],
    "dropout": 0.0,
    "epochs": 3,
    "schedule": "cosine",
    "warmup_steps": 4,
    "max_grad_norm": 1.0,
    "log_every_steps": 4,
    "progress": False,
}  # 512 train rows


def test_adamw_accumulation_on_one_process_equals_the_bigger_batch(tmp_path):
    # 2 x 16 accumulated vs 32 at once: 512 rows = 16 full cycles per epoch, no partial batch
    base = dict(SYNTHETIC, optimizer="adamw", lr=3e-3)
    train(TrainConfig(**base, batch_size=16, grad_accum_steps=2, output_dir=str(tmp_path / "accum")))
    train(TrainConfig(**base, batch_size=32, output_dir=str(tmp_path / "big")))
    diff = max_abs_diff(load_model(tmp_path / "accum").state_dict(), load_model(tmp_path / "big").state_dict())
    assert diff <= 1e-6  # measured 4.5e-8: two 16-row gradient sums added vs one 32-row sum
    accum, big = train_log(tmp_path / "accum"), train_log(tmp_path / "big")
    assert [m["step"] for m in accum] == [m["step"] for m in big] and [m["lr"] for m in accum] == [m["lr"] for m in big]
    assert all(a["loss"] == pytest.approx(b["loss"], abs=1e-6) for a, b in zip(accum, big))  # measured 2.4e-7


# --------------------------------------------------------------------------- mixed precision on the CPU


@pytest.fixture
def linear_output_dtypes(monkeypatch):
    """Records the dtype of the first Linear layer's output on every forward of the trained model."""
    seen: list[torch.dtype] = []
    original = Classification.build_model

    def build_and_watch(self, *args, **kwargs):
        model = original(self, *args, **kwargs)
        first_linear = next(m for m in model if isinstance(m, nn.Linear))
        first_linear.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
        return model

    monkeypatch.setattr(Classification, "build_model", build_and_watch)
    return seen


TINY = {
    "dataset": "synthetic",
    "synthetic_samples": 600,
    "synthetic_features": 16,
    "synthetic_classes": 4,
    "hidden_sizes": [16],
    "epochs": 6,
    "batch_size": 32,
    "lr": 1e-2,
    "warmup_steps": 2,
    "progress": False,
}


def test_bf16_on_cpu_really_autocasts_and_reaches_the_fp32_accuracy(
    tmp_path, monkeypatch, linear_output_dtypes, capsys
):
    fp32 = train(TrainConfig(**TINY, output_dir=str(tmp_path / "fp32")))
    assert set(linear_output_dtypes) == {torch.float32}
    linear_output_dtypes.clear()
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # what `accelerate launch` exports for bf16.yaml
    bf16 = train(TrainConfig(**TINY, output_dir=str(tmp_path / "bf16")))
    assert set(linear_output_dtypes) == {torch.bfloat16}  # the forward really ran in bf16
    assert (bf16["scenario"]["mixed_precision"], bf16["scenario"]["warnings"]) == ("bf16", [])
    assert "precision bf16" in capsys.readouterr().out
    assert bf16["test_accuracy"] >= 0.75 and bf16["test_accuracy"] >= fp32["test_accuracy"] - 0.03  # both 0.817 here
    # autocast changed the arithmetic: not the fp32 weights
    assert max_abs_diff(load_model(tmp_path / "bf16").state_dict(), load_model(tmp_path / "fp32").state_dict()) > 0


def test_fp16_requested_on_cpu_trains_in_fp32_and_says_so(tmp_path, monkeypatch, linear_output_dtypes, capsys):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")  # what `accelerate launch` exports for fp16.yaml
    summary = train(TrainConfig(**{**TINY, "epochs": 1}, output_dir=str(tmp_path / "run")))
    assert set(linear_output_dtypes) == {torch.float32}  # no autocast: accelerate fell back to fp32
    scenario = summary["scenario"]
    assert (scenario["mixed_precision"], scenario["mixed_precision_requested"]) == ("fp32", "fp16")
    assert scenario["warnings"] == ["fp16 was requested but is not available on cpu: training in fp32"]
    out = capsys.readouterr().out
    assert (
        "precision fp32" in out
        and "anytrain: WARNING: fp16 was requested but is not available on cpu: training in fp32" in out
    )


# --------------------------------------------------------------------------- CUDA only


@pytest.mark.gpu
@needs_cuda
def test_fp16_skips_overflowing_steps_counts_them_and_holds_the_schedule(tmp_path, monkeypatch):
    """A huge initial loss scale makes the first ~25 steps overflow: GradScaler skips them, the metrics
    log counts them, and the LR schedule advances only on real updates."""
    import accelerate.accelerator

    original = accelerate.accelerator.get_grad_scaler
    monkeypatch.setattr(
        accelerate.accelerator, "get_grad_scaler", lambda *a, **k: original(*a, **{**k, "init_scale": 2.0**40})
    )
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    cfg = TrainConfig(
        epochs=4,
        max_steps=60,
        warmup_steps=10,
        schedule="cosine",
        log_every_steps=1,
        progress=False,
        output_dir=str(tmp_path / "run"),
    )
    summary = train(cfg)
    assert summary["scenario"]["mixed_precision"] == "fp16" and summary["scenario"]["warnings"] == []
    log = [m for m in read_metrics(tmp_path / "run") if m["kind"] == "train"]
    skipped = summary["skipped_optimizer_steps"]
    assert 5 <= skipped < 60 and log[-1]["skipped_steps"] == skipped
    assert [m["skipped_steps"] for m in log] == sorted(m["skipped_steps"] for m in log)
    for m in log:  # the LR after step s is the schedule's value at s - (steps skipped so far)
        assert m["lr"] == pytest.approx(
            cfg.optim.lr * lr_factor(m["step"] - m["skipped_steps"], cfg.optim, 60), rel=1e-9
        )


@pytest.mark.gpu
@needs_cuda
def test_bf16_and_fp16_reach_the_fp32_accuracy_on_cuda(tmp_path, monkeypatch):
    from accelerate.state import AcceleratorState

    accuracy = {}
    for precision in ("no", "bf16", "fp16"):
        AcceleratorState._reset_state(True)
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", precision)
        summary = train(TrainConfig(epochs=10, progress=False, output_dir=str(tmp_path / precision)))
        assert summary["scenario"]["device"].startswith("cuda")
        accuracy[precision] = summary["test_accuracy"]
    assert accuracy["no"] >= 0.95
    for precision in ("bf16", "fp16"):
        assert accuracy[precision] >= accuracy["no"] - 0.02, accuracy  # the margin stated in docs/equivalence.md
