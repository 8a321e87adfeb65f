"""The training loop: a plain PyTorch loop plus a few accelerate calls, each commented.

`train()` sets the run up (hardware, data, model, optimizer, a resumed position). `Loop.run()` is
the loop itself, read top to bottom: the epochs, the per-batch step, then one line for each thing
that happens every N optimizer steps (log, validate, stop on a signal, checkpoint); the methods
after it hold only those bodies. `finish()` evaluates the test split and writes the run folder.
What differs between tasks (classification, language modelling, ...) lives in tasks/, one module per
task: the data, the model, the loss and the metrics.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object, set_seed
from torch import nn
from tqdm.auto import tqdm

from . import IMPORTED_AT, flops
from .best import BestWeights, Criterion
from .checkpoint import (
    Progress,
    find_resume_checkpoint,
    load_checkpoint,
    rank_state,
    read_pointer,
    resolve_auto_resume,
    save_checkpoint,
    save_what_trains,
)
from .config import ConfigError, TrainConfig
from .data.splits import Splits, loader_workers, make_loader
from .files import write_atomically
from .optim import build_optimizer, build_scheduler
from .outputs import WEIGHTS, MetricsLog, peak_memory_bytes, save_weights, weights_fingerprint, write_json
from .runfolder import check_run_folder, check_writable, start_run_folder
from .runlock import RunLock, check_not_in_use
from .scenario import describe, format_scenario, make_accelerator, prepare, set_host_malloc
from .shares import Weight, epoch_weights, split_as_it_falls
from .tasks import META_KEY, is_own
from .tasks.base import (
    best_criterion,
    check_loss,
    check_step,
    evaluate,
    loss_owner,
    owns_step,
    step_loss,
    training_loss,
    user_loss_function,
)
from .tasks.contract import RunContext, RunFacts, Task, exporter
from .tasks.settle import Settled, load
from .usermodel import forward_for, model_name


def load_data(accelerator, cfg: TrainConfig, given=None) -> tuple[Settled, Task, Splits]:
    """The task settled (tasks/settle.py: from the options, else the training labels), then its data loaded."""
    # The main process prepares (and caches) the dataset first; the others then read the cache.
    with accelerator.main_process_first():
        try:
            return load(cfg, given, RunFacts.of(accelerator))
        except ConfigError as err:
            error = err  # leave the context normally so no rank is left waiting at its barrier
    raise error


class Preempted(Exception):
    """SIGTERM/SIGINT arrived: a checkpoint was saved; exit with 128 + the signal number."""

    def __init__(self, signum: int, checkpoint: Path):
        super().__init__(
            f"stopped by {signal.Signals(signum).name}; checkpoint saved in {checkpoint}; continue with --resume"
        )
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
        self.begun = self.window_start = self.start = time.perf_counter()
        self.window = [0, 0]  # samples, tokens since the last log line
        self.total = [0, 0]  # since the end of the first step
        self.paused_s = 0.0  # pauses since the end of the first step
        self.first_step_s: float | None = None
        self.first_step_end: float | None = None
        self.ended: float | None = None

    def add(self, samples: int, tokens: int) -> None:
        self.window[0] += samples
        self.window[1] += tokens

    def step_done(self) -> None:
        """An optimizer step is complete; the first one is timed on its own."""
        if self.first_step_s is None:
            self.first_step_end = time.perf_counter()
            self.first_step_s = self.first_step_end - self.start
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

    def finish(self) -> None:
        """The loop is over: the last window is counted and the clocks stop."""
        self.take_window()
        self.ended = time.perf_counter()

    def train_seconds(self) -> float:
        assert self.ended is not None, "finish() first"
        return self.ended - self.start - self.paused_s

    def loop_seconds(self) -> float:
        """The whole loop, validations and checkpoints included."""
        assert self.ended is not None, "finish() first"
        return self.ended - self.begun

    @contextlib.contextmanager
    def paused(self):
        pause_start = time.perf_counter()
        yield
        pause = time.perf_counter() - pause_start
        self.window_start += pause
        self.paused_s += pause


class LossWindow:
    """This rank's batch losses since the last log line, with their step numbers; saved in
    checkpoints, so the first log line after a resume is the one the run would have written.
    Each batch loss is weighted by its share of its step (shares.py), so a step's loss is the sum of
    its batches' over `accum` (--grad-accum-steps) and the processes."""

    def __init__(self, saved: list, device: torch.device, accum: int):
        self.device, self.accum = device, accum
        self.steps = [step for step, _ in saved]
        self.losses = [torch.tensor(loss, device=device) for _, loss in saved]

    def add(self, step: int, loss: torch.Tensor) -> None:
        self.steps.append(step)
        self.losses.append(loss)  # a tensor: no .item() here, a host sync every batch would stall a GPU

    def mean(self, accelerator: Accelerator, signalled: bool) -> tuple[float | None, bool]:
        """One all-reduce: the mean loss over every rank's window (None when all are empty), and
        whether any rank received a stop signal. The sum of the weighted batch losses over accum x
        the steps and processes: the mean of the steps' losses, each what its step trained (also an
        epoch's last, short one), and of its batches' where every step holds accum full ones."""
        losses = torch.stack(self.losses).float() if self.losses else torch.zeros(0, device=self.device)
        counts = torch.tensor([float(self.accum * len(set(self.steps))), float(signalled)], device=self.device)
        total = accelerator.reduce(torch.cat([losses.sum().view(1), counts]), "sum")
        mean = (total[0] / total[1]).item() if total[1] > 0 else None
        return mean, bool(total[2].item())

    def first_non_finite_step(self) -> int:
        """Collective: the first step, over all ranks, whose batch loss was NaN or infinite."""
        bad = [step for step, loss in zip(self.steps, self.losses) if not torch.isfinite(loss)]
        return min(gather_object([bad[0] if bad else 10**12]))

    def state(self) -> list:
        return [(step, loss.item()) for step, loss in zip(self.steps, self.losses)]

    def clear(self) -> None:
        self.steps.clear()
        self.losses.clear()


