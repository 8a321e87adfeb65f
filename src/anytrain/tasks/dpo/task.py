"""dpo: preference tuning of a transformers causal LM on pairs (causal_lm/pairs.py), standing on the causal-LM base
(causal_lm/task.py). Each batch of B pairs is one
forward pass over its 2B sequences (padded one a row, or with --packing in rows of --max-length, kept apart by their
position ids), which gives each sequence's log-probability of its answer (the causal-LM core's sequence_logps: the
chunked output layer, no full logits); the step is the task's own (`train_step`).
The loss (tasks/dpo/losses.py: --dpo-loss, --beta) is the mean over the pairs of the optimizer step, whatever the
number of ranks and accumulation steps. The reference (--reference, causal_lm/reference.py) is cached before step 0
(full fine-tuning), the model with its adapter off (--lora-r), or a frozen copy (live), the last two computed per
batch without gradients; simpo and orpo have none.

Validation and test: the loss, reward accuracy (chosen reward above the rejected one), reward margin and both
rewards, and each held-out prompt's chosen answer generated greedily (exact match), as sft does. The best weights
are those of the best validation reward accuracy. The model exports to run_dir/hf; `anytrain sample` answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from ...best import HIGHER, LOWER
from ...config import ConfigError, TrainConfig
from ...data.splits import Splits
from ...usermodel import logits_of
from ..causal_lm import cached
from ..causal_lm.answers import Answers
from ..causal_lm.logprobs import sequence_logps
from ..causal_lm.pairs import PairBatch
from ..causal_lm.reference import Reference, check_reference_option
from ..causal_lm.task import CausalLM
from ..contract import RunContext
from .losses import LOSSES, Pairs
from .options import REFERENCE_FREE, DPOOptions

STATS = ("reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward")


class DirectPreference(CausalLM):
    name = "dpo"
    goals = {
        "loss": LOWER,
        "reward_accuracy": HIGHER,
        "reward_margin": HIGHER,
        "chosen_reward": HIGHER,
        "rejected_reward": LOWER,
        "exact_match": HIGHER,
    }
    headline = "reward_accuracy"
    offers = frozenset({"export", "sample", "packing", "lora"})
    options = DPOOptions
    targets_to_model = False  # the targets are the cached reference log-probabilities; labels go in the inputs

    @classmethod
    def detect(cls, source) -> str | None:
        from ..causal_lm.pairs import pair_format

        if not source.readable:
            return None
        form = pair_format(source.train.column_names)
        return None if form is None else f"auto: chosen and rejected columns ({form} prompt)"

    @classmethod
    def check_settled(cls, cfg: TrainConfig, reason: str) -> None:
        o = cfg.section(cls.name)
        if o.dpo_loss in REFERENCE_FREE and o.reference != "auto":
            raise ConfigError(
                f"--reference {o.reference}: --dpo-loss {o.dpo_loss} has no reference model (leave --reference auto)"
            )
        check_reference_option(o.reference, cfg.model.lora_r)

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        o = cfg.section(self.name)
        self.o, self.formula = o, LOSSES[o.dpo_loss]
        free = o.dpo_loss in REFERENCE_FREE
        self.reference = Reference("none") if free else Reference.of_option(o.reference, cfg.model.lora_r)
        self.stops: list[int] = []  # where a generated answer stops (load_data)
        self.answers: Answers | None = None  # generated answers: exact match, the log's examples (load_data)
        self.autocast: Callable = contextlib.nullcontext  # the run's precision for the reference (on_run_start)

    def load_data(self, given=None) -> Splits:
        from ..causal_lm.pairs import pair_splits

        self.read_model()
        self.data, form = pair_splits(self.cfg, self.tokenizer, given, self.run.pad_multiple)
        self.stops = self.stops_for("chats" in form)
        self.answers = Answers(self.tokenizer, self.stops, self.run.main)
        return self.data

    def on_run_start(self, ctx: RunContext) -> None:
        """--reference cached: every split's reference log-probabilities, by the model as it starts, given to the
        splits' rows (their batches carry them as targets): read back from the run folder when the key matches (a
        resumed run), else computed now and saved there. --reference live: a frozen copy of the starting model."""
        self.autocast = ctx.accelerator.autocast
        self.reference.start(ctx)
        if self.reference.how == "cached":
            cached.start(ctx, self.data, self.cfg.optim.batch_size, self.cfg.data.max_length, self.cfg.run.resume)

    # --------------------------------------------------------------------------- the step
    def train_step(self, ctx: RunContext, batch: PairBatch) -> torch.Tensor:
        """The batch's pairs through the model (ctx.forward: its wrappers synchronise the gradients), the reference
        beside them, then the loss: the sum over the pairs over the batch's share of the step's pairs."""
        return ctx.loss(self.table(ctx.forward, batch.inputs, ctx.model), batch.reference)

    def table(self, call: Callable, inputs: dict, model: nn.Module) -> torch.Tensor:
        """(2B, 3), one row a sequence (the chosen, then the rejected): its answer's log-probability, the answer's
        tokens, and the reference's log-probability where it is computed per batch (NaN: cached or none)."""
        table = sequence_logps(call, inputs)
        ref = torch.full_like(table[:, :1], float("nan"))
        if self.reference.per_batch:  # the frozen copy (live), or the model with its adapter off
            with torch.no_grad(), self.autocast(), self.reference.calling(model) as reference:
                ref = sequence_logps(reference, inputs)[:, :1]
        return torch.cat([table, ref], 1)

    # --------------------------------------------------------------------------- the loss
    def pairs(self, outputs, targets: torch.Tensor) -> Pairs:
        """The batch's per-pair log-probabilities from the model's table (one row a sequence: the chosen, then
        the rejected) and the cached reference (targets)."""
        table = outputs
        b = len(targets)
        chosen, rejected = table[:b], table[b : 2 * b]
        if self.reference.how == "cached":
            ref_c, ref_r = targets[:, 0], targets[:, 1]
        elif self.reference.how == "none":
            ref_c = ref_r = torch.zeros_like(targets[:, 0])
        else:
            ref_c, ref_r = chosen[:, 2], rejected[:, 2]
        return Pairs(chosen[:, 0], rejected[:, 0], ref_c, ref_r, chosen[:, 1], rejected[:, 1])

    def loss_sum(self, outputs, targets: torch.Tensor) -> torch.Tensor:
        losses, _, _ = self.formula(self.pairs(outputs, targets), self.o.beta, self.o.simpo_gamma)
        return losses.sum()

    def loss(self, outputs, targets: torch.Tensor) -> torch.Tensor:
        return self.loss_sum(outputs, targets) / len(targets)

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        losses, chosen, rejected = self.formula(
            self.pairs(logits_of(outputs), targets), self.o.beta, self.o.simpo_gamma
        )
        return {
            "loss": losses.detach(),
            "reward_accuracy": (chosen > rejected).double(),
            "reward_margin": chosen - rejected,
            "chosen_reward": chosen,
            "rejected_reward": rejected,
        }

    def eval_batch(self, model: nn.Module, batch: PairBatch, forward: Callable) -> dict:
        """The pairs' statistics, then each pair's chosen answer generated from its prompt: exact match."""
        inputs = batch.inputs
        with self.autocast():
            table = self.table(lambda given: forward(model, given, None), inputs, model)
        stats = self.per_sample(table, batch.reference)
        b = len(batch)  # the chosen sequences: their answers are what a prompt should get
        chosen = (inputs["input_ids"][:b], inputs["labels"][:b], inputs["attention_mask"][:b])
        stats["exact_match"] = cast(Answers, self.answers).exact_match(model, *chosen)
        return stats

    def batch_counts(self, batch: PairBatch) -> tuple[int, int]:
        return batch.counts()

    def metrics(self, sums: dict, count: int) -> dict:
        cast(Answers, self.answers).say_shown()
        return {k: v.item() / count for k, v in sums.items()}

    def describe_data(self, model: nn.Module) -> dict:
        return {**super().describe_data(model), "reference": self.reference.how, "dpo_loss": self.o.dpo_loss}

    def weights_metadata(self) -> dict:
        return {**super().weights_metadata(), "dpo_loss": self.o.dpo_loss, "beta": self.o.beta}
