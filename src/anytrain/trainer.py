"""The training loop: a plain PyTorch loop plus a few accelerate calls, each commented."""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import hashlib

from accelerate.utils import gather_object, set_seed
from torch import nn
from tqdm.auto import tqdm

from .config import ConfigError, TrainConfig, save_config
from .data import DataSplits, load_splits, make_loader
from .models import build_model
from .optim import build_optimizer, build_scheduler
from .outputs import WEIGHTS, MetricsLog, peak_memory_bytes, save_weights, write_json
from .scenario import describe, format_scenario, make_accelerator


def evaluate(model: nn.Module, loader, accelerator) -> dict:
    """Mean loss and accuracy over the whole split, equal to a single-process evaluation."""
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    correct = torch.zeros((), dtype=torch.long, device=accelerator.device)
    count = 0
    with torch.no_grad():
        for inputs, targets in loader:
            outputs = model(inputs)
            losses = nn.functional.cross_entropy(outputs.float(), targets, reduction="none")
            # Per-sample values, so gather_for_metrics can drop the samples padded into the last batch.
            losses, hits = accelerator.gather_for_metrics((losses, outputs.argmax(-1) == targets))
            loss_sum += losses.double().sum()
            correct += hits.sum()
            count += len(hits)
    return {"loss": loss_sum.item() / count, "accuracy": correct.item() / count, "samples": count}


