"""The training loop: a plain PyTorch loop plus a few accelerate calls, each commented.

`train()` sets the run up, `Loop.train_epoch()` holds the per-batch step, `Loop.after_step()`
the bookkeeping of one optimizer step (log, validate, checkpoint, stop), `finish()` the test
evaluation and the run folder. What differs between tasks (classification, language modelling)
lives in tasks.py: the data, the model, the loss and the metric names.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object, set_seed
from torch import nn
from tqdm.auto import tqdm

from .checkpoint import (
    Progress,
    check_run_folder,
    check_writable,
    find_resume_checkpoint,
    load_checkpoint,
    resolve_auto_resume,
    save_checkpoint,
    start_run_folder,
)
from .config import ConfigError, TrainConfig
from .data import loader_workers, make_loader
from .optim import build_optimizer, build_scheduler
from .outputs import WEIGHTS, MetricsLog, peak_memory_bytes, save_weights, write_json
from .runlock import RunLock
from .scenario import describe, format_scenario, make_accelerator
from .tasks import get_task, per_sample
from .usermodel import model_name


def evaluate(model: nn.Module, loader, accelerator) -> dict:
    """Mean loss and accuracy over the whole split, equal to a single-process evaluation."""
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    hit_sum = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    count = 0
    with torch.no_grad():
        for inputs, targets in loader:
            losses, hits = per_sample(model(inputs), targets)
            # Per-sample values, so gather_for_metrics can drop the samples padded into the last batch.
            losses, hits = accelerator.gather_for_metrics((losses, hits))
            loss_sum += losses.double().sum()
            hit_sum += hits.double().sum()
            count += len(hits)
    return {"loss": loss_sum.item() / count, "accuracy": hit_sum.item() / count, "samples": count}


def weights_fingerprint(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def load_data(accelerator, cfg: TrainConfig, given=None):
    # The main process prepares (and caches) the dataset first; the others then read the cache.
    with accelerator.main_process_first():
        try:
            return get_task(cfg).load_data(cfg, given)
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
        # Past a file-size limit (`ulimit -f`) a write raises an error we can report, instead of the
        # process being killed by SIGXFSZ in the middle of a checkpoint.
        self.previous[signal.SIGXFSZ] = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def _handle(self, signum, frame):
        self.received = signum

    def restore(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


class Throughput:
    """Samples and tokens trained per second. Evaluation and checkpoint pauses are left out, and so
    is the first optimizer step (compilation, allocator warm-up), reported on its own."""

    def __init__(self):
        self.window_start = self.start = time.perf_counter()
        self.window = [0, 0]  # samples, tokens since the last log line
        self.total = [0, 0]  # since the end of the first step
        self.paused_s = 0.0  # pauses since the end of the first step
        self.first_step_s: float | None = None

    def add(self, samples: int, tokens: int) -> None:
        self.window[0] += samples
        self.window[1] += tokens

    def first_step_done(self) -> None:
        self.first_step_s = time.perf_counter() - self.start
        self.start, self.paused_s = time.perf_counter(), 0.0
        self.total = [-self.window[0], -self.window[1]]  # what the window holds so far belongs to the first step

    def take_window(self) -> tuple[int, int, float]:
        """(samples, tokens, seconds) since the last call, then a new window."""
        now = time.perf_counter()
        samples, tokens = self.window
        seconds = now - self.window_start
        self.total = [self.total[0] + samples, self.total[1] + tokens]
        self.window, self.window_start = [0, 0], now
        return samples, tokens, seconds

    def train_seconds(self) -> float:
        return time.perf_counter() - self.start - self.paused_s

    @contextlib.contextmanager
    def paused(self):
        pause_start = time.perf_counter()
        yield
        pause = time.perf_counter() - pause_start
        self.window_start += pause
        self.paused_s += pause


@dataclass
class Parts:
    """Everything the loop works with, prepared by accelerate."""

    accelerator: Accelerator
    task: object
    data: object
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_loader: object
    val_loader: object
    test_loader: object | None
    progress: Progress
    total_steps: int
    resume_from: Path | None


@dataclass
class Given:
    """Objects passed to anytrain.train() instead of names: a model (or factory) and a datasets object."""

    model: object = None
    dataset: object = None


def train(cfg: TrainConfig, given: Given | None = None) -> dict:
    cfg = resolve_auto_resume(cfg)  # --resume auto: continue if there is a checkpoint, else start
    signals = StopSignals()
    lock = RunLock(cfg.output_dir)  # one run per run folder, held by the main process for the run's life
    try:
        return _train(cfg, signals, lock, given or Given())
    finally:
        lock.release()
        signals.restore()
        if torch.distributed.is_initialized():  # also on error paths: an abandoned gloo group can abort at exit
            torch.distributed.destroy_process_group()


def _train(cfg: TrainConfig, signals: StopSignals, lock: RunLock, given: Given) -> dict:
    started = time.perf_counter()
    accelerator = make_accelerator(cfg)
    if accelerator.device.type == "cpu":
        # Once gradients and Adam's moments get tiny they turn denormal, and x86 computes those in slow
        # microcode: 3x slower steps measured (docs/benchmarks.md). Flushed to zero, accuracy is unchanged.
        torch.set_flush_denormal(True)
    scenario = describe(accelerator)
    accelerator.print(format_scenario(scenario))
    parts = setup(cfg, accelerator, lock, given)
    loop = Loop(cfg, parts, signals)
    loop.run()
    return finish(cfg, parts, loop, scenario, started)


def take_lock(accelerator: Accelerator, lock: RunLock) -> None:
    """The main process locks the run folder; every rank learns the outcome, so all stop together."""
    outcome = [None, None]  # error, warning
    if accelerator.is_main_process:
        try:
            outcome[1] = lock.acquire()
        except ConfigError as err:
            outcome[0] = str(err)
    if accelerator.num_processes > 1:
        broadcast_object_list(outcome)
    if outcome[0]:
        raise ConfigError(outcome[0])
    if outcome[1]:
        accelerator.print(f"anytrain: WARNING: {outcome[1]}")


def setup(cfg: TrainConfig, accelerator: Accelerator, lock: RunLock, given: Given) -> Parts:
    run_dir = Path(cfg.output_dir)
    # Every check that can refuse the run happens before anything is written.
    check_run_folder(cfg)
    resume_from, pointer_warning = find_resume_checkpoint(cfg) if cfg.resume else (None, None)
    set_seed(cfg.seed)  # same initial weights on every rank (and DDP broadcasts rank 0's anyway)
    task = get_task(cfg)
    data = load_data(accelerator, cfg, given.dataset)
    check_writable(run_dir)
    take_lock(accelerator, lock)

    model = task.build_model(cfg, data, given.model)
    optimizer = build_optimizer(cfg, model, accelerator.device.type)
    loaders = [make_loader(split, cfg, shuffle=split is data.train) for split in (data.train, data.validation, data.test) if split is not None]
    # Moves the model to the device, wraps it for DDP/FSDP, mixed precision and torch.compile, and shards the loaders by rank.
    model, optimizer, *loaders = accelerator.prepare(model, optimizer, *loaders)
    batches = epoch_batches(loaders[0])
    steps_per_epoch = math.ceil(batches / cfg.grad_accum_steps) if batches is not None else math.inf  # the last, short cycle still steps
    total_steps = min(cfg.max_steps or math.inf, cfg.epochs * steps_per_epoch)  # a stream has no length: --max-steps then
    scheduler = build_scheduler(cfg, optimizer, total_steps)
    described = {"model": model_name(cfg, data.shape()), "num_workers": loader_workers(data.train, cfg), **task.describe_data(data, model_of(accelerator, model))}
    progress = Progress(config=cfg.to_dict(), data=described)
    if resume_from is not None:
        if pointer_warning:
            accelerator.print(f"anytrain: WARNING: {pointer_warning}")
        state = load_checkpoint(accelerator, resume_from, cfg)  # model, optimizer, scaler, RNG states
        progress.load_state_dict(state["progress"])
        scheduler.load_state_dict({**state["scheduler"], "lr_lambdas": [None] * len(scheduler.lr_lambdas)})
        accelerator.print(f"anytrain: resuming from {resume_from} at epoch {progress.epoch}, step {progress.step}")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        note = start_run_folder(run_dir, cfg, resumed_at_step=progress.step if resume_from else None)
        if note:
            accelerator.print(f"anytrain: {note}")
    if cfg.report_to != "none":  # the config as the run's hyper-parameters (trackers take scalars)
        hparams = {k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v) for k, v in cfg.to_dict().items()}
        accelerator.init_trackers(cfg.run_name or run_dir.resolve().name, config=hparams)
    test_loader = loaders[2] if len(loaders) > 2 else None
    return Parts(accelerator, task, data, model, optimizer, scheduler, loaders[0], loaders[1], test_loader, progress, total_steps, resume_from)


def epoch_batches(loader) -> int | None:
    """Batches per epoch on this rank; None for a stream."""
    try:
        return len(loader)
    except TypeError:
        return None


def model_of(accelerator: Accelerator, model: nn.Module) -> nn.Module:
    """The user's module inside accelerate's wrappers (DDP, torch.compile)."""
    return accelerator.unwrap_model(model, keep_torch_compile=False)


class Loop:
    """The epochs and steps of one run; its fields are the loop's state between steps."""

    def __init__(self, cfg: TrainConfig, parts: Parts, signals: StopSignals):
        self.cfg, self.parts, self.signals = cfg, parts, signals
        self.accelerator, self.progress = parts.accelerator, parts.progress
        self.run_dir = Path(cfg.output_dir)
        self.criterion = parts.task.criterion()
        tracker = self.accelerator.log if cfg.report_to != "none" else None
        self.log = MetricsLog(self.run_dir / "metrics.jsonl" if self.accelerator.is_main_process else None, tracker)
        self.bar = tqdm(
            total=parts.total_steps, initial=self.progress.step, unit="step", dynamic_ncols=True,
            disable=not (cfg.progress and self.accelerator.is_main_process),
        )
        # This rank's batch losses since the last log, with their step numbers (restored on resume).
        self.window_steps = [step for step, _ in self.progress.window]
        self.window_losses = [torch.tensor(loss, device=self.accelerator.device) for _, loss in self.progress.window]
        self.speed = Throughput()
        self.first_step = self.progress.step + 1
        self.val: dict = {}
        self.improved_at = -1  # step of the last validation that improved the best loss
        self.skipped_steps = 0
        self.epoch = self.progress.epoch
        self.train_seconds = self.loop_seconds = 0.0
        self.stopped_early = self.stop_signal = self.validated = self.epoch_ran_out = False

    def run(self) -> None:
        cfg, progress = self.cfg, self.progress
        loop_start = time.perf_counter()
        for epoch in range(progress.epoch, cfg.epochs if progress.step < self.parts.total_steps else 0):
            self.epoch = progress.epoch = epoch
            self.train_epoch(epoch)
            with self.speed.paused():
                self.end_epoch(epoch)
            if self.finished():
                break
        self.speed.take_window()
        self.train_seconds = self.speed.train_seconds()
        self.loop_seconds = time.perf_counter() - loop_start  # validations and checkpoints included
        self.bar.close()

    def train_epoch(self, epoch: int) -> None:
        accelerator, model, optimizer, cfg = self.accelerator, self.parts.model, self.parts.optimizer, self.cfg
        model.train()
        self.parts.train_loader.set_epoch(epoch)  # the shuffle order is a function of (seed, epoch): resumable, the same on every rank
        self.parts.data.train.set_epoch(epoch)  # so is the augmentation of images (accelerate only tells the sampler)
        # Resuming mid-epoch: skip the batches this epoch already trained on (same order, thanks to set_epoch).
        done = self.progress.batches_done
        batches = accelerator.skip_first_batches(self.parts.train_loader, done) if done else self.parts.train_loader
        self.validated = False
        self.epoch_ran_out = False
        for inputs, targets in batches:
            with accelerator.accumulate(model):  # gradients are all-reduced and applied once per grad_accum_steps batches
                outputs = model(inputs)
                loss = self.criterion(outputs, targets)
                accelerator.backward(loss)  # scales the loss under fp16 and divides it for accumulation
                if accelerator.sync_gradients and cfg.max_grad_norm:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)  # unscales first under fp16
                optimizer.step()  # a no-op until the accumulation cycle is complete
                optimizer.zero_grad()
            self.window_losses.append(loss.detach())  # no .item() here: a host sync every batch would stall a GPU
            self.window_steps.append(self.progress.step + 1)
            self.speed.add(len(targets) * accelerator.num_processes, targets.numel() * accelerator.num_processes)
            self.progress.batches_done += 1
            if accelerator.sync_gradients:
                self.after_step()
                if self.finished():
                    break
        else:
            self.epoch_ran_out = True  # the data ran out (how a stream's epoch ends)

    def after_step(self) -> None:
        """One optimizer step is complete: schedule, log, validate, stop on a signal, checkpoint."""
        cfg, progress = self.cfg, self.progress
        if self.accelerator.optimizer_step_was_skipped:  # fp16 overflow: no update, so no schedule advance
            self.skipped_steps += 1
        else:
            self.parts.scheduler.step()
        progress.step += 1
        self.bar.update(1)
        if progress.step == self.first_step:
            self.speed.first_step_done()
        self.validated = False
        if progress.step % cfg.log_every_steps == 0 or (self.accelerator.num_processes == 1 and self.signals.received):
            self.log_train()
        if cfg.eval_every_steps and progress.step % cfg.eval_every_steps == 0:
            with self.speed.paused():
                self.validate()
        if self.stop_signal:  # SIGTERM/SIGINT: this step is finished; save together, then exit 143/130
            raise Preempted(self.signals.received or signal.SIGTERM, self.checkpoint())
        if cfg.checkpoint_every_steps and progress.step % cfg.checkpoint_every_steps == 0:
            with self.speed.paused():
                self.checkpoint()

    def end_epoch(self, epoch: int) -> None:
        if not self.validated:  # every epoch ends with a validation (unless one just ran at this step)
            self.validate()
        if self.accelerator.is_main_process:
            metrics = ", ".join(f"val_{k} {v:.4f}" for k, v in self.val.items())
            tqdm.write(f"epoch {epoch}: step {self.progress.step}, {metrics}")
        if self.epoch_ran_out or self.progress.batches_done >= (epoch_batches(self.parts.train_loader) or math.inf):  # the epoch ran to its end
            self.progress.epoch, self.progress.batches_done = epoch + 1, 0
        self.checkpoint()

    def finished(self) -> bool:
        return self.stopped_early or self.progress.step >= self.parts.total_steps

    def log_train(self) -> None:
        mean_loss, self.stop_signal = self.health()
        samples, tokens, seconds = self.speed.take_window()
        rates = self.parts.task.rates(samples, tokens, seconds)
        lr = self.parts.scheduler.get_last_lr()[0]
        self.log.write(kind="train", step=self.progress.step, epoch=self.epoch, loss=mean_loss, lr=lr, **rates, skipped_steps=self.skipped_steps)
        self.bar.set_postfix(loss=f"{mean_loss:.4f}", **{k.removesuffix("_per_s") + "/s": f"{v:,.0f}" for k, v in rates.items() if v})
        self.window_losses.clear()
        self.window_steps.clear()

    def health(self) -> tuple[float, bool]:
        """One all-reduce: mean training loss over ranks since the last log, and whether any rank got a stop signal."""
        device = self.accelerator.device
        losses = torch.stack(self.window_losses).float() if self.window_losses else torch.zeros(0, device=device)
        counts = [float(len(self.window_losses)), float(self.signals.received > 0)]
        total = self.accelerator.reduce(torch.cat([losses.sum().view(1), torch.tensor(counts, device=device)]), "sum")
        mean_loss = (total[0] / total[1]).item() if total[1] > 0 else float("nan")
        if total[1] > 0 and not math.isfinite(mean_loss):
            bad = (~torch.isfinite(losses)).nonzero()
            first_bad = min(gather_object([self.window_steps[bad[0].item()] if len(bad) else 10**12]))
            raise NonFiniteLoss(
                f"the training loss became non-finite ({mean_loss}) at optimizer step {first_bad} (epoch {self.progress.epoch}); "
                f"stopped without saving. The last good checkpoint is in {self.run_dir / 'checkpoints'} (try a lower --lr, then --resume)"
            )
        return mean_loss, bool(total[2].item())

    def validate(self) -> None:
        """Evaluate, log, and update early stopping (decided the same on all ranks)."""
        progress, cfg, accelerator = self.progress, self.cfg, self.accelerator
        result = evaluate(self.parts.model, self.parts.val_loader, accelerator)
        self.parts.model.train()
        self.val = self.parts.task.eval_metrics(result["loss"], result["accuracy"])
        self.validated = True
        self.log.write(kind="eval", split="validation", step=progress.step, epoch=progress.epoch, **self.val)
        if result["loss"] < progress.best_val_loss - cfg.early_stopping_min_delta:
            progress.best_val_loss, progress.evals_without_improvement, self.improved_at = result["loss"], 0, progress.step
        else:
            progress.evals_without_improvement += 1
        patience_spent = cfg.early_stopping_patience and progress.evals_without_improvement >= cfg.early_stopping_patience
        if patience_spent and accelerator.is_main_process:
            accelerator.set_trigger()  # decided on the main process ...
        # ... and seen by every rank, so no rank breaks alone and hangs the others
        self.stopped_early = accelerator.check_trigger() or self.stopped_early

    def checkpoint(self) -> Path:
        self.health()  # never save a checkpoint over a NaN: raises if the loss went non-finite since the last check
        self.progress.window = [(step, loss.item()) for step, loss in zip(self.window_steps, self.window_losses)]
        is_best = self.improved_at == self.progress.step
        schedule = {k: v for k, v in self.parts.scheduler.state_dict().items() if k != "lr_lambdas"}  # plain numbers
        state = {"progress": self.progress.state_dict(), "scheduler": schedule}
        return save_checkpoint(self.accelerator, self.run_dir, self.progress.step, self.cfg.keep_checkpoints, is_best=is_best, state=state)


