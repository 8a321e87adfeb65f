"""The training loop: a plain PyTorch loop plus a few accelerate calls, each commented."""

from __future__ import annotations

import contextlib
import hashlib
import math
import signal
import time
from pathlib import Path

import torch
from accelerate.utils import gather_object, set_seed
from torch import nn
from tqdm.auto import tqdm

from .checkpoint import (
    Progress,
    check_run_folder,
    check_writable,
    find_resume_checkpoint,
    load_checkpoint,
    save_checkpoint,
    start_run_folder,
)
from .config import ConfigError, TrainConfig
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


class Preempted(Exception):
    """SIGTERM/SIGINT arrived: a checkpoint was saved; exit with 128 + the signal number."""

    def __init__(self, signum: int, checkpoint: Path):
        super().__init__(f"stopped by {signal.Signals(signum).name}; checkpoint saved in {checkpoint}; continue with --resume")
        self.exit_code = 128 + signum


class NonFiniteLoss(Exception):
    """The training loss became NaN or infinite."""


class StopSignals:
    """Remembers SIGTERM/SIGINT instead of dying mid-step; the loop stops at a step boundary and saves."""

    def __init__(self):
        self.received = 0
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        self.received = signum

    def restore(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def train(cfg: TrainConfig) -> dict:
    signals = StopSignals()
    try:
        return _train(cfg, signals)
    finally:
        signals.restore()
        if torch.distributed.is_initialized():  # also on error paths: an abandoned gloo group can abort at exit
            torch.distributed.destroy_process_group()


def _train(cfg: TrainConfig, signals: StopSignals) -> dict:
    started = time.perf_counter()
    accelerator = make_accelerator(cfg)
    if accelerator.device.type == "cpu":
        # Once gradients and Adam's moments get tiny they turn denormal, and x86 computes those in slow
        # microcode: 3x slower steps measured (docs/benchmarks.md). Flushed to zero, accuracy is unchanged.
        torch.set_flush_denormal(True)
    scenario = describe(accelerator)
    accelerator.print(format_scenario(scenario))
    run_dir = Path(cfg.output_dir)
    # Every check that can refuse the run happens before anything is written.
    check_run_folder(cfg)
    resume_from = find_resume_checkpoint(cfg) if cfg.resume else None
    set_seed(cfg.seed)  # same initial weights on every rank (and DDP broadcasts rank 0's anyway)
    data = load_data(accelerator, cfg)
    check_writable(run_dir)

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
    progress = Progress(config=cfg.to_dict(), num_features=data.num_features, num_classes=data.num_classes)
    # save_state/load_state then carry these too (model, optimizer, scaler, sampler and RNGs are built in).
    accelerator.register_for_checkpointing(progress, scheduler)

    if resume_from is not None:
        load_checkpoint(accelerator, resume_from, cfg)  # restores progress and scheduler too
        accelerator.print(f"anytrain: resuming from {resume_from} at epoch {progress.epoch}, step {progress.step}")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        start_run_folder(run_dir, cfg, resumed_at_step=progress.step if resume_from else None)
    log = MetricsLog(run_dir / "metrics.jsonl" if accelerator.is_main_process else None)
    bar = tqdm(total=total_steps, initial=progress.step, disable=not (cfg.progress and accelerator.is_main_process), unit="step", dynamic_ncols=True)

    # This rank's batch losses since the last log, with their step numbers (restored on resume).
    window_steps = [step for step, _ in progress.window]
    window_losses = [torch.tensor(loss, device=accelerator.device) for _, loss in progress.window]
    samples_seen, eval_seconds, skipped_steps = 0, 0.0, 0
    val: dict = {}
    improved_at = -1  # step of the last validation that improved the best loss

    def health() -> tuple[float, int]:
        """One all-reduce: mean training loss over ranks since the last log, and whether any rank got a stop signal."""
        losses = torch.stack(window_losses).float() if window_losses else torch.zeros(0, device=accelerator.device)
        local = torch.stack([losses.sum(), torch.tensor(float(len(window_losses)), device=losses.device), torch.tensor(float(signals.received > 0), device=losses.device)])
        total = accelerator.reduce(local, "sum")
        mean_loss = (total[0] / total[1]).item() if total[1] > 0 else float("nan")
        if total[1] > 0 and not math.isfinite(mean_loss):
            bad = (~torch.isfinite(losses)).nonzero()
            first_bad = window_steps[bad[0].item()] if len(bad) else 10**12
            first_bad = min(gather_object([first_bad]))
            raise NonFiniteLoss(
                f"the training loss became non-finite ({mean_loss}) at optimizer step {first_bad} (epoch {progress.epoch}); "
                f"stopped without saving. The last good checkpoint is in {run_dir / 'checkpoints'} (try a lower --lr, then --resume)"
            )
        return mean_loss, int(total[2].item())

    def validate() -> bool:
        """Evaluate, log, and update early stopping; True when training should stop (same on all ranks)."""
        nonlocal val, eval_seconds, improved_at
        eval_start = time.perf_counter()
        val = evaluate(model, val_loader, accelerator)
        model.train()
        log.write(kind="eval", split="validation", step=progress.step, epoch=progress.epoch, loss=val["loss"], accuracy=val["accuracy"])
        if val["loss"] < progress.best_val_loss - cfg.early_stopping_min_delta:
            progress.best_val_loss, progress.evals_without_improvement, improved_at = val["loss"], 0, progress.step
        else:
            progress.evals_without_improvement += 1
        eval_seconds += time.perf_counter() - eval_start
        patience_spent = cfg.early_stopping_patience and progress.evals_without_improvement >= cfg.early_stopping_patience
        if patience_spent and accelerator.is_main_process:
            accelerator.set_trigger()  # decided on the main process ...
        return accelerator.check_trigger()  # ... and seen by every rank, so no rank breaks alone and hangs the others

    def checkpoint() -> Path:
        health()  # never save a checkpoint over a NaN: raises if the loss went non-finite since the last check
        progress.window = [(step, loss.item()) for step, loss in zip(window_steps, window_losses)]
        return save_checkpoint(accelerator, run_dir, progress.step, cfg.keep_checkpoints, is_best=improved_at == progress.step)

    @contextlib.contextmanager
    def paused():
        """Evaluation and checkpoints are not training throughput: keep their time out of the logged rate."""
        nonlocal window_start
        pause_start = time.perf_counter()
        yield
        window_start += time.perf_counter() - pause_start

    loop_start = window_start = time.perf_counter()
    window_samples, epoch = 0, progress.epoch
    stopped_early = stop_signal = False
    for epoch in range(progress.epoch, cfg.epochs if progress.step < total_steps else 0):
        model.train()
        progress.epoch = epoch
        train_loader.set_epoch(epoch)  # the shuffle order is a function of (seed, epoch): resumable, the same on every rank
        # Resuming mid-epoch: skip the batches this epoch already trained on (same order, thanks to set_epoch).
        batches = accelerator.skip_first_batches(train_loader, progress.batches_done) if progress.batches_done else train_loader
        validated = False
        for inputs, targets in batches:
            with accelerator.accumulate(model):  # gradients are all-reduced and applied once per grad_accum_steps batches
                outputs = model(inputs)
                loss = criterion(outputs, targets)
                accelerator.backward(loss)  # scales the loss under fp16 and divides it for accumulation
                if accelerator.sync_gradients and cfg.max_grad_norm:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)  # unscales first under fp16
                optimizer.step()  # a no-op until the accumulation cycle is complete
                optimizer.zero_grad()
            window_losses.append(loss.detach())  # no .item() here: a host sync every batch would stall a GPU
            window_steps.append(progress.step + 1)
            window_samples += len(targets) * accelerator.num_processes
            progress.batches_done += 1
            if not accelerator.sync_gradients:
                continue
            if accelerator.optimizer_step_was_skipped:  # fp16 overflow: no update, so no schedule advance
                skipped_steps += 1
            else:
                scheduler.step()
            progress.step += 1
            bar.update(1)
            validated = False
            if progress.step % cfg.log_every_steps == 0 or (accelerator.num_processes == 1 and signals.received):
                mean_loss, stop_signal = health()
                rate = window_samples / (time.perf_counter() - window_start)
                log.write(kind="train", step=progress.step, epoch=epoch, loss=mean_loss, lr=scheduler.get_last_lr()[0], samples_per_s=rate, skipped_steps=skipped_steps)
                bar.set_postfix(loss=f"{mean_loss:.4f}", samples_per_s=f"{rate:,.0f}")
                window_losses.clear()
                window_steps.clear()
                samples_seen, window_samples, window_start = samples_seen + window_samples, 0, time.perf_counter()
            if cfg.eval_every_steps and progress.step % cfg.eval_every_steps == 0:
                with paused():
                    stopped_early, validated = validate(), True
            if stop_signal:  # SIGTERM/SIGINT: this step is finished; save together, then exit 143/130
                raise Preempted(signals.received or signal.SIGTERM, checkpoint())
            if cfg.checkpoint_every_steps and progress.step % cfg.checkpoint_every_steps == 0:
                with paused():
                    checkpoint()
            if stopped_early or progress.step >= total_steps:
                break
        with paused():
            if not validated:  # every epoch ends with a validation (unless one just ran at this step)
                stopped_early = validate() or stopped_early
            if accelerator.is_main_process:
                tqdm.write(f"epoch {epoch}: step {progress.step}, val_loss {val['loss']:.4f}, val_accuracy {val['accuracy']:.4f}")
            if progress.batches_done >= len(train_loader):  # the epoch ran to its end
                progress.epoch, progress.batches_done = epoch + 1, 0
            checkpoint()
        if stopped_early or progress.step >= total_steps:
            break
    samples_seen += window_samples
    train_seconds = time.perf_counter() - loop_start - eval_seconds
    bar.close()

    test = evaluate(model, test_loader, accelerator)
    log.write(kind="eval", split="test", step=progress.step, epoch=epoch, loss=test["loss"], accuracy=test["accuracy"])
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
        "best_val_loss": progress.best_val_loss,
        "epochs_completed": progress.epoch + (progress.batches_done > 0),
        "optimizer_steps": progress.step,
        "skipped_optimizer_steps": skipped_steps,
        "stopped_early_at_epoch": epoch if stopped_early else None,
        "resumed_from": str(resume_from) if resume_from else None,
        "samples_per_s": samples_seen / train_seconds if train_seconds > 0 else None,
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