@dataclass
class Parts:
    """Everything the loop works with, prepared by accelerate."""

    cfg: TrainConfig  # the settled config
    accelerator: Accelerator
    task: Task
    data: Splits
    model: nn.Module
    context: RunContext  # what a task's step is given: the model, how the loop calls it, the training loss
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_loader: Any  # accelerate's DataLoaderShard (or a dispatcher for a stream)
    val_loader: Any
    test_loader: Any
    progress: Progress
    total_steps: int | float  # float only as infinity: a stream without --max-steps is refused earlier
    resume_from: Path | None


@dataclass
class Given:
    """Objects passed to anytrain.train() instead of names: a model (or factory), a datasets object, a loss."""

    model: object = None
    dataset: object = None
    loss_fn: Callable | None = None  # fn(outputs, targets) -> scalar, as --loss module:fn


def train(cfg: TrainConfig, given: Given | None = None) -> dict:
    cfg = resolve_auto_resume(cfg)  # --resume auto: continue if there is a checkpoint, else start
    signals = StopSignals()
    lock = RunLock(cfg.run.output_dir)  # one run per run folder, held by the main process for the run's life
    try:
        return _train(cfg, signals, lock, given or Given())
    finally:
        lock.release()
        signals.restore()
        if torch.distributed.is_initialized():  # also on error paths: an abandoned gloo group can abort at exit
            torch.distributed.destroy_process_group()


def _train(cfg: TrainConfig, signals: StopSignals, lock: RunLock, given: Given) -> dict:
    started = time.perf_counter()
    host = set_host_malloc(cfg)  # before anything large is allocated
    accelerator = make_accelerator(cfg)
    save_what_trains(accelerator)  # a LoRA run's checkpoints: its adapters, not the frozen weights
    if accelerator.device.type == "cpu":
        # Once gradients and Adam's moments get tiny they turn denormal, and x86 computes those in slow
        # microcode: 3x slower steps measured (docs/benchmarks.md). Flushed to zero, accuracy is unchanged.
        torch.set_flush_denormal(True)
    scenario = describe(accelerator) | host
    accelerator.print(format_scenario(scenario))
    parts = setup(cfg, accelerator, lock, given)
    cfg = parts.cfg  # with the task settled
    loop = Loop(cfg, parts, signals)
    stopped_early_at = loop.run()
    return finish(cfg, parts, loop, {"stopped_early_at_epoch": stopped_early_at, "scenario": scenario}, started)


