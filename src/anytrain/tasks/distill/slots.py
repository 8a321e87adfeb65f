"""distill's training data as step slots (`StepSlots`): the loader draws, in order, one slot per process and
micro-batch, and each names its optimizer step's prompts on its process (--batch-size x --grad-accum-steps of them,
shuffled by seed and epoch): the step answers them all at its first micro-batch (TRL's generation batch) and each
micro-batch trains on its --batch-size of them (which micro-batch it is, the loop says: ctx.micro). An epoch is
every prompt once; its last step is filled from the epoch's first prompts, so every step has its full batch. The
prompts themselves are the causal-LM base's (causal_lm/prompt_rows.py).

The step's prompts on process p are the order's [(s P + p) B A, (s P + p + 1) B A) (s the step, P processes, B the
batch, A the accumulation): a step reads the same prompts on 1 process x 2B as on 2 x B, and with A micro-batches of
B as with one of A B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...config import TrainConfig
from ...data.splits import Rows
from ..causal_lm.prompt_rows import PromptRows


@dataclass(frozen=True)
class StepSlot:
    """One micro-batch of an optimizer step on one process: the step's prompts there (rows of the split), their
    epoch and the step (its count in the epoch)."""

    rows: list[int]
    epoch: int
    step: int

    def to(self, *args, **kwargs) -> StepSlot:  # accelerate moves a batch to the device: nothing here to move
        return self


class StepSlots(Rows):
    """The training prompts as the loader's slots (module docstring). Unshuffled by the loader: the order is the
    steps'; the prompts are shuffled here, a function of seed and epoch, the same on every process."""

    shuffled = False

    def __init__(self, prompts: PromptRows, cfg: TrainConfig, processes: int):
        self.prompts, self.seed = prompts, cfg.run.seed
        self.batch, self.processes, self.micro = cfg.optim.batch_size, processes, cfg.optim.grad_accum_steps
        self.steps = math.ceil(len(prompts) / (self.batch * self.micro * processes))  # per epoch
        self.epoch = 0
        self.order = np.arange(len(prompts))

    def __len__(self) -> int:
        return self.steps * self.micro * self.processes * self.batch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.order = np.random.default_rng([self.seed, epoch]).permutation(len(self.prompts))

    def __getitems__(self, indices: list[int]) -> StepSlot:
        k = indices[0] // self.batch  # the loader's batch: process k % P at micro-batch k // P
        micro_batch, process = divmod(k, self.processes)
        step = micro_batch // self.micro
        size = self.batch * self.micro
        start = (step * self.processes + process) * size
        return StepSlot([int(self.order[(start + q) % len(self.order)]) for q in range(size)], self.epoch, step)

    def __getitem__(self, index: int) -> StepSlot:
        return self.__getitems__([index])
