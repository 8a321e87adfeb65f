"""Each training batch's share of its optimizer step, for a task whose loss is a sum over counted items (target
tokens, pairs: Task.step_shares). The loop divides a batch's summed loss by its share (RunContext.share):
accelerator.backward divides by the accumulation steps and DDP averages over processes, so the step's gradient
is that of the mean over every item of the step, whatever the number of ranks and accumulation steps."""

from __future__ import annotations

import math

import numpy as np
import torch
from accelerate import Accelerator


def step_shares(accelerator: Accelerator, loader, epoch: int, per_row: np.ndarray, accum: int) -> list[float]:
    """For each of this epoch's batches (by index), the global count of items in its optimizer step over
    (processes x accumulation steps). The counts come from the epoch's batch indices (the sampler is a function
    of seed and epoch) and `per_row` (items per training row), with one all-reduce per epoch: no batch is read
    ahead."""
    loader.set_epoch(epoch)
    per_batch = [int(per_row[list(indices)].sum()) for indices in loader.batch_sampler]
    loader.set_epoch(epoch)  # iterating the sampler moved it on
    steps = torch.zeros(math.ceil(len(per_batch) / accum), dtype=torch.float64)
    for k, count in enumerate(per_batch):
        steps[k // accum] += count
    if accelerator.num_processes > 1:
        steps = accelerator.reduce(steps.to(accelerator.device), "sum").cpu()
    return [steps[k // accum].item() / (accelerator.num_processes * accum) for k in range(len(per_batch))]