def take_lock(accelerator: Accelerator, lock: RunLock) -> None:
    """The main process locks the run folder; every rank learns the outcome, so all stop together."""
    outcome: list[str | None] = [None, None]  # error, warning
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


def say_task(accelerator: Accelerator, settled: Settled, task: Task, data: Splits) -> None:
    """The start-up lines of the task: which and why, what picks the best weights, and the notes."""
    accelerator.print(f"anytrain: task {task.name} ({settled.reason})")
    best_by = best_criterion(task)
    why = f"the headline metric of {task.name}" if best_by.metric == task.headline else "--best-metric"
    accelerator.print(f"anytrain: the best weights and early stopping follow the {best_by} ({why})")
    for note in (*settled.notes, *data.notes):  # defaults fitted to the model, skipped files, a quantity-like label
        accelerator.print(f"anytrain: {note}")


def setup(cfg: TrainConfig, accelerator: Accelerator, lock: RunLock, given: Given) -> Parts:
    run_dir = Path(cfg.run.output_dir)
    # Every check that can refuse the run happens before anything is written.
    check_not_in_use(run_dir)  # a run still training in the folder is said first (the lock is taken below)
    resume_from, pointer_warning = find_resume_checkpoint(cfg) if cfg.run.resume else (None, None)
    user_loss = given.loss_fn or (user_loss_function(cfg.optim.loss) if ":" in cfg.optim.loss else None)
    set_seed(cfg.run.seed)  # same initial weights on every rank (and DDP broadcasts rank 0's anyway)
    settled, task, data = load_data(accelerator, cfg, given.dataset)
    cfg = settled.cfg  # a new config: the task settled, as config.yaml and the checkpoints hold it
    say_task(accelerator, settled, task, data)
    check_run_folder(cfg)
    model = task.build_model(given.model)
    for line in task.said:  # what the task said of its model (a fused loss, packing, LoRA's adapters)
        accelerator.print(f"anytrain: {line}")
    forward = forward_for(model, task.targets_to_model)  # model(inputs), + the targets if it computes its own loss
    criterion = training_loss(task, user_loss)
    who = loss_owner(task, cfg.model.name, user_loss)  # your own task's loss is blamed on it, not on --model
    if not owns_step(task):  # the default step: scalar, finite, requires grad, on a batch of 2, before step 1
        with accelerator.autocast():  # in the precision training will use
            check_loss(criterion, model, task, data.shape, forward, who)
    check_writable(run_dir)  # the first write: nothing above may leave anything behind
    take_lock(accelerator, lock)
    if pointer_warning:
        accelerator.print(f"anytrain: WARNING: {pointer_warning}")
    context = RunContext(accelerator, model, cfg, run_dir, forward, criterion)
    return prepare_parts(context, task, data, settled.reason, resume_from)


