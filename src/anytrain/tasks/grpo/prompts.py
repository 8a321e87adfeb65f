"""grpo's training data as rollout slots (`RolloutSlots`): the loader draws, in order, one batch of slots per process
and micro-step, and each names the prompts of its rollout (--batch-size prompts per process, shuffled by seed and
epoch) and which of the --grpo-iterations it is (which micro-batch of the optimizer step, the loop says:
ctx.micro). An epoch is every prompt once; the last rollout is filled from the epoch's first prompts, so every step
has its full batch. The prompts themselves are the causal-LM base's (causal_lm/prompt_rows.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...config import TrainConfig
from ...data.splits import Rows
from ..causal_lm.prompt_rows import PromptRows


@dataclass(frozen=True)
class Slot:
    """One micro-step of a rollout on one process: the prompts (rows of the split), their epoch, the rollout and which
    of the --grpo-iterations (which micro-batch of its optimizer step it is, the loop says: ctx.micro)."""

    rows: list[int]
    epoch: int
    rollout: int
    iteration: int

    def to(self, *args, **kwargs) -> Slot:  # accelerate moves a batch to the device: nothing here to move
        return self


class RolloutSlots(Rows):
    """The training prompts as the loader's slots (module docstring). Unshuffled by the loader: the order is the
    rollouts'; the prompts are shuffled here, a function of seed and epoch, the same on every process."""

    shuffled = False

    def __init__(self, prompts: PromptRows, cfg: TrainConfig, processes: int):
        o = cfg.section("grpo")
        self.prompts, self.seed = prompts, cfg.run.seed
        self.batch, self.processes = cfg.optim.batch_size, processes
        self.micro, self.iterations = cfg.optim.grad_accum_steps, o.grpo_iterations
        self.rollouts = math.ceil(len(prompts) / (self.batch * processes))  # per epoch
        self.epoch = 0
        self.order = np.arange(len(prompts))

    def __len__(self) -> int:
        return self.rollouts * self.iterations * self.micro * self.processes * self.batch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.order = np.random.default_rng([self.seed, epoch]).permutation(len(self.prompts))

    def __getitems__(self, indices: list[int]):
        k = indices[0] // self.batch  # the loader's batch: process k % P at micro-step k // P
        step, process = divmod(k, self.processes)
        rollout, within = divmod(step, self.iterations * self.micro)
        iteration = within // self.micro
        start = (rollout * self.processes + process) * self.batch
        rows = [int(self.order[(start + q) % len(self.order)]) for q in range(self.batch)]
        return Slot(rows, self.epoch, rollout, iteration)

    def __getitem__(self, index: int):
        return self.__getitems__([index])

    @property
    def ids(self) -> list[list[int]]:
        return self.prompts.ids
