"""The training data of the tasks that sample their own completions (grpo, distill) as the loader's slots
(`PromptSlots`): the loader draws, in order, one slot per process and micro-step, and each names the prompts of its
rollout on its process (`per_rollout` of them, shuffled by seed and epoch), the rollout, and which of the rollout's
optimizer steps the micro-step is in. A rollout is answered at its first micro-step and trained over `steps`
optimizer steps of --grad-accum-steps micro-batches (which micro-batch of its step a micro-step is, the loop says:
ctx.micro). grpo: --batch-size prompts a rollout, --grpo-iterations steps; distill: --batch-size x
--grad-accum-steps prompts (TRL's generation batch), one step, each micro-batch training its --batch-size of them.
An epoch is every prompt once; its last rollout is filled from the epoch's first prompts, so every step has its full
batch. The prompts themselves are prompt_rows.py's.

Rollout r's prompts on process p are the order's [(r P + p) N, (r P + p + 1) N) (P processes, N per rollout): a
rollout reads the same prompts on 1 process x 2N as on 2 x N (and distill's with A micro-batches of B as with one
of A B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...config import TrainConfig
from ...data.splits import Rows
from .prompt_rows import PromptRows


@dataclass(frozen=True)
class Slot:
    """One micro-step of a rollout on one process: the rollout's prompts there (rows of the split), their epoch, the
    rollout (its count in the epoch) and which of its optimizer steps the micro-step is in (grpo: of its
    --grpo-iterations; 0 where a rollout trains one step)."""

    rows: list[int]
    epoch: int
    rollout: int
    iteration: int

    def to(self, *args, **kwargs) -> Slot:  # accelerate moves a batch to the device: nothing here to move
        return self


class PromptSlots(Rows):
    """The training prompts as the loader's slots (module docstring). Unshuffled by the loader: the order is the
    rollouts'; the prompts are shuffled here, a function of seed and epoch, the same on every process."""

    shuffled = False

    def __init__(self, prompts: PromptRows, cfg: TrainConfig, processes: int, per_rollout: int, steps: int):
        self.prompts, self.seed, self.processes = prompts, cfg.run.seed, processes
        self.batch, self.micro = cfg.optim.batch_size, cfg.optim.grad_accum_steps  # the loader's batch; per step
        self.per_rollout, self.span = per_rollout, steps * self.micro  # prompts per process, micro-steps a rollout
        self.rollouts = math.ceil(len(prompts) / (per_rollout * processes))  # per epoch
        self.epoch = 0
        self.order = np.arange(len(prompts))

    def __len__(self) -> int:
        return self.rollouts * self.span * self.processes * self.batch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.order = np.random.default_rng([self.seed, epoch]).permutation(len(self.prompts))

    def __getitems__(self, indices: list[int]) -> Slot:
        k = indices[0] // self.batch  # the loader's batch: process k % P at micro-step k // P
        micro_step, process = divmod(k, self.processes)
        rollout, within = divmod(micro_step, self.span)
        start = (rollout * self.processes + process) * self.per_rollout
        rows = [int(self.order[(start + q) % len(self.order)]) for q in range(self.per_rollout)]
        return Slot(rows, self.epoch, rollout, within // self.micro)

    def __getitem__(self, index: int) -> Slot:
        return self.__getitems__([index])

    @property
    def ids(self) -> list[list[int]]:
        return self.prompts.ids
