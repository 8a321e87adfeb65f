"""The loop, in one process: determinism, schedules, accumulation, clipping, evaluation, early
stopping, loaders and run outputs. Small runs on the bundled digits or synthetic data."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, read_metrics, read_summary

import anytrain.trainer as trainer_module
from anytrain import TrainConfig, load_model
from anytrain.optim import lr_factor
from anytrain.tasks.settle import load
from anytrain.trainer import train

FAST = {"epochs": 2, "progress": False, "hidden_sizes": [32], "log_every_steps": 1}


def load_data(cfg, given=None):
    """The data a run of this config trains on (its task settled first)."""
    return load(cfg, given)[2]


def run(tmp_path, name="run", **overrides) -> dict:
    cfg = TrainConfig(**{**FAST, "output_dir": str(tmp_path / name), **overrides})
    return train(cfg)


def weights(tmp_path, name="run") -> dict:
    return load_model(tmp_path / name).state_dict()


def test_lr_factor_for_each_schedule():
    cfg = TrainConfig(warmup_steps=4, schedule="constant")
    assert [lr_factor(s, cfg.optim, 100) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cfg = TrainConfig(warmup_steps=0, schedule="step", step_size=10, gamma=0.5)
    assert [lr_factor(s, cfg.optim, 100) for s in (0, 9, 10, 25, 99)] == [1.0, 1.0, 0.5, 0.25, 0.5**9]
    cfg = TrainConfig(warmup_steps=10, schedule="cosine")
    assert lr_factor(10, cfg.optim, 110) == 1.0
    assert lr_factor(60, cfg.optim, 110) == pytest.approx(0.5)
    assert lr_factor(110, cfg.optim, 110) == pytest.approx(0.0)


def test_logged_lr_follows_the_schedule_in_optimizer_steps(tmp_path):
    run(tmp_path, max_steps=30, warmup_steps=5, schedule="cosine", lr=0.01)
    logged = {m["step"]: m["lr"] for m in read_metrics(tmp_path / "run") if m["kind"] == "train"}
    cfg = TrainConfig(warmup_steps=5, schedule="cosine")
    # the lr logged after step s is the one the next update (0-based index s) uses
    for step in (1, 4, 5, 17, 29):
        assert logged[step] == pytest.approx(0.01 * lr_factor(step, cfg.optim, 30), rel=1e-9)


def test_same_seed_same_run_bit_for_bit(tmp_path):
    a = run(tmp_path, "a", seed=3)
    b = run(tmp_path, "b", seed=3)
    assert a["test_loss"] == b["test_loss"] and a["val_loss"] == b["val_loss"]
    wa, wb = weights(tmp_path, "a"), weights(tmp_path, "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    c = run(tmp_path, "c", seed=4)
    assert c["test_loss"] != a["test_loss"]


def test_gradient_accumulation_equals_the_bigger_batch(tmp_path):
    # 4 x 16 with accumulate() must make the same updates as batches of 64 (no manual loss division)
    common = {
        "dataset": "synthetic",
        "synthetic_samples": 640,
        "val_fraction": 0.1,
        "test_fraction": 0.1,
        "dropout": 0.0,
        "optimizer": "sgd",
        "lr": 0.05,
    }
    run(tmp_path, "accum", batch_size=16, grad_accum_steps=4, **common)  # 512 train rows = 8 full cycles per epoch
    run(tmp_path, "big", batch_size=64, **common)
    wa, wb = weights(tmp_path, "accum"), weights(tmp_path, "big")
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-6)
    steps = [m["step"] for m in read_metrics(tmp_path / "accum") if m["kind"] == "train"]
    assert steps == list(range(1, 17))  # optimizer steps, not batches


def test_clipping_bounds_each_update(tmp_path):
    # plain SGD without momentum: each update is lr * clipped grad, so its norm is at most lr * max_grad_norm
    common = {
        "optimizer": "sgd",
        "momentum": 0.0,
        "weight_decay": 0.0,
        "lr": 1.0,
        "schedule": "constant",
        "warmup_steps": 0,
        "dropout": 0.0,
        "max_steps": 1,
        "epochs": 1,
    }
    before = _initial_weights(tmp_path)
    run(tmp_path, "clipped", max_grad_norm=0.01, **common)
    after = weights(tmp_path, "clipped")
    update = torch.sqrt(sum(((after[k] - before[k]) ** 2).sum() for k in after if "mean" not in k and "std" not in k))
    assert update == pytest.approx(0.01, rel=1e-4)
    run(tmp_path, "free", max_grad_norm=0.0, **common)
    free = weights(tmp_path, "free")
    assert torch.sqrt(sum(((free[k] - before[k]) ** 2).sum() for k in free if "mean" not in k and "std" not in k)) > 0.1


def _initial_weights(tmp_path):
    run(
        tmp_path,
        "init",
        lr=1e-12,
        max_steps=1,
        epochs=1,
        schedule="constant",
        warmup_steps=0,
        optimizer="sgd",
        momentum=0.0,
        weight_decay=0.0,
        dropout=0.0,
    )
    return weights(tmp_path, "init")


def test_validation_every_epoch_and_every_n_steps(tmp_path):
    summary = run(tmp_path, epochs=2, eval_every_steps=7, batch_size=128)  # 10 steps per epoch
    evals = [
        (m["step"], m["epoch"])
        for m in read_metrics(tmp_path / "run")
        if m["kind"] == "eval" and m["split"] == "validation"
    ]
    assert evals == [(7, 0), (10, 0), (14, 1), (20, 1)]
    assert summary["optimizer_steps"] == 20


def test_early_stopping_with_patience_and_min_delta(tmp_path):
    # min_delta larger than any possible gain: the first validation sets the best, the next 2 fail to beat it
    summary = run(tmp_path, epochs=10, early_stopping_patience=2, early_stopping_min_delta=100.0)
    assert summary["stopped_early_at_epoch"] == 2 and summary["epochs_completed"] == 3
    summary = run(tmp_path, "patient", epochs=3, early_stopping_patience=2, early_stopping_min_delta=0.0, lr=1e-3)
    assert summary["stopped_early_at_epoch"] is None and summary["epochs_completed"] == 3


def test_logged_throughput_leaves_out_checkpoint_time(tmp_path, monkeypatch):
    """A fake clock, so the machine's speed cannot enter: it stands still except that every training
    batch takes 10 ms and every checkpoint 1000 s (a slow disk, without the wait); a checkpoint after
    every step. The logged samples/s must be the training rate, the same as without checkpoints:
    counting the pauses would cut it ~1e5x; restarting the window's clock after each pause (while
    keeping its samples) would inflate it ~10x."""
    now = [0.0]
    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    add = trainer_module.Throughput.add

    def timed_batch(self, samples, tokens):
        now[0] += 0.010
        add(self, samples, tokens)

    def slow_save(accelerator, run_dir, step, *args, **kwargs):
        now[0] += 1000.0
        return run_dir / "checkpoints" / f"step-{step}"

    monkeypatch.setattr(trainer_module.Throughput, "add", timed_batch)
    monkeypatch.setattr(trainer_module, "save_checkpoint", slow_save)
    common = {"epochs": 2, "log_every_steps": 10, "hidden_sizes": [64]}  # 40 steps of 32 per epoch: 8 windows
    control = run(tmp_path, "control", **common)
    paused = run(tmp_path, "paused", checkpoint_every_steps=1, **common)

    def rates(name):
        return [m["samples_per_s"] for m in read_metrics(tmp_path / name) if m["kind"] == "train"]

    assert len(rates("control")) == 8 and rates("paused") == pytest.approx(rates("control"), rel=1e-9)
    assert rates("control")[0] == pytest.approx(32 / 0.010)  # 10 full batches in 0.1 s
    assert paused["samples_per_s"] == pytest.approx(control["samples_per_s"], rel=1e-9)
    assert control["train_seconds"] == pytest.approx(79 * 0.010)  # 80 batches, the first step timed on its own


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_both_optimizers_learn(tmp_path, optimizer):
    summary = run(tmp_path, epochs=8, optimizer=optimizer, lr=0.05 if optimizer == "sgd" else 3e-3, hidden_sizes=[64])
    assert summary["test_accuracy"] > 0.9


def test_cnn_learns_the_digits(tmp_path):
    summary = run(tmp_path, model="cnn", channels=[8], epochs=6)
    assert summary["test_accuracy"] > 0.85


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
@pytest.mark.launch
def test_the_peak_memory_is_the_processs_own_not_its_parents():
    """A run started by a big process (a notebook, a benchmark driver) reports its own peak: ru_maxrss there
    starts at the parent's resident set (the control), process_peak_rss does not."""
    held = bytearray(1024 * 2**20)
    held[:: 2**12] = b"\x01" * len(held[:: 2**12])  # every page touched: 1 GiB resident in this process
    code = (
        "import resource; from anytrain.outputs import process_peak_rss; "
        "print(process_peak_rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    own, maxrss = map(int, done.stdout.split())
    del held
    assert maxrss >= 1024 * 2**20  # the control: the parent's gigabyte
    assert 10 * 2**20 < own < 700 * 2**20, own  # the child's own: python, torch and anytrain imported


def test_loader_options_do_not_change_the_math(tmp_path):
    run(tmp_path, "plain", epochs=1)
    run(tmp_path, "workers", epochs=1, num_workers=2, pin_memory=True, persistent_workers=True)
    wa, wb = weights(tmp_path, "plain"), weights(tmp_path, "workers")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_run_folder_holds_config_metrics_weights_summary(tmp_path):
    summary = run(tmp_path, epochs=3)
    folder = tmp_path / "run"
    saved = yaml.safe_load((folder / "config.yaml").read_text())  # in sections
    assert saved["optim"]["epochs"] == 3 and saved["model"]["hidden_sizes"] == [32]
    kinds = {(m["kind"], m.get("split")) for m in read_metrics(folder)}
    assert kinds == {("train", None), ("eval", "validation"), ("eval", "test")}
    on_disk = read_summary(folder)
    for key in ("test_accuracy", "samples_per_s", "peak_memory_bytes", "wall_time_s", "scenario"):
        assert on_disk[key] == summary[key]
    assert on_disk["scenario"]["mixed_precision"] == "fp32" and on_disk["scenario"]["num_processes"] == 1
    assert on_disk["peak_memory_kind"] == "process_max_rss" and on_disk["peak_memory_bytes"] > 10_000_000
    # the saved weights load back into a model that reproduces the test accuracy on raw features
    model = load_model(folder)
    test = load_data(TrainConfig()).test
    with torch.no_grad():
        accuracy = (model(test.inputs).argmax(1) == test.targets).float().mean().item()
    assert accuracy == pytest.approx(summary["test_accuracy"], abs=1e-6)
    assert math.isfinite(summary["samples_per_s"]) and summary["samples_per_s"] > 0