def prepare_parts(context: RunContext, task: Task, data: Splits, reason: str, resume_from: Path | None) -> Parts:
    """Optimizer, loaders and schedule; the model and loaders prepared by accelerate; the task's start; a resumed
    run's checkpoint loaded; the run folder (re)started."""
    cfg, accelerator, model = context.cfg, context.accelerator, context.model
    optimizer = build_optimizer(cfg.optim, model, accelerator.device.type)
    splits = [split for split in (data.train, data.validation, data.test) if split is not None]
    local = task.run.local_processes  # they share this machine's cores (image decoding workers)
    loaders = [make_loader(split, cfg, shuffle=split is data.train, local_processes=local) for split in splits]
    # Moves the model to the device, wraps it for DDP/FSDP, mixed precision, torch.compile; shards the loaders by rank.
    model, optimizer, *loaders = prepare(accelerator, model, optimizer, *loaders)  # + FSDP2's autocast
    split_as_it_falls(loaders[0])  # the last, short round of batches over the processes as it falls: no row twice
    context = replace(context, model=model)
    total_steps = count_steps(cfg, loaders[0])
    scheduler = build_scheduler(cfg.optim, optimizer, total_steps)
    described = {
        "task_reason": reason,
        "model": model_name(cfg.model, data.shape),
        "num_workers": loader_workers(data.train, cfg, task.run.local_processes),
        **task.describe_data(model_of(accelerator, model)),
    }
    progress = Progress(config=cfg.to_dict(), data=described)
    task.on_run_start(context)  # what the task prepares once, from the starting weights (a reference, a copy)
    if owns_step(task):  # its own step, once on its first training rows as training will run it (then forgotten)
        check_step(task, context)
    if resume_from is not None:
        state = load_checkpoint(accelerator, resume_from, cfg, task.positions(cfg))  # model, optimizer, RNG states
        progress.load_state_dict(state["progress"])
        scheduler.load_state_dict({**state["scheduler"], "lr_lambdas": [None] * len(scheduler.lr_lambdas)})
        task.load_state_dict(state.get("task", {}))  # what the task keeps across a kill
        task.load_rank_state(rank_state(accelerator, resume_from))  # ... and each process's own tensors
        accelerator.print(f"anytrain: resuming from {resume_from} at epoch {progress.epoch}, step {progress.step}")
    open_run_folder(cfg, accelerator, progress.step if resume_from else None, data.files)
    test_loader = loaders[2] if len(loaders) > 2 else None
    return Parts(
        cfg,
        accelerator,
        task,
        data,
        model,
        context,
        optimizer,
        scheduler,
        train_loader=loaders[0],
        val_loader=loaders[1],
        test_loader=test_loader,
        progress=progress,
        total_steps=total_steps,
        resume_from=resume_from,
    )


def count_steps(cfg: TrainConfig, train_loader) -> int | float:
    """Optimizer steps the run will take: the last, short accumulation cycle of an epoch still steps;
    a stream has no length, so --max-steps then."""
    batches = epoch_batches(train_loader)
    steps_per_epoch = math.ceil(batches / cfg.optim.grad_accum_steps) if batches is not None else math.inf
    return min(cfg.optim.max_steps or math.inf, cfg.optim.epochs * steps_per_epoch)


