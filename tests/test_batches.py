"""A batch type per task: the loop hands each batch to train_step as the task's rows collate it, untouched, and tells
the step where it stands in its optimizer step's accumulation cycle (ctx.micro of ctx.micro_batches: an epoch's last
cycle as short as it is). dpo's and reward's pairs are PairBatch (inputs and reference, moved to the device whole),
grpo's training slots and evaluation prompts their own types: none of them is a placeholder (inputs, targets)."""

from __future__ import annotations

from typing import ClassVar

import torch

import anytrain
from anytrain.tasks.causal_lm.pairs import PairBatch
from anytrain.tasks.classify import Classification


class Recording(Classification):
    """classify, recording what its step is handed (its batch's type, ctx.micro, ctx.micro_batches, ctx.step)."""

    name = "recording"
    seen: ClassVar[list[tuple]] = []

    def train_step(self, ctx, batch):
        Recording.seen.append((type(batch).__name__, ctx.micro, ctx.micro_batches, ctx.step))
        return super().train_step(ctx, batch)


def test_the_step_is_told_its_place_in_the_accumulation_cycle_the_last_one_short(tmp_path):
    Recording.seen.clear()
    split = {"val_fraction": 0.1, "test_fraction": 0.1, "progress": False, "plot": False}
    summary = anytrain.train(task=Recording, epochs=1, batch_size=200, grad_accum_steps=3, **split,
                             output_dir=str(tmp_path / "run"))  # fmt: skip
    rows = round(1797 * 0.8)  # the bundled digits' training rows
    batches = -(-rows // 200)
    check, *training = Recording.seen  # the start-up check runs the step once first, as micro-batch 0 of 1
    assert check[1:3] == (0, 1) and len(training) == batches == 8
    assert [micro for _, micro, _, _ in training] == [0, 1, 2, 0, 1, 2, 0, 1]
    assert [cycle for _, _, cycle, _ in training] == [3, 3, 3, 3, 3, 3, 2, 2]  # the epoch's last cycle: 2 batches
    assert [step for *_, step in training] == [0, 0, 0, 1, 1, 1, 2, 2] and summary["optimizer_steps"] == 3
    assert {kind for kind, *_ in training} == {"tuple"}  # classify's rows collate to (inputs, targets), as given


def test_a_pair_batch_is_typed_and_moves_to_the_device_whole():
    inputs = {"input_ids": torch.ones(4, 3, dtype=torch.long), "attention_mask": torch.ones(4, 3, dtype=torch.long)}
    batch = PairBatch(inputs, torch.full((2, 2), float("nan")))
    assert not isinstance(batch, tuple) and len(batch) == 2 and batch.counts() == (2, 12)
    from accelerate.utils import send_to_device

    moved = send_to_device(batch, torch.device("meta"))  # what the prepared loader and the start-up check call
    assert isinstance(moved, PairBatch) and moved.reference.device.type == "meta"
    assert all(t.device.type == "meta" for t in moved.inputs.values())
