"""kto: Kahneman-Tversky Optimization of a transformers causal LM on unpaired preferences (a prompt, a completion and
whether it is desirable; pairs are unpaired: tasks/kto/rows.py), TRL 1.16 KTOTrainer's semantics, standing on the
causal-LM base (causal_lm/task.py). Each batch is one forward pass over its rows' completions (padded one a row, or
with --packing in rows of --max-length), which gives each completion's summed log-probability (the causal-LM core's
sequence_logps: the chunked output layer, no full logits); the step is the task's own (`train_step`).

The loss (tasks/kto/losses.py: --kto-loss, --beta, --desirable-weight, --undesirable-weight) is the mean of the
weighted row losses over the optimizer step's rows, whatever the number of ranks and accumulation steps. Its KL
estimate z (--kto-loss kto) is the mean, over the step's rows, of the model's log-ratio to the reference of each
row's KL pair (its prompt with another row's completion, fixed by the data: tasks/kto/rows.py), clamped at 0 and
detached: the step's first micro-batch scores its rank's KL pairs of the whole step without gradients (TRL scores a
micro-batch's, the same cost), and the ranks' sums are added (TRL: each rank's mean, gathered and averaged). So one
rank, two ranks and accumulated micro-batches take the same step. In evaluation z is the whole split's.

The reference (--reference, causal_lm/reference.py) is cached before step 0 (full fine-tuning: the completions' and
the KL pairs' log-probabilities, causal_lm/cached.py), the model with its adapter off (--lora-r), or a frozen copy
(live), the last two computed per batch without gradients.

Validation and test: the loss, the rewards and log-probabilities of each class and their margin, the KL estimate,
and each desirable row's completion generated greedily from its prompt (exact match). The best weights are those of
the lowest validation loss (TRL's default). The model exports to run_dir/hf; `anytrain sample` answers.
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
from ..causal_lm.logprobs import bare, sequence_logps
from ..causal_lm.reference import Reference, check_reference_option
from ..causal_lm.task import CausalLM
from ..contract import RunContext
from .batches import KTOBatch, KTORows
from .figures import Figures
from .losses import weighted
from .options import WITH_KL, KTOOptions


class KahnemanTversky(CausalLM):
    name = "kto"
    goals = {
        "loss": LOWER,
        "reward_margin": HIGHER,
        "chosen_reward": HIGHER,
        "rejected_reward": LOWER,
        "chosen_logps": HIGHER,
        "rejected_logps": LOWER,
        "kl": LOWER,
        "exact_match": HIGHER,
    }
    headline = "loss"
    offers = frozenset({"export", "sample", "packing", "lora"})
    options = KTOOptions
    targets_to_model = False  # the targets are the reference log-probabilities, the labels and z
    step_shares = True  # the loss is the mean over the optimizer step's rows

    @classmethod
    def detect(cls, source) -> str | None:
        from .rows import data_format

        if not source.readable or data_format(source.train.column_names) != "unpaired":
            return None
        return "auto: prompt, completion and label columns (unpaired preferences)"

    @classmethod
    def check_settled(cls, cfg: TrainConfig, reason: str) -> None:
        o = cfg.section(cls.name)
        if o.kto_loss in WITH_KL and cfg.optim.batch_size < 2:
            raise ConfigError(
                f"--batch-size {cfg.optim.batch_size}: --kto-loss {o.kto_loss} estimates its KL term from a batch's "
                "mismatched prompts and completions and needs a batch of 2 rows or more, as TRL's KTOTrainer does "
                "(or --kto-loss apo_zero_unpaired, which has no KL term)"
            )
        check_reference_option(o.reference, cfg.model.lora_r)

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        o = cfg.section(self.name)
        self.o, self.with_kl = o, o.kto_loss in WITH_KL
        self.weights = (o.desirable_weight, o.undesirable_weight)
        self.reference = Reference.of_option(o.reference, cfg.model.lora_r)  # live: a frozen copy made at the start
        self.stops: list[int] = []  # where a generated answer stops (load_data)
        self.answers: Answers | None = None  # generated answers: exact match, the log's examples (load_data)
        self.autocast: Callable = contextlib.nullcontext  # the run's precision (on_run_start)
        self.accelerator = None  # the run's, to add the ranks' KL sums (on_run_start)
        self.z: torch.Tensor | None = None  # the current optimizer step's KL estimate (its first micro-batch)
        self.split_z: dict[str, torch.Tensor] = {}  # this evaluation's KL estimate of its split
        self.figures = Figures(self.with_kl)

    def load_data(self, given=None) -> Splits:
        from .rows import kto_splits

        self.read_model()
        self.data, form = kto_splits(self.cfg, self.tokenizer, given, self.run.pad_multiple, self.run.processes)
        for split in ("train", "validation", "test"):
            rows = getattr(self.data, split)
            if rows is not None:
                rows.with_kl = self.with_kl
        self.stops = self.stops_for("chats" in form)
        self.answers = Answers(self.tokenizer, self.stops, self.run.main)
        return self.data

    def on_run_start(self, ctx: RunContext) -> None:
        """--reference cached: every split's reference log-probabilities of the completions and their KL pairs
        (causal_lm/cached.py); --reference live: a frozen copy of the starting model."""
        self.autocast, self.accelerator = ctx.accelerator.autocast, ctx.accelerator
        self.reference.start(ctx)
        if self.reference.how == "cached":
            cached.start(ctx, self.data, self.cfg.optim.batch_size, self.cfg.data.max_length, self.cfg.run.resume)

    def after_check(self) -> None:
        """The start-up check ran the step once on the first rows: its KL estimate and figures do not count."""
        self.z, self.figures = None, Figures(self.with_kl)

    # --------------------------------------------------------------------------- the step
    def train_step(self, ctx: RunContext, batch: KTOBatch) -> torch.Tensor:
        """At the step's first micro-batch, its KL estimate (every rank together); then the batch's completions
        through the model (ctx.forward: its wrappers synchronise the gradients), the reference beside them, and the
        loss: the sum over the rows over the batch's share of the step's rows."""
        if ctx.micro == 0 or self.z is None:
            model = ctx.accelerator.unwrap_model(ctx.model)
            rows = cast(KTORows, self.data.train)
            self.z = self.estimate(self.kl_sums(rows, batch.step, bare(model), model, batch.passes))
            self.figures.add_kl(self.z)
        table = self.table(ctx.forward, batch.inputs, ctx.model)
        targets = self.targets(batch, self.z)
        if ctx.weight:  # not a filler row (shares.py)
            losses, r, pi, desirable = self.rows_of(table.detach(), targets)
            self.figures.add(self.o.beta * r, pi, desirable)
        return ctx.loss(table, targets)

    def table(self, call: Callable, inputs: dict, model: nn.Module) -> torch.Tensor:
        """(B, 3), one row a completion: its log-probability, its tokens, and the reference's log-probability where it
        is computed per batch (NaN: cached)."""
        table = sequence_logps(call, inputs)
        ref = torch.full_like(table[:, :1], float("nan"))
        if self.reference.per_batch:  # the frozen copy (live), or the model with its adapter off
            with torch.no_grad(), self.autocast(), self.reference.calling(model) as reference:
                ref = sequence_logps(reference, inputs)[:, :1]
        return torch.cat([table, ref], 1)

    def kl_sums(self, rows: KTORows, chunks, call: Callable, model: nn.Module, passes: int) -> torch.Tensor:
        """(the sum over the chunks' rows of their KL pairs' log-ratio to the reference, their count), float64,
        without gradients; one chunk (a micro-batch's rows) at a time, then one-row passes that count for nothing up
        to `passes`, the most chunks any rank has (a sharded model gathers its weights in each forward)."""
        device = next(model.parameters()).device
        total = torch.zeros(2, dtype=torch.float64, device=device)
        if not self.with_kl:
            return total
        for k in range(max(passes, len(chunks))):
            chunk = list(chunks[k]) if k < len(chunks) else [0]
            inputs = {key: v.to(device) for key, v in rows.kl_inputs(chunk).items()}
            with torch.no_grad(), self.autocast():
                pi = sequence_logps(call, inputs)[:, 0]
                if self.reference.how == "cached":
                    ref = cast(torch.Tensor, rows.reference)[torch.as_tensor(chunk), 1].to(device)
                else:
                    with self.reference.calling(model) as reference:
                        ref = sequence_logps(reference, inputs)[:, 0]
            if k < len(chunks):
                count = torch.tensor(float(len(chunk)), dtype=torch.float64, device=device)
                total += torch.stack([(pi - ref).double().sum(), count])
        return total

    def estimate(self, sums: torch.Tensor) -> torch.Tensor:
        """z: the rows' mean KL log-ratio over every rank, clamped at 0 (TRL: `.clamp(min=0)`), float32."""
        if self.accelerator is not None and self.accelerator.num_processes > 1:
            sums = cast(torch.Tensor, self.accelerator.reduce(sums, "sum"))
        return (sums[0] / sums[1].clamp(min=1)).clamp(min=0).float()

    # --------------------------------------------------------------------------- the loss
    def targets(self, batch: KTOBatch, z: torch.Tensor) -> torch.Tensor:
        """(B, 3): the cached reference log-probability of each completion (NaN where not cached), its label, z."""
        ref = batch.reference[:, 0]
        return torch.stack([ref, batch.desirable.to(ref.dtype), z.to(ref.device, ref.dtype).expand(len(ref))], 1)

    def rows_of(self, outputs: torch.Tensor, targets: torch.Tensor):
        """Each row's weighted loss, log-ratio r = π - ref, log-probability π and label."""
        pi = outputs[:, 0]
        ref = targets[:, 0] if self.reference.how == "cached" else outputs[:, 2]
        desirable, z = targets[:, 1] > 0.5, targets[:, 2]
        r = pi - ref
        return weighted(self.o.kto_loss, r, desirable, z, self.o.beta, self.weights), r, pi, desirable

    def loss_sum(self, outputs, targets: torch.Tensor) -> torch.Tensor:
        return self.rows_of(outputs, targets)[0].sum()

    def loss(self, outputs, targets: torch.Tensor) -> torch.Tensor:
        return self.loss_sum(outputs, targets) / len(targets)

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        losses, r, pi, desirable = self.rows_of(logits_of(outputs), targets)
        reward, good = (self.o.beta * r).detach().double(), desirable.double()
        stats = {"loss": losses.detach().double(), "chosen": good, "chosen_reward": reward * good,
                 "rejected_reward": reward * (1 - good), "chosen_logps": pi.double() * good,
                 "rejected_logps": pi.double() * (1 - good)}  # fmt: skip
        if self.with_kl:
            stats["kl"] = targets[:, 2].double()
        return stats

    # --------------------------------------------------------------------------- evaluation
    def eval_batch(self, model: nn.Module, batch: KTOBatch, forward: Callable) -> dict:
        """The split's KL estimate once per evaluation (every rank a share of its rows), the rows' statistics, then
        each desirable row's completion generated from its prompt: exact match."""
        if batch.split not in self.split_z:  # the model outside its wrappers: the ranks score unequal shares
            bare_model = model if self.accelerator is None else self.accelerator.unwrap_model(model)
            self.split_z[batch.split] = self.estimate(self.split_sums(batch.split, bare(bare_model), bare_model))
        with self.autocast():
            table = self.table(lambda given: forward(model, given, None), batch.inputs, model)
        stats = self.per_sample(table, self.targets(batch, self.split_z[batch.split]))
        good = batch.desirable.nonzero().flatten()
        stats["exact_match"] = torch.zeros(len(batch), dtype=torch.float64, device=table.device)
        if len(good):
            inputs = batch.inputs
            chosen = (inputs["input_ids"][good], inputs["labels"][good], inputs["attention_mask"][good])
            stats["exact_match"][good] = cast(Answers, self.answers).exact_match(model, *chosen)
        return stats

    def split_sums(self, split: str, call: Callable, model: nn.Module) -> torch.Tensor:
        """This rank's share of the split's KL sums: every processes-th batch of its rows, in order."""
        rows = cast(KTORows, getattr(self.data, split))
        size = self.cfg.optim.batch_size
        starts = list(range(0, len(rows), size))
        chunks = [list(range(s, min(s + size, len(rows)))) for s in starts[self.run.rank :: self.run.processes]]
        return self.kl_sums(rows, chunks, call, model, -(-len(starts) // self.run.processes))

    def metrics(self, sums: dict, count: int) -> dict:
        """The loss and KL over every row; each class's rewards and log-probabilities over its rows (where it has
        any), their margin, and exact match over the desirable rows."""
        cast(Answers, self.answers).say_shown()
        self.split_z = {}  # the next evaluation scores its split's KL pairs anew, with the weights it has then
        good = sums["chosen"].item()
        out = {"loss": sums["loss"].item() / count}
        if self.with_kl:
            out["kl"] = sums["kl"].item() / count
        for name, n in (("chosen", good), ("rejected", count - good)):
            if n:
                out[f"{name}_reward"] = sums[f"{name}_reward"].item() / n
                out[f"{name}_logps"] = sums[f"{name}_logps"].item() / n
        if good and count - good:
            out["reward_margin"] = out["chosen_reward"] - out["rejected_reward"]
        if good:
            out["exact_match"] = sums["exact_match"].item() / good
        return out

    # --------------------------------------------------------------------------- figures and counts
    def train_figures(self, accelerator) -> dict:
        return self.figures.take(accelerator)

    def rank_state(self) -> dict[str, torch.Tensor]:
        """The figures since the last log line (a checkpoint may fall between two lines)."""
        return self.figures.state()

    def load_rank_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self.figures.load(tensors)

    def batch_counts(self, batch: KTOBatch) -> tuple[int, int]:
        return batch.counts()

    def describe_data(self, model: nn.Module) -> dict:
        o = self.o
        return {**super().describe_data(model), "reference": self.reference.how, "kto_loss": o.kto_loss,
                "beta": o.beta, "desirable_weight": o.desirable_weight,
                "undesirable_weight": o.undesirable_weight}  # fmt: skip

    def weights_metadata(self) -> dict:
        return {**super().weights_metadata(), "kto_loss": self.o.kto_loss, "beta": self.o.beta}
