"""The contract between the loop and a task: what a task must define, what it may, and what it gets. A task missing a
required method is refused when it is registered, in one line naming the method; a capability it offers is backed
by its methods (`offered`, `CAPABILITIES`): there are no refusal stubs.

    class Smooth(contract.Task):
        name = "smooth"                                  # --task smooth; the start-up line and summary.json
        goals = {"loss": LOWER, "accuracy": HIGHER}      # each metric `metrics` returns, its direction (no "loss":
        headline = "accuracy"                            #   no evaluation loss); the best weights' metric
        offers = frozenset({"predict"})                  # capabilities: + predict_inputs, predict_batch
        options = SmoothOptions                          # its own option() fields: flags, YAML, resume check
        step_shares = False                              # True: its loss is loss_sum over the batch's step share

    Must:  load_data(given=None) -> Splits                # read, check, split; its rows collate to its batches
           build_model(given=None) -> nn.Module          # the model to train
           model_from_metadata(meta, given=None)         # the model saved weights load into
           metrics(sums, count) -> dict                  # the split's metrics from the summed statistics
    Must, unless it owns its step (train_step) or its evaluation (eval_batch), whose batches are (inputs, targets):
           loss(outputs, targets), example_targets(shape, batch)   # the default step, checked on 2 rows at start
           per_sample(outputs, targets) -> dict          # the default evaluation's per-sample statistics
    May:   train_step(ctx, batch) -> Tensor              # a batch as its rows collate it (PairBatch, a Slot), untouched
           eval_batch(model, batch, forward) -> dict     # ... in evaluation (generation adds to it)
           batch_counts(batch) -> (samples, tokens)      # what it counts for in the throughput figures
           on_run_start(ctx) / after_check()             # once before step 1 / after the start-up check of its step
           state_dict() / load_state_dict(state)         # what it keeps across a kill (the checkpoint's JSON)
           rank_state() / load_rank_state(tensors)       # ... each process's own tensors

It gets `self.cfg` (the settled config), `self.run` (RunFacts: where it runs, before its data is read) and, in its
step, a RunContext: the prepared model and how to call it (ctx.forward, so that DDP and FSDP synchronise), the loss
the loop trains on (ctx.loss), the step, the batch's share of it and its place in its accumulation cycle (ctx.micro
of ctx.micro_batches). The loop, predict, sample and reload call nothing else on a task.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

import numpy as np
import torch
from torch import nn

from ..best import LOWER
from ..config import ConfigError, TrainConfig
from ..data.splits import Splits, targets_of
from ..shape import DataShape

if TYPE_CHECKING:
    from accelerate import Accelerator

# capability -> the methods a task that offers it defines (beyond the required ones)
CAPABILITIES: dict[str, tuple[str, ...]] = {
    "predict": ("predict_inputs", "predict_batch"),  # `anytrain predict RUN --dataset FILE`
    "sample": ("sample",),  # `anytrain sample RUN --prompt TEXT`
    "export": ("export",),  # files beside model.safetensors at the end (a transformers folder)
    "packing": (),  # --packing: texts concatenated into full rows, kept apart
    "lora": (),  # --lora-r: adapters trained beside frozen weights
    "streaming": (),  # --streaming: rows read as they are trained on
}
WHAT = {
    "predict": "has no predictions for rows",
    "sample": "does not sample text",
    "export": "exports nothing",
    "packing": "does not pack texts",
    "lora": "does not train LoRA adapters",
    "streaming": "does not read streams",
}
ASKED_BY = {"packing": "packing", "lora": "lora_r", "streaming": "streaming"}  # capability -> the option asking for it


@dataclass(frozen=True)
class RunFacts:
    """Where a task runs, known before its data is read (`task.run`, set by make_task): the number of processes (and
    of those on this machine), this one's rank, its device, the precision, whether the run shards the weights (FSDP,
    DeepSpeed) and how to print a line once (the main process). A task reads these rather than accelerate's global
    state or the environment. Outside a launch (predict, sample, your own code) it is one process on the CPU."""

    processes: int = 1
    rank: int = 0
    device: str = "cpu"
    precision: str = "no"  # accelerate's mixed precision: no, fp16, bf16
    say: Callable[[str], None] = print  # a line printed by the main process only
    local_processes: int = 1  # the launch's processes on this machine (they share its cores)
    shards: bool = False  # FSDP or DeepSpeed: a layer's weights are split over the processes

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def pad_multiple(self) -> int | None:
        """Batches padded to a multiple of 8 under fp16/bf16 (tensor cores), to their longest row otherwise."""
        return 8 if self.precision in ("fp16", "bf16") else None

    @classmethod
    def of(cls, accelerator: Accelerator) -> RunFacts:
        import os

        from accelerate.utils import DistributedType

        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # the launcher's: accelerate's state does not hold it
        shards = accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)
        return cls(accelerator.num_processes, accelerator.process_index, str(accelerator.device),
                   str(accelerator.mixed_precision), accelerator.print, local, shards)  # fmt: skip


@dataclass(frozen=True)
class RunContext:
    """What the loop gives a task's step and lifecycle methods: the run's accelerator, the prepared model (inside
    accelerate's wrappers: DDP, FSDP, torch.compile, autocast; call it through `forward` so that gradients
    synchronise), the settled config and run folder, and where the run is. `share`, for a task with step_shares,
    is this batch's share of its optimizer step's count (step_counts over processes x accumulation steps); a loss
    that divides its sum by it makes the step's gradient that of the mean over the whole step, on any number of
    ranks and accumulation steps. None for other tasks and outside a step. `weight` is what the loop multiplies
    the batch's loss by (shares.py): for a mean, its rows' share of the step's rows (exactly 1 where the sizes
    divide); 0 for a filler row, which a process runs when the epoch's last batches left it none."""

    accelerator: Accelerator
    model: nn.Module
    cfg: TrainConfig
    run_dir: Path
    call: Callable[..., Any]  # how the loop calls the model (usermodel.forward_for): use forward()
    criterion: Callable[..., torch.Tensor]  # the loop's training loss (tasks.base.training_loss): use loss()
    epoch: int = 0
    step: int = 0  # optimizer steps done before this batch
    share: float | None = None
    weight: float = 1.0
    micro: int = 0  # this batch's place in its step's accumulation cycle: 0 .. micro_batches - 1
    micro_batches: int = 1  # the cycle's batches: --grad-accum-steps, fewer in an epoch's last, short cycle

    def forward(self, inputs, targets: torch.Tensor | None = None):
        """The model's outputs for a batch: model(inputs), + the targets when it computes its own loss, + the
        batch's share (num_items_in_batch) when it has one."""
        return self.call(self.model, inputs, targets, self.share)

    def loss(self, outputs, targets: torch.Tensor) -> torch.Tensor:
        """The training loss of a batch's outputs: the model's own, else --loss, else Task.loss (with the share)."""
        return self.criterion(outputs, targets, self.share)

    def weighted(self, loss: torch.Tensor) -> torch.Tensor:
        """The batch's loss (train_step's) times its weight; untouched where that is 1."""
        return loss if self.weight == 1 else loss * self.weight


