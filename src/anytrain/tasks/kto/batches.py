"""kto's rows and batches: each row two token sequences, its completion's (the prompt then the completion) and its KL
pair's (the prompt then its partner's completion, tasks/kto/rows.py), held as causal_lm/pairs.py's PairRows holds a
pair's two; a batch (`KTOBatch`) the completions of its rows, their labels and cached reference log-probabilities,
and on the training split the rows of its rank's whole optimizer step (`Layout`), whose KL pairs the step's first
micro-batch reads."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from ..causal_lm.pairs import PairRows

ORDER_KEY = 3  # the training rows' epoch order: default_rng([seed, ORDER_KEY, epoch]) (the splits' partners: 0 to 2)


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order in which epoch `epoch` reads the n training rows."""
    return np.random.default_rng([seed, ORDER_KEY, epoch]).permutation(n)


@dataclass(frozen=True)
class Layout:
    """Where the training loader's batches fall: `rows` rows in global batches of `batch` (shares.Rounds: the last one
    short, then one-row fillers of the epoch's first position), global batch p on rank p % processes, and `accum` of a
    rank's batches to an optimizer step. `seed` draws each epoch's order; `shuffled` False (--kl-pairs trl): every
    epoch reads the rows in order, as TRL's sequential sampler does."""

    rows: int
    batch: int
    processes: int
    accum: int
    seed: int
    shuffled: bool = True

    @property
    def real(self) -> int:
        return math.ceil(self.rows / self.batch)

    def filler(self, positions: list[int]) -> bool:
        """A filler: the first position alone where a real batch holds more."""
        return positions == [0] and min(self.batch, self.rows) > 1

    def step(self, positions: list[int]) -> list[list[int]]:
        """The positions of this rank's real batches in the optimizer step of the batch at `positions`, one list a
        micro-batch; none for a filler."""
        if self.filler(positions):
            return []
        p, span = positions[0] // self.batch, self.processes * self.accum
        first = p // span * span + p % self.processes  # this rank's first batch of the step
        return [
            list(range(q * self.batch, min((q + 1) * self.batch, self.rows)))
            for q in range(first, first + span, self.processes)
            if q < self.real
        ]

    def most(self, positions: list[int]) -> int:
        """The most real batches any rank holds in this batch's step (a filler's: the epoch's last step), so that
        every rank runs as many KL passes (a sharded model gathers its weights in each)."""
        span, rounds = self.processes * self.accum, math.ceil(self.real / self.processes) * self.processes
        s = (rounds - 1) // span if self.filler(positions) else positions[0] // self.batch // span
        return max(sum(q < self.real for q in range(s * span + r, (s + 1) * span, self.processes))
                   for r in range(self.processes))  # fmt: skip


@dataclass(frozen=True)
class KTOBatch:
    """B rows: the model's inputs for their completions, each row's label (desirable), its cached reference
    log-probabilities (B, 2: the completion's, its KL pair's; NaN where they are not cached), its row in the split,
    and on the training split this rank's rows of the whole optimizer step (one list a micro-batch) and the most
    micro-batches any rank has in it (`passes`: as many KL passes on every rank)."""

    inputs: dict
    desirable: torch.Tensor
    reference: torch.Tensor
    rows: torch.Tensor
    step: tuple[tuple[int, ...], ...]
    split: str
    passes: int = 0

    def __len__(self) -> int:
        return len(self.desirable)

    def to(self, device, non_blocking: bool = False) -> KTOBatch:
        """On `device` (accelerate's send_to_device calls this, as the prepared loader and the start-up check do)."""
        from accelerate.utils import send_to_device

        inputs = send_to_device(self.inputs, device, non_blocking=non_blocking)
        desirable = self.desirable.to(device, non_blocking=non_blocking)
        reference = self.reference.to(device, non_blocking=non_blocking)
        return KTOBatch(inputs, desirable, reference, self.rows, self.step, self.split, self.passes)

    def counts(self) -> tuple[int, int]:
        """(rows, tokens of their sequences, padding included): what the batch counts for in the throughput."""
        return len(self), self.inputs["input_ids"].numel()


class KTORows(PairRows):
    """A split's rows (module docstring): stored sequence 2i is row i's completion, 2i + 1 its KL pair. The training
    split orders itself each epoch (set_epoch) and knows its step layout; the others are read in order."""

    shuffled = False  # the training rows' order is their own (set_epoch), a function of seed and epoch

    def __init__(self, ids, answers, labels, pad_id: int, multiple, packed: int, split: str, layout: Layout | None):
        super().__init__(ids, answers, pad_id, multiple, packed)
        self.labels = torch.tensor(labels, dtype=torch.bool)
        self.split, self.layout = split, layout
        self.with_kl = True  # whether the KL pairs are scored (cached): not with --kto-loss apo_zero_unpaired
        self.order = None if layout is None else self.epoch_order(0)

    @classmethod
    def of(cls, prompts, completions, labels, partner: np.ndarray, max_length: int, pad_id: int, multiple,
           packed: int, split: str, layout: Layout | None) -> KTORows:  # fmt: skip
        """Each row's completion sequence and KL pair sequence (prompt, then its partner's completion), cut at
        max_length, with the flags of their completion tokens."""
        ids, answers = [], []
        for i, prompt in enumerate(prompts):
            for completion in (completions[i], completions[int(partner[i])]):
                ids.append((prompt + completion)[:max_length])
                answers.append(([False] * len(prompt) + [True] * len(completion))[:max_length])
        return cls(ids, answers, labels, pad_id, multiple, packed, split, layout)

    def epoch_order(self, epoch: int) -> np.ndarray:
        layout = cast(Layout, self.layout)
        return epoch_order(layout.rows, layout.seed, epoch) if layout.shuffled else np.arange(layout.rows)

    def set_epoch(self, epoch: int) -> None:
        if self.layout is not None:
            self.order = self.epoch_order(epoch)

    def rows_at(self, positions: list[int]) -> list[int]:
        """The rows the loader's positions name: the epoch's order on the training split, the rows themselves else."""
        return positions if self.order is None else [int(self.order[k]) for k in positions]

    def sequences(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The rows' completion sequences, then (with_kl) their KL pairs': what the cached reference scores."""
        kl = [2 * i + 1 for i in indices] if self.with_kl else []
        return [self.sequence(k) for k in [2 * i for i in indices] + kl]

    def inputs(self, seqs: list) -> dict:
        return self.packed_batch(seqs) if self.packed else self.padded_batch(seqs)

    def kl_inputs(self, rows: list[int]) -> dict:
        """The model's inputs for the rows' KL pairs."""
        return self.inputs([self.sequence(2 * i + 1) for i in rows])

    def __getitems__(self, positions: list[int]) -> KTOBatch:
        rows = self.rows_at(positions)
        reference = torch.full((len(rows), 2), float("nan"))
        if self.reference is not None:
            cached = self.reference[torch.as_tensor(rows)]
            reference[:, : cached.shape[1]] = cached
        step: tuple[tuple[int, ...], ...] = ()
        passes = 0
        if self.layout is not None:
            step = tuple(tuple(self.rows_at(p)) for p in self.layout.step(positions))
            passes = self.layout.most(positions)
        inputs = self.inputs([self.sequence(2 * i) for i in rows])
        return KTOBatch(inputs, self.labels[rows], reference, torch.tensor(rows), step, self.split, passes)
