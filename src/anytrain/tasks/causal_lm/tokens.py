"""`NextTokenLoss`: the loss and evaluation of the causal-LM tasks that train on the next token (hf:lm on text, sft on
answers): the mean cross-entropy over every target token of the optimizer step's global batch, whatever the number
of ranks or accumulation steps (the loop gives the model the batch's share of them as num_items_in_batch; the fused
output layer of head.py computes it), and, in evaluation, the mean over every target token of the split, its
perplexity and its tokens' accuracy. Padding and whatever is not learned is labelled -100."""

from __future__ import annotations

import math

import torch

from ...best import HIGHER, LOWER
from ...shape import IGNORE, DataShape
from ...usermodel import logits_of
from ..contract import Task
from ..transformers import token_sums, with_row_loss


class NextTokenLoss(Task):
    """The next-token loss, summed over the batch's targets and divided by its share of the step's (module
    docstring). A mixin beside causal_lm.task.CausalLM: it defines no model."""

    goals = {"loss": LOWER, "perplexity": LOWER, "accuracy": HIGHER}
    step_shares = True  # the model's own loss: its sum over the batch's share of the step's target tokens

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The next-token loss over the targets' mean (the model's own loss is this, given the labels)."""
        return self.loss_sum(outputs, targets) / (targets[:, 1:] != IGNORE).sum().clamp(min=1)

    def loss_sum(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The next-token loss summed over the targets: what the model's own loss is, given num_items_in_batch."""
        return token_sums(outputs[:, :-1].float(), targets[:, 1:])["token_loss"].sum()

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        sums = getattr(outputs, "row_stats", None)  # the fused loss's (head.py): no logits were made
        if sums is None:  # position t predicts token t + 1
            sums = token_sums(logits_of(outputs)[:, :-1].float(), targets[:, 1:])
        return with_row_loss(sums)

    def metrics(self, sums: dict, count: int) -> dict:
        tokens = max(sums["tokens"].item(), 1)
        loss = sums["token_loss"].item() / tokens
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "accuracy": sums["hits"].item() / tokens}

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return shape.example_inputs(batch)