class Task(abc.ABC):
    """What the trainer, `anytrain predict`, `anytrain sample` and load_model ask of a task. A task is made
    with the settled config, `Task(cfg)`; after load_data it keeps what it derived from the data (a
    tokenizer, target statistics, a transformers config)."""

    name: ClassVar[str] = ""  # the --task it trains
    # every metric `metrics` returns, best.HIGHER or LOWER; "loss" among them unless the task has no evaluation loss
    # (grpo evaluates by generating: its validation and test lines and summary.json then hold no loss)
    goals: ClassVar[dict[str, str]] = {"loss": LOWER}
    headline: ClassVar[str] = "loss"  # the metric users judge the task by (best weights, early stopping)
    offers: ClassVar[frozenset[str]] = frozenset()  # its optional capabilities (CAPABILITIES)
    options: ClassVar[type | None] = None  # a frozen dataclass of config.option() fields: its own section
    targets_to_model: ClassVar[bool] = True  # the targets go to a model whose forward takes them (its own loss)
    step_shares: ClassVar[bool] = False  # the loop gives each batch its share of its step's count (ctx.share)
    hints: ClassVar[dict[str, str]] = {}  # capability -> what to use instead, said with its refusal
    losses: ClassVar[tuple[str, ...]] = ()  # the built-in --loss names it also trains with (mse, huber)
    labelled: ClassVar[bool] = False  # it reads a label column (--label-column): a table's 'target' is found for it

    key: str = ""  # its registry line (or FILE.py:Class), set by the registry
    run: RunFacts = RunFacts()  # where it runs (processes, rank, device, precision), set by make_task before load_data
    data: Splits

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.said: list[str] = []  # lines for the start-up log (say); the loop prints them after build_model

    def say(self, line: str) -> None:
        """A line about the model or the data for the start-up log: the loop prints it, once, from the main
        process (a task reaches for no global state to print)."""
        self.said.append(line)

    # --------------------------------------------------------------------------- required
    @abc.abstractmethod
    def load_data(self, given=None) -> Splits: ...  # read, check, split; ConfigError (one line) on bad data

    @abc.abstractmethod
    def build_model(self, given=None) -> nn.Module: ...  # the model to train

    @abc.abstractmethod
    def model_from_metadata(self, meta: dict, given=None) -> nn.Module: ...  # the model saved weights load into

    def loss(self, outputs, targets: torch.Tensor) -> torch.Tensor:
        """The training loss, a scalar: what the default step computes (required unless the task owns its step)."""
        raise NotImplementedError(f"task {self.name}: the default step needs loss")

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """Evaluation's per-sample statistics of a batch's outputs, a "loss" among them if goals name one (required
        unless the task evaluates a batch its own way: eval_batch)."""
        raise NotImplementedError(f"task {self.name}: the default evaluation needs per_sample")

    @abc.abstractmethod
    def metrics(self, sums: dict[str, torch.Tensor], count: int) -> dict[str, float]: ...  # "loss" if goals name it

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        """Targets to check a model and a loss on (the default step's start-up check; required unless the task owns
        its step, which is checked on its own training rows instead)."""
        raise NotImplementedError(f"task {self.name}: the default step's check needs example_targets")

    # --------------------------------------------------------------------------- defaults
    def train_step(self, ctx: RunContext, batch) -> torch.Tensor:
        """One training batch's loss, the scalar the loop weighs by ctx.weight (its rows' share of the step, 1 where
        the sizes divide) and hands to backward (which also divides it for gradient accumulation). The batch is what
        the task's rows collate to, untouched: by default (inputs, targets), and the forward pass, then the loss, a
        mean over the batch. A task whose batch or step is not that (pairs, a rollout's slot; generation, scoring,
        several forward passes) overrides it; the model must be called through ctx.forward (its wrappers
        synchronise the gradients)."""
        inputs, targets = batch
        return ctx.loss(ctx.forward(inputs, targets), targets)

    def loss_sum(self, outputs, targets: torch.Tensor) -> torch.Tensor:
        """step_shares tasks (required there): the training loss summed over the batch's counted items (target
        tokens, pairs); the loop divides it by the batch's share of its step. `loss` is it over their count."""
        raise NotImplementedError(f"task {self.name}: step_shares needs loss_sum")

    def step_counts(self, epoch: int) -> np.ndarray:
        """step_shares tasks: what each training row counts for in its step's mean (target tokens, pairs)."""
        return targets_of(self.data.train)

    def batch_counts(self, batch) -> tuple[int, int]:
        """(samples, tokens) this rank trained on in a batch, for the throughput figures; by default of the default
        step's (inputs, targets)."""
        _, targets = batch
        return len(targets), targets.numel()

    def train_figures(self, accelerator: Accelerator) -> dict[str, float | None]:
        """The task's own figures for a training log line (and summary.json's first and last), since the last line:
        every process calls this together, so it may reduce over them. None by default: no figures."""
        return {}

    def after_check(self) -> None:
        """A task that owns its step: the start-up check has just run that step once on its first training rows (after
        on_run_start, before step 1); forget what it left behind (figures, a rollout). Nothing by default."""

    def on_run_start(self, ctx: RunContext) -> None:
        """Once per launch, before the first step: the model is prepared and holds its starting weights (a
        resumed run's checkpoint is loaded after this), the run folder exists (locked). What a task prepares
        once: a cache of reference outputs, a frozen copy, a generator."""

    def state_dict(self) -> dict:
        """What the task keeps across a kill: JSON values, the same on every rank (a checkpoint's progress.json
        holds them), restored by load_state_dict before a resumed run's first step."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict returned (a resumed run)."""

    def rank_state(self) -> dict[str, torch.Tensor]:
        """Tensors this process keeps across a kill that differ between processes (grpo: a rollout in progress):
        each process's own file in the checkpoint, given back to load_rank_state on resume. None by default."""
        return {}

    def load_rank_state(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what rank_state returned ({} where the checkpoint holds none)."""

    def eval_batch(self, model: nn.Module, batch, forward: Callable) -> dict:
        """Per-sample statistics of one evaluation batch (as the task's rows collate it): by default of the forward
        pass over (inputs, targets) (a generating task also generates)."""
        inputs, targets = batch
        return self.per_sample(forward(model, inputs, targets), targets)

    def rates(self, samples: int, tokens: int, seconds: float) -> dict:
        """samples/s; for text also tokens/s, as samples/s x the training samples' mean number of real tokens
        (exact over whole epochs; the padding a batch adds is not counted)."""
        per_second = samples / seconds if seconds > 0 else None
        per_sample = self.data.tokens_per_sample
        if per_sample is None:
            return {"samples_per_s": per_second}
        return {"samples_per_s": per_second, "tokens_per_s": per_second and per_second * per_sample}

    def describe_data(self, model: nn.Module) -> dict:
        """The data's facts and the parameter counts, for summary.json."""
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        parameters = sum(p.numel() for p in model.parameters())
        return {**self.data.facts, "parameters": parameters, "trainable_parameters": trainable}

    def weights_metadata(self) -> dict[str, Any]:
        """What reloading and predict need, saved with the weights (Python values: weights_meta.py writes
        them as strings): the data's shape, classes, input columns."""
        data = self.data
        meta: dict[str, Any] = {"data_shape": data.shape, "num_classes": data.num_classes}
        if data.class_names:
            meta["class_names"] = data.class_names
        if data.input_columns:
            meta["input_columns"] = data.input_columns
        return {**meta, **data.metadata}

    # --------------------------------------------------------------------------- settling, before any data
    @classmethod
    def detect(cls, source) -> str | None:
        """Why this task fits data the options left open (the start-up line says it), or None. `source`
        is data.describe.Source: the options and a description of the data, read once."""
        return None

    @classmethod
    def reads(cls, source) -> bool:
        """Whether this registry line reads this data (a vision model's line reads images)."""
        return True

    @classmethod
    def check_settled(cls, cfg: TrainConfig, reason: str) -> None:
        """What the task rules out in the settled options (ConfigError, one line)."""

    @classmethod
    def settle(cls, cfg: TrainConfig) -> tuple[TrainConfig, tuple[str, ...]]:
        """Options left at their defaults, fitted to this task and model, and the notes that say so."""
        return cfg, ()

    @classmethod
    def fits(cls, cfg: TrainConfig) -> tuple[tuple[str, ...] | None, str]:
        """The registry's models that fit this task (None: any), and how to say the task in a refusal."""
        return None, f"--task {cls.name}"

    @classmethod
    def positions(cls, cfg: TrainConfig) -> str | None:
        """The option that sizes a model's positions, where a resumed run must keep it."""
        return None


# --------------------------------------------------------------------------- the optional capabilities


class Predicts(Protocol):
    def predict_inputs(self, dataset: str, meta: dict, folder: Path) -> tuple: ...  # (inputs, rows, source)
    def predict_batch(self, model: nn.Module, inputs, meta: dict) -> list[dict]: ...  # what predict prints


class Samples(Protocol):
    def sample(self, model: nn.Module, folder: Path, meta: dict, prompt: str, settings: dict) -> str: ...


class Exports(Protocol):
    def export(self, model: nn.Module, run_dir: Path) -> None: ...


def offered(task: Task | type[Task], capability: str) -> bool:
    return capability in task.offers


def refusal(task: Task | type[Task], capability: str, where: str) -> str:
    """The one line that refuses a capability the task does not declare."""
    hint = task.hints.get(capability)
    return f"{where}: --task {task.name} {WHAT[capability]}" + (f"; {hint}" if hint else "")


def predictor(task: Task, where: str) -> Predicts:
    if not offered(task, "predict"):
        raise ConfigError(refusal(task, "predict", where))
    return cast(Predicts, task)


def sampler(task: Task, where: str) -> Samples:
    if not offered(task, "sample"):
        raise ConfigError(refusal(task, "sample", where))
    return cast(Samples, task)


def exporter(task: Task) -> Exports | None:
    return cast(Exports, task) if offered(task, "export") else None


def check(cls: type, who: str) -> None:
    """A task class as the registry takes it: a Task, every required method defined, every capability it
    offers known and backed by its methods. ConfigError naming `who` (the --task) and the method."""
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError(f"{who}: {getattr(cls, '__name__', cls)} is not a task class (subclass anytrain.Task)")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if cls.train_step is Task.train_step:  # the default step computes the loss, checked on example targets
        missing += [m for m in ("example_targets", "loss") if getattr(cls, m) is getattr(Task, m)]
    if cls.eval_batch is Task.eval_batch and cls.per_sample is Task.per_sample:  # the default evaluation's
        missing.append("per_sample")
    if missing:
        raise ConfigError(f"{who}: {cls.__name__} does not define the required method {', '.join(missing)}")
    if not cls.name:
        raise ConfigError(f'{who}: {cls.__name__} has no name (the task it trains, e.g. name = "distill")')
    unknown = sorted(cls.offers - CAPABILITIES.keys())
    if unknown:
        raise ConfigError(f"{who}: {cls.__name__} offers {', '.join(unknown)} (known: {', '.join(CAPABILITIES)})")
    for capability in sorted(cls.offers):
        for method in CAPABILITIES[capability]:
            if not callable(getattr(cls, method, None)):
                raise ConfigError(f"{who}: {cls.__name__} offers {capability} but does not define {method}")
    if cls.step_shares and cls.loss_sum is Task.loss_sum:
        raise ConfigError(f"{who}: {cls.__name__} has step_shares but does not define loss_sum")
    if cls.headline not in cls.goals:  # "loss" may be left out: a task without an evaluation loss (grpo)
        raise ConfigError(f"{who}: {cls.__name__}.goals must name its headline '{cls.headline}'")
