"""Each training batch's weight in its optimizer step: the step's gradient is that of the mean over exactly the
step's rows (for a task with Task.step_shares: over its counted items, target tokens or pairs), on any number of
processes and accumulation steps, whatever the number of training rows.

accelerate hands an epoch's global batch p to process p % P (its BatchSamplerShard). `Rounds` is that global list:
the epoch's batches, the last one short, then one-row fillers up to a multiple of P. The shard yields it as it
falls (`split_as_it_falls`: even_batches off), so no row is repeated, and every process runs as many batches: DDP
needs each in every all-reduce. A filler is a real row (the epoch's first) that weighs 0.

A batch's weight is its count over its share of the step's count, count x P x A / step count: accelerator.backward
divides every batch by A (--grad-accum-steps, also in an epoch's last, short step) and DDP averages over P. Where
every batch of a step counts the same (sizes that divide) it is exactly 1.0 and the loop leaves the loss as it is.
A step_shares task divides its summed loss by the share itself (RunContext.share): its weight is 1, a filler's 0.
Every process computes every process's batches from the sampler (a function of seed and epoch): no collective."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import BatchSampler, Sampler


class Rounds(BatchSampler):
    """An epoch's global batches (batch_size rows, the last one short), then one-row fillers up to a multiple of
    `processes` (set by split_as_it_falls once accelerate has sharded the loader)."""

    def __init__(self, sampler: Sampler, batch_size: int):
        super().__init__(sampler, batch_size, drop_last=False)
        self.processes = 1

    def real(self) -> int:
        """The epoch's batches of rows, before the fillers."""
        return super().__len__()

    def __len__(self) -> int:
        return math.ceil(self.real() / self.processes) * self.processes

    def __iter__(self):
        first, made = None, 0
        for batch in super().__iter__():
            first = batch[0] if first is None else first
            made += 1
            yield batch
        for _ in range(len(self) - made):
            yield [first]


def split_as_it_falls(loader) -> None:
    """The prepared training loader yields the last round of Rounds as it falls: accelerate's even_batches (on for
    evaluation, where gather_for_metrics drops what it repeats) would fill a short batch up with the epoch's first
    rows and train on them twice."""
    shard, rounds = shard_and_rounds(loader)
    if shard is not None and rounds is not None:
        shard.even_batches = False
        rounds.processes = shard.num_processes


def shard_and_rounds(loader) -> tuple[Any, Rounds | None]:
    """accelerate's shard of the loader (None on one process) and the global Rounds inside it (None for a stream)."""
    from accelerate.data_loader import BatchSamplerShard  # here: data loading imports this module, not accelerate

    sampler = getattr(loader, "batch_sampler", None)
    shard = sampler if isinstance(sampler, BatchSamplerShard) else None
    inner = shard.batch_sampler if shard is not None else sampler
    return shard, inner if isinstance(inner, Rounds) else None


@dataclass(frozen=True)
class Weight:
    """A batch's `share` of its step's count over (processes x accumulation steps), for a step_shares task (else
    None), and the `weight` the loop multiplies its loss by."""

    share: float | None
    weight: float


def epoch_weights(loader, epoch: int, per_row: np.ndarray | None, accum: int) -> list[Weight] | None:
    """This process's weight of each of the epoch's batches (by index); `per_row`: a step_shares task's count of each
    training row (None: each row counts 1, the loss is a mean). None for a stream: its batches are not known ahead."""
    shard, rounds = shard_and_rounds(loader)
    if rounds is None:
        return None
    processes, process = (shard.num_processes, shard.process_index) if shard is not None else (1, 0)
    loader.set_epoch(epoch)
    real = rounds.real()
    counts = [
        (len(rows) if per_row is None else int(per_row[rows].sum())) if p < real else 0 for p, rows in enumerate(rounds)
    ]
    loader.set_epoch(epoch)  # iterating the sampler moved it on
    steps: dict[int, int] = {}
    for p, count in enumerate(counts):  # global batch p is batch p // P of process p % P
        steps[p // processes // accum] = steps.get(p // processes // accum, 0) + count
    weights = []
    for k, p in enumerate(range(process, len(counts), processes)):
        total, count = steps[k // accum], counts[p]
        if per_row is not None:
            weights.append(Weight(total / (processes * accum), float(p < real)))
        else:  # count / (total / (P x A)), exactly 1.0 where the counts divide
            weights.append(Weight(None, count * processes * accum / total))
    return weights