def open_run_folder(cfg: TrainConfig, accelerator: Accelerator, resumed_at_step: int | None, files: dict) -> None:
    """The main process (re)starts the run folder once every rank has loaded, and writes the task's files
    (a BPE's tokenizer.json); trackers get the config."""
    run_dir = Path(cfg.run.output_dir)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        note = start_run_folder(run_dir, cfg, resumed_at_step=resumed_at_step)
        if note:
            accelerator.print(f"anytrain: {note}")
        for name, text in files.items():
            write_atomically(run_dir / name, text)
    if cfg.run.report_to != "none":  # the config as the run's hyper-parameters (trackers take scalars)
        hparams = {k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v) for k, v in cfg.flat().items()}
        accelerator.init_trackers(cfg.run.run_name or run_dir.resolve().name, config=hparams)


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
    """One run's epochs and steps. Its fields are what lives from one step to the next."""

    def __init__(self, cfg: TrainConfig, parts: Parts, signals: StopSignals):
        self.cfg, self.parts, self.signals = cfg, parts, signals
        accelerator, run_dir = parts.accelerator, Path(cfg.run.output_dir)
        tracker = accelerator.log if cfg.run.report_to != "none" else None
        self.log = MetricsLog(run_dir / "metrics.jsonl" if accelerator.is_main_process else None, tracker)
        show = cfg.run.progress and accelerator.is_main_process
        self.bar = tqdm(
            total=parts.total_steps, initial=parts.progress.step, unit="step", dynamic_ncols=True, disable=not show
        )
        self.window = LossWindow(parts.progress.window, accelerator.device, cfg.optim.grad_accum_steps)  # resumed too
        self.speed = Throughput()
        self.val: dict = {}  # the last validation's metrics
        self.best = BestWeights(cfg.eval.final_weights == "best")  # the best validation's weights (best.py)
        self.best_by = best_criterion(parts.task)  # --best-metric and which way it improves
        if parts.resume_from is not None:
            self.best.resume(
                model_of(accelerator, parts.model), parts.resume_from, parts.progress.best_step, parts.progress.step
            )
        self.skipped_steps = 0  # fp16 overflows: optimizer steps without an update
        self.figures: dict = {}  # the task's own figures of the first and the last log line (summary.json)
        self.scale = accelerator.scaler.get_scale() if accelerator.scaler is not None else None  # fp16's loss scale

    def run(self) -> int | None:
        """Train until the epochs or --max-steps run out or early stopping says stop; returns the
        epoch at which early stopping stopped the run, None when it did not."""
        cfg, parts, progress, accelerator = self.cfg, self.parts, self.parts.progress, self.parts.accelerator
        model, task, optimizer = parts.model, parts.task, parts.optimizer
        log_every, save_every = cfg.run.log_every_steps, cfg.run.checkpoint_every_steps
        eval_every, clip = cfg.eval.eval_every_steps, cfg.optim.max_grad_norm
        epoch_length = epoch_batches(parts.train_loader) or math.inf  # a stream's epoch ends when it runs out
        stop_early = False
        for epoch in range(progress.epoch, cfg.optim.epochs if progress.step < parts.total_steps else 0):
            progress.epoch, validated_at, ran_out = epoch, None, True
            model.train()
            for batch, ctx in self.batches(epoch):
                with accelerator.accumulate(model):  # all-reduced and applied once per grad_accum_steps batches
                    loss = step_loss(task.train_step(ctx, batch), task)  # default: the forward pass, the loss
                    loss = ctx.weighted(loss)  # by its rows' share of the step (shares.py): 1 where sizes divide
                    accelerator.backward(loss)  # scales the loss under fp16 and divides it for accumulation
                    if accelerator.sync_gradients and clip:
                        accelerator.clip_grad_norm_(model.parameters(), clip)  # unscales first under fp16
                    optimizer.step()  # a no-op until the accumulation cycle is complete
                    optimizer.zero_grad()
                self.window.add(progress.step + 1, loss.detach())
                samples, tokens = task.batch_counts(batch)
                self.speed.add(samples * accelerator.num_processes, tokens * accelerator.num_processes)
                progress.batches_done += 1
                if not accelerator.sync_gradients:
                    continue  # inside an accumulation cycle: no optimizer step yet
                self.step_done()
                signalled = False
                if progress.step % log_every == 0 or (accelerator.num_processes == 1 and self.signals.received):
                    signalled = self.log_train()
                if eval_every and progress.step % eval_every == 0:
                    stop_early, validated_at = self.validate() or stop_early, progress.step
                if signalled:  # SIGTERM/SIGINT on any rank: this step is done; save together, then exit 143/130
                    raise Preempted(self.signals.received or signal.SIGTERM, self.checkpoint())
                if save_every and progress.step % save_every == 0:
                    self.checkpoint()
                if stop_early or progress.step >= parts.total_steps:
                    ran_out = False
                    break
            if validated_at != progress.step:  # every epoch ends with a validation, unless one just ran
                stop_early = self.validate() or stop_early
            self.say_epoch()
            if ran_out or progress.batches_done >= epoch_length:  # the epoch ran to its end
                progress.epoch, progress.batches_done = epoch + 1, 0
            self.checkpoint()
            if stop_early or progress.step >= parts.total_steps:
                break
        self.speed.finish()
        self.bar.close()
        return epoch if stop_early else None

    def batches(self, epoch: int):
        """This epoch's training batches, each with its RunContext (the step it belongs to, its weight in it). The
        shuffle order and the images' augmentation are functions of (seed, epoch), the same on every rank, so a
        resumed epoch skips exactly the batches it trained on."""
        parts, progress = self.parts, self.parts.progress
        loader = parts.train_loader
        loader.set_epoch(epoch)  # the sampler's order (accelerate's seedable sampler)
        parts.data.train.set_epoch(epoch)  # the augmentation (accelerate only tells the sampler)
        # Each batch's weight in its step: its rows' (or a step_shares task's target tokens') share of the step's.
        counts = parts.task.step_counts(epoch) if parts.task.step_shares else None
        weights = epoch_weights(loader, epoch, counts, self.cfg.optim.grad_accum_steps)
        done, accum = progress.batches_done, self.cfg.optim.grad_accum_steps
        length = epoch_batches(loader) or math.inf  # a stream's: its cycles are all whole until it runs out
        batches = parts.accelerator.skip_first_batches(loader, done) if done else loader
        for k, batch in enumerate(batches, start=done):
            mine = Weight(None, 1.0) if weights is None else weights[k]  # a stream: each batch its own mean
            micro = k % accum  # its place in the step's accumulation cycle, the last cycle as long as it is
            cycle = int(min(accum, length - (k - micro)))
            yield batch, replace(parts.context, epoch=epoch, step=progress.step, share=mine.share, weight=mine.weight,
                                 micro=micro, micro_batches=cycle)  # fmt: skip

    def step_done(self) -> None:
        """An optimizer step is complete: advance the schedule (unless fp16 skipped the update), the count, the bar."""
        if self.step_was_skipped():
            self.skipped_steps += 1
        else:
            self.parts.scheduler.step()
        self.parts.progress.step += 1
        self.bar.update(1)
        self.speed.step_done()

    def step_was_skipped(self) -> bool:
        """fp16: whether GradScaler skipped this step's update (inf or NaN gradients). accelerate's own flag misses
        the skips of a fused optimizer (AdamW on CUDA), which skips inside its step; the loss scale backs off
        exactly when a step is skipped (it only grows otherwise). One host sync per step, under fp16 only."""
        scaler = self.parts.accelerator.scaler
        if scaler is None:
            return False
        scale, self.scale = self.scale, scaler.get_scale()
        return self.scale < scale

    def log_train(self) -> bool:
        """Log the mean training loss since the last log line; returns whether any rank got SIGTERM/SIGINT."""
        progress = self.parts.progress
        mean_loss, signalled = self.window.mean(self.parts.accelerator, self.signals.received > 0)
        self.check_finite(mean_loss)
        rates = self.parts.task.rates(*self.speed.take_window())
        lr = self.parts.scheduler.get_last_lr()[0]
        figures = self.parts.task.train_figures(self.parts.accelerator)  # the task's own (grpo: rewards), collective
        self.figures = {"first": self.figures.get("first") or figures, "last": figures} if figures else self.figures
        self.log.write(
            kind="train",
            step=progress.step,
            epoch=progress.epoch,
            loss=mean_loss,
            lr=lr,
            **rates,
            skipped_steps=self.skipped_steps,
            **figures,
        )
        self.bar.set_postfix(
            loss=f"{mean_loss:.4f}", **{k.removesuffix("_per_s") + "/s": f"{v:,.0f}" for k, v in rates.items() if v}
        )
        self.window.clear()
        return signalled

    def check_finite(self, mean_loss: float | None) -> None:
        if mean_loss is not None and not math.isfinite(mean_loss):
            own = f" (what --task {self.parts.task.key}'s train_step returned)" if is_own(self.parts.task.key) else ""
            raise NonFiniteLoss(
                f"the training loss{own} became non-finite ({mean_loss}) at optimizer step "
                f"{self.window.first_non_finite_step()} "
                f"(epoch {self.parts.progress.epoch}); stopped without saving. {self.last_good()}"
            )

    def last_good(self) -> str:
        """Where to go on from after a non-finite loss: the last checkpoint, or a fresh start when there is none."""
        latest = read_pointer(Path(self.cfg.run.output_dir), "latest")
        if latest is None:
            return "No checkpoint was saved before it: start again with a lower --lr (and --overwrite)"
        return f"The last good checkpoint is {latest} (try a lower --lr, then --resume)"

    def validate(self) -> bool:
        """Evaluate the validation split, log it, count patience; True when early stopping says stop,
        decided on the main process and seen by every rank (so no rank stops alone and hangs the others)."""
        progress, accelerator, model = self.parts.progress, self.parts.accelerator, self.parts.model
        with self.speed.paused():
            result = evaluate(
                model, self.parts.val_loader, self.parts.task, accelerator.gather_for_metrics, self.parts.context.call
            )
            model.train()
        self.val = {k: v for k, v in result.items() if k != "samples"}
        self.log.write(kind="eval", split="validation", step=progress.step, epoch=progress.epoch, **self.val)
        if self.best_by.metric not in self.val:  # a model that returns its loss alone: no logits to score
            accelerator.print(
                f"anytrain: WARNING: validation has no {self.best_by.metric} (the model returns its loss "
                "alone): the best weights and early stopping follow the validation loss"
            )
            self.best_by = Criterion("loss", higher=False)
        # the loss breaks a tie in the metric; a task without an evaluation loss (grpo) has none: no tie-break
        loss, best_loss = self.val.get("loss", math.inf), progress.best_val.get("loss", math.inf)
        value, min_delta = self.val[self.best_by.metric], self.cfg.eval.early_stopping_min_delta
        if self.best_by.improves(value, progress.best_value, min_delta, loss, best_loss):
            progress.best_value, progress.evals_without_improvement = value, 0
            progress.best_step, progress.best_val = progress.step, self.val
            with self.speed.paused():  # a copy on the CPU: not training time
                self.best.take(model_of(accelerator, model), progress.step)
        else:
            progress.evals_without_improvement += 1
        patience = self.cfg.eval.early_stopping_patience
        if patience and progress.evals_without_improvement >= patience and accelerator.is_main_process:
            accelerator.set_trigger()
        return accelerator.check_trigger()

    def final_weights(self) -> tuple[dict, dict]:
        """Put the best validation's weights back (--final-weights best) unless the last step's are those.
        Returns (which weights the model now holds and their step, their validation metrics), the first with
        each rank's fingerprint of them and of the last step's (after data-parallel training ranks agree)."""
        progress, accelerator = self.parts.progress, self.parts.accelerator
        model = model_of(accelerator, self.parts.model)
        last = gather_object([weights_fingerprint(model.state_dict())])
        facts = {"weights_sha256_per_rank": last, "last_weights_sha256": last[0]}
        if self.best.restore(model, progress.step):
            facts["weights_sha256_per_rank"] = gather_object([weights_fingerprint(model.state_dict())])
        elif self.best.step != progress.step:
            return {"final_weights": "last", "final_weights_step": progress.step, **facts}, self.val
        return {"final_weights": "best", "final_weights_step": self.best.step, **facts}, progress.best_val

    def test(self, epochs_completed: int) -> dict:
        """The test split's metrics, logged; {} when there is no test split."""
        parts = self.parts
        if parts.test_loader is None:
            return {}
        result = evaluate(
            parts.model, parts.test_loader, parts.task, parts.accelerator.gather_for_metrics, parts.context.call
        )
        test = {k: v for k, v in result.items() if k != "samples"}
        self.log.write(kind="eval", split="test", step=parts.progress.step, epoch=max(epochs_completed - 1, 0), **test)
        return test

    def say_epoch(self) -> None:
        if self.parts.accelerator.is_main_process:
            metrics = ", ".join(f"val_{k} {v:.4f}" for k, v in self.val.items())
            tqdm.write(f"epoch {self.parts.progress.epoch}: step {self.parts.progress.step}, {metrics}")

    def checkpoint(self) -> Path:
        """Save model, optimizer, RNG states and the loop's position (all ranks together), never over a NaN."""
        progress, accelerator = self.parts.progress, self.parts.accelerator
        with self.speed.paused():
            self.check_finite(self.window.mean(accelerator, False)[0])
            progress.window = self.window.state()
            schedule = {
                k: v for k, v in self.parts.scheduler.state_dict().items() if k != "lr_lambdas"
            }  # plain numbers
            state = {"progress": progress.state_dict(), "scheduler": schedule, "task": self.parts.task.state_dict()}
            return save_checkpoint(
                accelerator,
                Path(self.cfg.run.output_dir),
                progress.step,
                self.cfg.run.keep_checkpoints,
                is_best=progress.best_step == progress.step,
                state=state,
                tensors=self.best.to_save(progress.step),
                rank_tensors=self.parts.task.rank_state(),  # each process's own (grpo: a rollout in progress)
            )


