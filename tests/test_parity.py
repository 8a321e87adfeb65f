"""In-process equivalences (issue 3): the trainer against a plain PyTorch-tutorial loop, gradient
accumulation, and mixed precision. Tolerances and the reasons for them: docs/equivalence.md.

The GPU tests at the end are marked `gpu` and skipped without CUDA; scripts/gpu_checks.py runs
them together with launched fp32/fp16/bf16 runs on a CUDA machine.
"""

from __future__ import annotations

import math

import pytest
import torch
from accelerate.utils import set_seed
from conftest import max_abs_diff, read_metrics
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from anytrain import TrainConfig, load_model
from anytrain.optim import build_optimizer, build_scheduler, lr_factor
from anytrain.tasks.classify import Classification
from anytrain.tasks.settle import load
from anytrain.trainer import train
from anytrain.usermodel import make_model

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# --------------------------------------------------------------------------- the reference loop


def reference_loop(cfg: TrainConfig, *, train_loader_own_generator: bool = True) -> dict:
    """The training loop of the PyTorch tutorials, without accelerate, fed the trainer's samples in
    the trainer's order: epoch e visits `torch.randperm(n, generator=seed + e)` in batches of
    cfg.optim.batch_size, the last one partial. Validation runs at each epoch end, as in the trainer.

    `train_loader_own_generator=False` is the tutorial's `DataLoader(...)` without a generator: each
    epoch's iterator then draws its base seed from the global RNG, which dropout also uses."""
    torch.set_flush_denormal(True)  # as the trainer does on CPU (3x faster once values get tiny)
    set_seed(cfg.run.seed)  # python, numpy and torch, as the trainer does before building the model
    data = load(cfg)[2]
    model = make_model(cfg.model, data.shape)
    optimizer = build_optimizer(cfg.optim, model)
    train_set = TensorDataset(data.train.inputs, data.train.targets)
    val_loader = DataLoader(
        TensorDataset(data.validation.inputs, data.validation.targets), batch_size=cfg.optim.batch_size
    )
    n = len(train_set)
    batches_per_epoch = math.ceil(n / cfg.optim.batch_size)
    total_steps = min(
        cfg.optim.max_steps or math.inf, cfg.optim.epochs * math.ceil(batches_per_epoch / cfg.optim.grad_accum_steps)
    )
    scheduler = build_scheduler(cfg.optim, optimizer, total_steps)
    criterion = nn.CrossEntropyLoss()

    step, window, logged, clipped = 0, [], [], 0
    for epoch in range(cfg.optim.epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.run.seed + epoch))
        generator = torch.Generator() if train_loader_own_generator else None
        train_loader = DataLoader(
            Subset(train_set, order.tolist()), batch_size=cfg.optim.batch_size, generator=generator
        )
        model.train()
        accum, size = cfg.optim.grad_accum_steps, cfg.optim.batch_size
        for i, (inputs, targets) in enumerate(train_loader):
            outputs = model(inputs)
            loss = criterion(outputs, targets)
            # a cycle's gradient is the mean over its rows, also the epoch's last, short cycle: each batch's mean
            # weighted by its rows' share (1 where the cycle holds accum full batches), then divided by accum
            start = i // accum * accum
            rows = min(n, (start + accum) * size) - start * size
            weight = len(targets) * accum / rows
            loss = loss if weight == 1 else loss * weight
            (loss / accum).backward()
            window.append(loss.detach())
            if (i + 1) % cfg.optim.grad_accum_steps and i + 1 < len(train_loader):
                continue  # accumulate; the last, short cycle of an epoch still steps
            if cfg.optim.max_grad_norm:
                norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm)
                clipped += bool(norm > cfg.optim.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step % cfg.run.log_every_steps == 0:  # the weighted losses' float32 sum over accum x the steps
                mean = (torch.stack(window).float().sum() / (accum * cfg.run.log_every_steps)).item()
                logged.append({"step": step, "loss": mean, "lr": scheduler.get_last_lr()[0]})
                window = []
            if step >= total_steps:
                break
        model.eval()
        with torch.no_grad():
            for inputs, _ in val_loader:
                model(inputs)
        if step >= total_steps:
            break
    return {"model": model, "logged": logged, "clipped": clipped, "steps": step, "data": data}


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
    test = evaluate_plain(ref["model"], ref["data"].test.inputs, ref["data"].test.targets, cfg.optim.batch_size)
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
