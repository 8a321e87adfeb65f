"""`SampledCausalLM`, the base of the causal-LM tasks that train on completions they sample themselves (grpo,
distill): what both do the same way around their own step. Their prompts are read by the rollout engine (rollout.py:
tools, an environment) into the loader's slots (slots.py); a rollout's prompts are sampled at its first micro-step
(the task's `roll_out`, through `complete`: keyed by the row, the split and the epoch), held while its micro-steps
train on it, each micro-batch its share of the completions (`held`); the time, length and tool figures (figures.py)
and the completions table (completions.py) are kept alike and forgotten after the start-up check, which counts for
nothing.

A task standing on it names its figures and table (`figures_type`, `table_type`), reads its prompts with
`read_prompts` in load_data, says its start-up line (`described`), samples a rollout (`roll_out`, with `step_share`
the step's share per micro-batch), trains on it (train_step) and evaluates (eval_batch, sampling with `keys`)."""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import torch

from ...config import TrainConfig
from ...data.splits import Splits
from ...shape import DataShape
from ..contract import RunContext
from .completions import RolloutTable
from .figures import RolloutFigures
from .generation import Completions, completion_keys
from .logprobs import shares_prompts
from .rollout import Rollouts
from .slots import PromptSlots, Slot
from .task import CausalLM
from .turns import Conversation, counts

SPLIT_KEYS = {"train": 0, "validation": 1, "test": 2}  # each split's completions keyed apart


class Sampled(Protocol):
    """A process's rollout as its task holds it: the completions, and what the task keeps beside them."""

    rows: Completions


R = TypeVar("R", bound=Sampled)