def utilisation_of(cfg: TrainConfig, parts: Parts, summary: dict) -> dict:
    """The model's training FLOPs, the rate achieved over the run and the MFU (flops.py), from the summary's rates."""
    data, accelerator = parts.data, parts.accelerator
    context = data.tokens_per_sample or data.shape.max_length or 1
    rates = {k: summary.get(k) for k in ("samples_per_s", "tokens_per_s")}
    precision, processes = summary["scenario"]["mixed_precision"], accelerator.num_processes
    model = model_of(accelerator, parts.model)
    return flops.utilisation(model, data.shape, context, rates, processes, accelerator.device, precision,
                             cfg.run.peak_tflops)  # fmt: skip


def write_curves(run_dir: Path) -> None:
    """curves.png beside metrics.jsonl when matplotlib is there; a picture never fails a finished run."""
    try:
        from .plot import plot_runs

        plot_runs([run_dir], run_dir / "curves.png")
    except ImportError:
        pass
    except Exception as e:  # noqa: BLE001 - report, do not fail
        print(f"anytrain: WARNING: could not draw {run_dir / 'curves.png'}: {e}", file=sys.stderr)


def describe_weights(weights: dict, progress: Progress, metric: str) -> str:
    """Which weights the final metrics and model.safetensors are, in words."""
    if weights["final_weights"] == "last":
        return f"the last step's weights, step {progress.step}"
    best = f"the weights of the best validation {metric}"
    if weights["final_weights_step"] == progress.step:
        return f"{best}: the last step's, {progress.step}"
    step = weights["final_weights_step"]
    return f"{best}, step {step} of {progress.step}; --final-weights last for the last"