def weights_fingerprint(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def load_data(accelerator, cfg: TrainConfig) -> DataSplits:
    # The main process prepares (and caches) the dataset first; the others then read the cache.
    with accelerator.main_process_first():
        try:
            return load_splits(cfg)
        except ConfigError as err:
            error = err  # leave the context normally so no rank is left waiting at its barrier
    raise error


def train(cfg: TrainConfig) -> dict:
    started = time.perf_counter()
    accelerator = make_accelerator(cfg)
    scenario = describe(accelerator)
    accelerator.print(format_scenario(scenario))
    set_seed(cfg.seed)  # same initial weights on every rank (and DDP broadcasts rank 0's anyway)

    data = load_data(accelerator, cfg)
    model = build_model(cfg, data.num_features, data.num_classes, data.feature_mean, data.feature_std)
    optimizer = build_optimizer(cfg, model.parameters())
    train_loader = make_loader(data.train, cfg, shuffle=True)
    val_loader = make_loader(data.validation, cfg, shuffle=False)
    test_loader = make_loader(data.test, cfg, shuffle=False)
    # Moves the model to the device, wraps it for DDP/FSDP and mixed precision, and shards the loaders by rank.
    model, optimizer, train_loader, val_loader, test_loader = accelerator.prepare(model, optimizer, train_loader, val_loader, test_loader)
    steps_per_epoch = math.ceil(len(train_loader) / cfg.grad_accum_steps)  # the last, short cycle of an epoch still steps
    total_steps = min(cfg.max_steps or math.inf, cfg.epochs * steps_per_epoch)
    scheduler = build_scheduler(cfg, optimizer, total_steps)
    criterion = nn.CrossEntropyLoss()

    run_dir = Path(cfg.output_dir)
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.yaml")
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    log = MetricsLog(run_dir / "metrics.jsonl" if accelerator.is_main_process else None)
    bar = tqdm(total=total_steps, disable=not (cfg.progress and accelerator.is_main_process), unit="step", dynamic_ncols=True)

    step = 0  # optimizer steps taken
    best_val_loss, evals_without_improvement, stopped_early_at = math.inf, 0, None
    running_loss, running_batches = torch.zeros((), device=accelerator.device), 0
    samples_seen, eval_seconds = 0, 0.0
    val: dict = {}

    def validate(epoch: int) -> bool:
        """Evaluate, log, and update early stopping; True when training should stop (same on all ranks)."""
        nonlocal val, best_val_loss, evals_without_improvement, stopped_early_at, eval_seconds
        eval_start = time.perf_counter()
        val = evaluate(model, val_loader, accelerator)
        model.train()
        log.write(kind="eval", split="validation", step=step, epoch=epoch, loss=val["loss"], accuracy=val["accuracy"])
        if val["loss"] < best_val_loss - cfg.early_stopping_min_delta:
            best_val_loss, evals_without_improvement = val["loss"], 0
        else:
            evals_without_improvement += 1
        if cfg.early_stopping_patience and evals_without_improvement >= cfg.early_stopping_patience and accelerator.is_main_process:
            accelerator.set_trigger()  # decided on the main process ...
        stop = accelerator.check_trigger()  # ... and seen by every rank, so no rank breaks alone and hangs the others
        if stop:
            stopped_early_at = epoch
        eval_seconds += time.perf_counter() - eval_start
        return stop

    loop_start = window_start = time.perf_counter()
    window_samples = 0
    for epoch in range(cfg.epochs):
        model.train()
        stop = validated = False
        for inputs, targets in train_loader:
            with accelerator.accumulate(model):  # gradients are all-reduced and applied once per grad_accum_steps batches
                outputs = model(inputs)
                loss = criterion(outputs, targets)
                accelerator.backward(loss)  # scales the loss under fp16 and divides it for accumulation
                if accelerator.sync_gradients and cfg.max_grad_norm:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)  # unscales first under fp16
                optimizer.step()  # a no-op until the accumulation cycle is complete
                optimizer.zero_grad()
            running_loss += loss.detach()  # no .item() here: a host sync every batch would stall a GPU
            running_batches += 1
            window_samples += len(targets) * accelerator.num_processes
            if not accelerator.sync_gradients:
                continue
            if not accelerator.optimizer_step_was_skipped:  # fp16 overflow: no update, so no schedule advance
                scheduler.step()
            step += 1
            bar.update(1)
            validated = False
            if step % cfg.log_every_steps == 0:
                mean_loss = accelerator.reduce(running_loss, "mean").item() / running_batches  # mean over ranks
                rate = window_samples / (time.perf_counter() - window_start)
                log.write(kind="train", step=step, epoch=epoch, loss=mean_loss, lr=scheduler.get_last_lr()[0], samples_per_s=rate)
                bar.set_postfix(loss=f"{mean_loss:.4f}", samples_per_s=f"{rate:,.0f}")
                running_loss.zero_()
                running_batches, samples_seen, window_samples = 0, samples_seen + window_samples, 0
                window_start = time.perf_counter()
            if cfg.eval_every_steps and step % cfg.eval_every_steps == 0:
                stop, validated = validate(epoch), True
                window_start = time.perf_counter()  # evaluation time is not training throughput
            if stop or step >= total_steps:
                break
        if not validated:  # every epoch ends with a validation (unless one just ran at this step)
            stop = validate(epoch) or stop
            window_start = time.perf_counter()
        if accelerator.is_main_process:
            tqdm.write(f"epoch {epoch}: step {step}, val_loss {val['loss']:.4f}, val_accuracy {val['accuracy']:.4f}")
        if stop or step >= total_steps:
            break
    samples_seen += window_samples
    train_seconds = time.perf_counter() - loop_start - eval_seconds
    bar.close()

    test = evaluate(model, test_loader, accelerator)
    log.write(kind="eval", split="test", step=step, epoch=epoch, loss=test["loss"], accuracy=test["accuracy"])
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(model)  # full weights even when sharded (FSDP)
    # Each rank's fingerprint of its own weights: after data-parallel training they must all agree.
    rank_fingerprints = gather_object([weights_fingerprint(accelerator.unwrap_model(model))])
    peak, peak_kind = peak_memory_bytes(accelerator.device)
    summary = {
        "test_loss": test["loss"],
        "test_accuracy": test["accuracy"],
        "val_loss": val.get("loss"),
        "val_accuracy": val.get("accuracy"),
        "best_val_loss": best_val_loss,
        "epochs_completed": epoch + 1,
        "optimizer_steps": step,
        "stopped_early_at_epoch": stopped_early_at,
        "samples_per_s": samples_seen / train_seconds,
        "train_seconds": train_seconds,
        "peak_memory_bytes": peak,
        "peak_memory_kind": peak_kind,
        "wall_time_s": time.perf_counter() - started,
        "dataset": data.source,
        "num_features": data.num_features,
        "num_classes": data.num_classes,
        "train_samples": len(data.train),
        "weights_sha256_per_rank": rank_fingerprints,
        "scenario": scenario,
    }
    if accelerator.is_main_process:
        save_weights(state_dict, run_dir / WEIGHTS, cfg, data.num_features, data.num_classes)
        write_json(run_dir / "summary.json", summary)
        accelerator.print(
            f"anytrain: test_accuracy {test['accuracy']:.4f}, test_loss {test['loss']:.4f}, "
            f"{summary['wall_time_s']:.1f}s, run folder {run_dir}"
        )
    log.close()
    accelerator.end_training()
    return summary