class SampledCausalLM(CausalLM, Generic[R]):
    """A causal-LM task training on its own completions, its rollout an R (module docstring)."""

    offers = frozenset({"export", "sample", "lora"})
    targets_to_model = False  # the completions are sampled, not given as labels
    step_shares = False  # its step divides by its own rollout's count, known once it is sampled (step_share)
    figures_type: type[RolloutFigures]  # the task's figures: the base's time, length and tool figures, and its own
    table_type: Callable[[], RolloutTable]  # the task's completions table

    @classmethod
    def check_settled(cls, cfg: TrainConfig, reason: str) -> None:
        cls.loaded_engine(cfg)

    @classmethod
    def loaded_engine(cls, cfg: TrainConfig) -> Rollouts:
        """A rollout engine with each tool, function and environment found and checked: before any data is read."""
        engine = Rollouts(cfg, cfg.section(cls.name))
        engine.load()
        return engine

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.o = cfg.section(self.name)
        self.engine = Rollouts(cfg, self.o)  # the prompts, tools, environment; generate (causal_lm/rollout.py)
        self.figures = self.figures_type()
        self.table = self.table_type()  # run_dir/completions.jsonl (causal_lm/completions.py)
        self.rollout: R | None = None  # the rollout the micro-steps train on (held)
        self.last_counts = (0, 0)  # the last micro-batch's completions and completion tokens
        self.steps_per_epoch = 1  # optimizer steps per epoch (read_prompts)

    # --------------------------------------------------------------------------- data
    def model_positions(self, *configs) -> int:
        """The positions a prompt and its completion may fill: the fewest of the models' (transformers configs),
        --max-length plus --max-new-tokens for a model that names none."""
        from ... import hf

        default = self.cfg.data.max_length + self.o.max_new_tokens
        return min(hf.max_positions(c) or default for c in configs)

    def read_prompts(self, given, positions: int, per_rollout: int, steps: int, per_epoch: str, **facts) -> Splits:
        """Every split's prompts for a model of `positions` positions (the rollout engine's), the training split as
        the loader's slots: `per_rollout` prompts per process a rollout, trained over `steps` optimizer steps
        (slots.py). The data's facts: the prompts', the rollouts per epoch (named `per_epoch`), then `facts`."""
        source, chats = self.engine.read(self.tokenizer, positions, given, self.stops_for)
        rows = self.engine.prompts  # {split: PromptRows}: the prompts and their columns
        train = PromptSlots(rows["train"], self.cfg, self.run.processes, per_rollout, steps)
        self.steps_per_epoch = train.rollouts * steps
        shape = DataShape(
            "tokens", vocab_size=len(self.tokenizer), max_length=positions, pad_id=self.tokenizer.pad_token_id
        )
        said = {"tokenizer": f"{type(self.tokenizer).__name__} (the model's own)", "train_prompts": len(rows["train"]),
                "prompt_format": "chats" if chats else "text", per_epoch: train.rollouts, **facts}  # fmt: skip
        self.data = Splits.of({**rows, "train": train}, shape, source, input_columns=["prompt"], facts=said,
                              tokenizer=self.tokenizer)  # fmt: skip
        return self.data

    # --------------------------------------------------------------------------- the run's start
    def after_check(self) -> None:
        """The start-up check sampled a rollout and trained a step on it: none of it counts (the rollout, the
        figures, the completions table's rows)."""
        self.rollout, self.last_counts = None, (0, 0)
        self.figures = self.figures_type()  # a new window, its clock started now
        self.table.forget()

    def on_run_start(self, ctx: RunContext) -> None:
        """The start-up line (the task's `described`, then how a prompt is read) and the tools' limit; the figures'
        clock and the completions table started."""
        ctx.accelerator.print(f"anytrain: {self.name}: {self.described()}; prompts: {self.sharing(ctx)}")
        if limits := self.engine.limits():
            ctx.accelerator.print(limits)
        self.figures.start()
        self.table.start(ctx.run_dir, ctx.accelerator.is_main_process)

    @abstractmethod
    def described(self) -> str:
        """What the start-up line says of the task's batch and loss."""

    def sharing(self, ctx: RunContext) -> str:
        """--share-prompts: whether generate and the model's pass on the completions (grpo's log-probabilities,
        distill's student) may read a repeated prompt once, checked on the model (causal_lm/logprobs.py); what the
        start-up line says of it."""
        if not self.o.share_prompts:
            return "each row whole (--no-share-prompts)"
        self.engine.shared, why = shares_prompts(ctx.forward, ctx.model)
        return why if self.engine.shared is not None else f"each row whole, as {why}"

    # --------------------------------------------------------------------------- the rollout
    def held(self, ctx: RunContext, slot: Slot) -> tuple[R, torch.Tensor]:
        """The slot's rollout, sampled at its first micro-step (roll_out, its time the figures' `generating`), and
        the rows of it this micro-batch trains (ctx.micro of ctx.micro_batches: the completions split as evenly as
        they go)."""
        if self.rollout is None or (slot.iteration == 0 and ctx.micro == 0):
            started = time.perf_counter()
            self.rollout = self.roll_out(ctx, slot)
            self.figures.generating += time.perf_counter() - started
        rollout = self.rollout
        return rollout, torch.tensor_split(torch.arange(len(rollout.rows.ids)), ctx.micro_batches)[ctx.micro]

    @abstractmethod
    def roll_out(self, ctx: RunContext, slot: Slot) -> R:
        """This process's rollout of the slot's prompts, sampled through `complete`."""

    def complete(self, ctx: RunContext, slot: Slot, per_row: int) -> tuple[Completions, list[Conversation] | None]:
        """The slot's prompts on this process completed `per_row` times each (keyed by the row and the epoch), in the
        run's precision: in the figures' time_generate, less the tools' waits (time_tools); their lengths and, with
        tools, what they did with them. With tools or an environment, the conversations too (causal_lm/turns.py)."""
        accelerator = ctx.accelerator
        model = accelerator.unwrap_model(ctx.model)
        keys = self.keys("train", slot.epoch, slot.rows, per_row)
        with accelerator.autocast(), self.figures.timed("generate"):
            done, talks = self.engine.complete(model, "train", slot.rows, per_row, keys)
        self.figures.add_lengths(accelerator, done)
        if talks is not None:
            waited = sum(talk.waited for talk in talks)  # the tools' share of it
            self.figures.phases["generate"] -= waited
            self.figures.phases["tools"] += waited
            self.figures.add_tools(accelerator, counts(talks), len(talks))
        return done, talks

    def keys(self, split: str, epoch: int, rows: list[int], per_row: int) -> torch.Tensor:
        """The sampling keys of the rows' completions, `per_row` each: of the seed, the split, the epoch and the row
        (causal_lm/sampler.py)."""
        return completion_keys(self.cfg.run.seed, SPLIT_KEYS[split], epoch, torch.tensor(rows), per_row)

    def step_share(self, accelerator, count: torch.Tensor) -> float:
        """The step's share per micro-batch: `count` (this process's of what the step's loss divides by) summed over
        every process, over processes x accumulation steps (1 where nothing counts)."""
        total = accelerator.reduce(count, "sum")
        return total.item() / (accelerator.num_processes * self.cfg.optim.grad_accum_steps) or 1.0

    # --------------------------------------------------------------------------- the counts
    def batch_counts(self, batch) -> tuple[int, int]:
        """The completions and completion tokens this micro-batch trained on."""
        return self.last_counts

    def rates(self, samples: int, tokens: int, seconds: float) -> dict:
        if seconds <= 0:
            return {"samples_per_s": None, "tokens_per_s": None}
        return {"samples_per_s": samples / seconds, "tokens_per_s": tokens / seconds}

    def train_figures(self, accelerator) -> dict:
        """The figures since the last line; the completions table's rows written, handed to the trackers that take
        tables, two of them printed (main process)."""
        from tqdm.auto import tqdm

        figures = self.figures.take(accelerator)
        shown = self.table.flush(accelerator.trackers)
        if shown:
            tqdm.write("\n".join(shown))
        return figures