def write_curves(run_dir: Path) -> None:
    """curves.png beside metrics.jsonl when matplotlib is there; a picture never fails a finished run."""
    try:
        from .plot import plot_runs

        plot_runs([run_dir], run_dir / "curves.png")
    except ImportError:
        pass
    except Exception as e:  # noqa: BLE001 - report, do not fail
        print(f"anytrain: WARNING: could not draw {run_dir / 'curves.png'}: {e}", file=sys.stderr)


def finish(cfg: TrainConfig, parts: Parts, loop: Loop, scenario: dict, started: float) -> dict:
    """Test evaluation, final weights and summary.json; returns the summary."""
    accelerator, progress, task, run_dir = parts.accelerator, parts.progress, parts.task, Path(cfg.output_dir)
    test = {}
    if parts.test_loader is not None:
        result = evaluate(parts.model, parts.test_loader, accelerator)
        test = task.eval_metrics(result["loss"], result["accuracy"])
        loop.log.write(kind="eval", split="test", step=progress.step, epoch=loop.epoch, **test)
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(parts.model)  # full weights even when sharded (FSDP)
    state_dict = {k.replace("_orig_mod.", ""): v for k, v in state_dict.items()}  # torch.compile's wrapper is not the model
    # Each rank's fingerprint of its own weights: after data-parallel training they must all agree.
    rank_fingerprints = gather_object([weights_fingerprint(model_of(accelerator, parts.model))])
    peak, peak_kind = peak_memory_bytes(accelerator.device)
    train_seconds = loop.train_seconds
    summary = {
        **{f"test_{k}": v for k, v in test.items()},
        **{f"val_{k}": v for k, v in loop.val.items()},
        "best_val_loss": progress.best_val_loss,
        "epochs_completed": progress.epoch + (progress.batches_done > 0),
        "optimizer_steps": progress.step,
        "skipped_optimizer_steps": loop.skipped_steps,
        "stopped_early_at_epoch": loop.epoch if loop.stopped_early else None,
        "resumed_from": str(parts.resume_from) if parts.resume_from else None,
        **task.rates(*loop.speed.total, train_seconds),
        "first_step_s": loop.speed.first_step_s,
        "train_seconds": train_seconds,
        "loop_seconds": loop.loop_seconds,
        "peak_memory_bytes": peak,
        "peak_memory_kind": peak_kind,
        "wall_time_s": time.perf_counter() - started,
        "task": task.name,
        "dataset": parts.data.source,
        **progress.data,
        "weights_sha256_per_rank": rank_fingerprints,
        "scenario": scenario,
    }
    if accelerator.is_main_process:
        save_weights(state_dict, run_dir / WEIGHTS, cfg, task.weights_metadata(parts.data))
        write_json(run_dir / "summary.json", summary)
        if cfg.plot:
            write_curves(run_dir)
        final = test and {f"test_{k}": v for k, v in test.items()} or {f"val_{k}": v for k, v in loop.val.items()}
        accelerator.print(f"anytrain: {', '.join(f'{k} {v:.4f}' for k, v in final.items())}, {summary['wall_time_s']:.1f}s, run folder {run_dir}")
    loop.log.close()
    accelerator.end_training()
    return summary