def finish(cfg: TrainConfig, parts: Parts, loop: Loop, outcome: dict, started: float) -> dict:
    """Test evaluation, final weights and summary.json; returns the summary."""
    accelerator, progress, task, run_dir = parts.accelerator, parts.progress, parts.task, Path(cfg.run.output_dir)
    epochs_completed = progress.epoch + (progress.batches_done > 0)
    weights, val = loop.final_weights()  # the best validation's, by default
    test = loop.test(epochs_completed)
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(parts.model)  # full weights even when sharded (FSDP)
    state_dict = {
        k.replace("_orig_mod.", ""): v for k, v in state_dict.items()
    }  # torch.compile's wrapper is not the model
    peak, peak_kind = peak_memory_bytes(accelerator.device)
    speed = loop.speed
    summary = {
        **{f"test_{k}": v for k, v in test.items()},
        **{f"val_{k}": v for k, v in val.items()},
        "best_metric": loop.best_by.metric,
        f"best_val_{loop.best_by.metric}": progress.best_value,
        **weights,  # which weights; each rank's fingerprint of them, and of the last step's
        "epochs_completed": epochs_completed,
        "optimizer_steps": progress.step,
        "skipped_optimizer_steps": loop.skipped_steps,
        "stopped_early_at_epoch": outcome["stopped_early_at_epoch"],
        "resumed_from": str(parts.resume_from) if parts.resume_from else None,
        **task.rates(speed.total[0], speed.total[1], speed.train_seconds()),
        "first_step_s": speed.first_step_s,
        # import anytrain (the top of src/train.py) to the end of the first optimizer step: the start-up a user waits
        "start_to_first_step_s": speed.first_step_end and speed.first_step_end - IMPORTED_AT,
        "train_seconds": speed.train_seconds(),
        "loop_seconds": speed.loop_seconds(),
        "peak_memory_bytes": peak,
        "peak_memory_kind": peak_kind,
        "wall_time_s": time.perf_counter() - started,
        "task": task.name,
        "dataset": parts.data.source,
        **{f"train_{when}": figures for when, figures in loop.figures.items()},  # the task's own, first and last
        **progress.data,
        "scenario": outcome["scenario"],
    }
    summary.update(utilisation_of(cfg, parts, summary))  # FLOPs, the FLOP rate achieved, MFU (flops.py)
    if accelerator.is_main_process:
        save_weights(state_dict, run_dir / WEIGHTS, cfg, {**task.weights_metadata(), META_KEY: task.key})
        export = exporter(task)  # a task that offers it: a transformers model's save_pretrained
        if export is not None:
            export.export(model_of(accelerator, parts.model), run_dir)
        write_json(run_dir / "summary.json", summary)
        if cfg.run.plot:
            write_curves(run_dir)
        final = test and {f"test_{k}": v for k, v in test.items()} or {f"val_{k}": v for k, v in val.items()}
        which = describe_weights(weights, progress, loop.best_by.metric)
        accelerator.print(
            f"anytrain: {', '.join(f'{k} {v:.4f}' for k, v in final.items())} ({which}), "
            f"{summary['wall_time_s']:.1f}s{flops.said(summary)}, run folder {run_dir}"
        )
    loop.log.close()
    accelerator.end_training()
    return summary
