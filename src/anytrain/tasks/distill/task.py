"""distill: on-policy knowledge distillation of a transformers causal LM from a teacher (TRL 1.16's
DistillationTrainer). The student samples its own completions of the prompts (the causal-LM base's rollout engine:
keyed sampling at --temperature, --top-p; tools and an environment as grpo's), and learns the teacher's next-token
distribution at every token it wrote: the loss is the generalized Jensen-Shannon divergence between the two over the
whole vocabulary (--beta: 0 the forward KL, 1 the reverse KL, between them JSD_beta), both softened by --temperature,
from the two models' hidden states and output layers a chunk of tokens at a time (tasks/causal_lm/divergence.py).

The batch: each optimizer step, every process answers its --batch-size x --grad-accum-steps prompts once, at the
step's first micro-batch (TRL's generation batch: a rollout of one step, tasks/causal_lm/slots.py), and each
micro-batch trains on its --batch-size of them. The loss is TRL's reduction: the sum of the per-token divergence over
every completion token of the step (every process, every micro-batch; the tools' tokens are read but not counted)
over their count, so the step's gradient is that of the mean over its tokens on any number of ranks and
accumulation steps.

Validation and test: each held-out prompt answered once by sampling (its own key), the divergence over its tokens;
`loss` is the mean over every completion token of the split (lower is better; the best weights are the lowest's).
The model exports to run_dir/hf and `anytrain sample` answers, as sft's and grpo's do. The teacher is not saved.
What it shares with grpo (the slots, sampling, holding the step's answers across its micro-batches, the time, length
and tool figures, the completions table's upkeep, the start-up line) is the base's (tasks/causal_lm/sampled.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from ...best import LOWER
from ...config import TrainConfig
from ...data.splits import Splits
from ..causal_lm.divergence import Divergence, DivergenceRequest, full_logits, teacher_at
from ..causal_lm.generation import Completions, prompt_kv, prompt_runs
from ..causal_lm.head import CausalLMHead
from ..causal_lm.prompt_rows import Prompts
from ..causal_lm.sampled import SampledCausalLM
from ..causal_lm.slots import Slot
from ..causal_lm.turns import Conversation
from ..contract import RunContext
from . import teacher as teachers
from .completions import CompletionsTable
from .figures import Figures
from .options import DistillOptions

DIVERGENCES = {0.0: "the forward KL(teacher || student)", 1.0: "the reverse KL(student || teacher)"}


@dataclass
class Answered:
    """One process's completions of its step's prompts, the step's share per micro-batch, and per completion its
    summed divergence, entropy and own tokens as the micro-batches find them (the completions table's)."""

    rows: Completions
    share: float
    prompts: list[int]
    talks: list[Conversation] | None
    sums: torch.Tensor


class OnPolicyDistillation(SampledCausalLM[Answered]):
    name = "distill"
    goals = {"loss": LOWER}
    headline = "loss"
    options = DistillOptions
    figures_type, table_type = Figures, CompletionsTable  # its table: run_dir/completions.jsonl (completions.py)
    figures: Figures
    table: CompletionsTable

    @classmethod
    def check_settled(cls, cfg: TrainConfig, reason: str) -> None:
        teachers.teacher_config(cfg)  # hf:... (the rest once the student's tokenizer is read: load_data)
        super().check_settled(cfg, reason)

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.teacher: nn.Module | None = None  # build_model
        self.teacher_config: Any = None  # its transformers config, checked against the student's (load_data)
        self.full: str | None = None  # why the divergence comes from the models' own full logits (None: chunked)
        self.accelerator: Any = None  # the run's (on_run_start): the teacher's autocast

    # --------------------------------------------------------------------------- data and model
    def load_data(self, given=None) -> Splits:
        """The prompts, for the student's and the teacher's positions; a step's answers: --batch-size x
        --grad-accum-steps prompts per process, a rollout trained for one step."""
        self.engine.load()
        self.read_model()
        self.teacher_config, _ = teachers.checked(self.cfg, self.head, self.tokenizer, self.model_config)
        positions = self.model_positions(self.model_config, self.teacher_config)
        batch, per_epoch = self.cfg.optim.batch_size * self.cfg.optim.grad_accum_steps, "train_steps_per_epoch"
        return self.read_prompts(given, positions, batch, 1, per_epoch, teacher=self.o.teacher)

    def build_model(self, given=None) -> nn.Module:
        model = super().build_model(given)
        self.teacher = teachers.load(self.cfg, self.head, self.teacher_config)
        self.full = full_logits(cast(CausalLMHead, model).causal_lm, self.teacher, self.run.shards)
        return model

    def on_run_start(self, ctx: RunContext) -> None:
        """The teacher on the run's device, in the student's dtype; the start-up line."""
        self.accelerator = ctx.accelerator
        dtype = next(ctx.model.parameters()).dtype
        self.teacher = teacher_on(self.teacher, ctx.accelerator.device, dtype)
        super().on_run_start(ctx)

    def described(self) -> str:
        """What the start-up line says of the batch, the loss and how the divergence is computed."""
        o, batch, accum = self.o, self.cfg.optim.batch_size, self.cfg.optim.grad_accum_steps
        divergence = DIVERGENCES.get(o.beta, f"the generalized JSD with mixture {1 - o.beta:g} student + {o.beta:g} "
                                     "teacher")  # fmt: skip
        how = "the output layers' chunks (no full logits)" if self.full is None else f"full logits ({self.full})"
        return (
            f"the teacher {o.teacher}; {batch * accum} prompts per process and step, answered once at its first "
            f"micro-batch, {batch} per micro-batch; loss: beta {o.beta:g}, {divergence}, at temperature "
            f"{o.temperature:g} over the whole vocabulary, per completion token of the step, from {how}"
        )

    # --------------------------------------------------------------------------- the step
    def train_step(self, ctx: RunContext, slot: Slot) -> torch.Tensor:
        """The step's answers at its first micro-batch; then this micro-batch's completions trained (which of the
        step's micro-batches it is: ctx.micro of ctx.micro_batches)."""
        answered, index = self.held(ctx, slot)
        rows = answered.rows.rows(index)
        found = self.divergence(ctx.forward, rows)
        self.figures.add_step(found.divergence, found.entropy)
        answered.sums[index.to(answered.sums.device)] += row_sums(found, rows.completion)
        self.last_counts = (len(index), len(found.divergence))
        if ctx.micro == ctx.micro_batches - 1:
            self.keep_rows(ctx.step, answered)
        return found.divergence.sum() / answered.share

    def roll_out(self, ctx: RunContext, slot: Slot) -> Answered:
        """The step's prompts on this process answered once each (keyed by the row and epoch), and the step's share
        per micro-batch: its completion tokens over every process, over processes x accumulation steps."""
        done, talks = self.complete(ctx, slot, 1)
        share = self.step_share(ctx.accelerator, done.completion.sum().double())
        sums = torch.zeros(len(slot.rows), 3, dtype=torch.float64, device=done.ids.device)
        return Answered(done, share, slot.rows, talks, sums)

    def divergence(self, call: Callable, rows: Completions, timed: bool = True) -> Divergence:
        """The per-token divergence and student entropy of the rows' completion tokens: the teacher's pass (no
        gradients, the run's precision; `timed`: in the figures' time_teacher), then the student's through `call`
        (the loop's forward, or evaluation's)."""
        whole = {"input_ids": rows.ids, "attention_mask": rows.mask, "position_ids": rows.positions}
        clock = self.figures.timed("teacher") if timed else contextlib.nullcontext()
        model, full = cast(nn.Module, self.teacher), self.full is not None
        with torch.no_grad(), self.accelerator.autocast(), clock:
            teacher = teacher_at(model, whole, rows.width - 1, rows.completion, full)
        inputs, start = self.student_inputs(call, rows)
        o = self.o
        return call(DivergenceRequest(inputs, start, rows.completion, teacher, o.beta, o.temperature))

    def student_inputs(self, call: Callable, rows: Completions) -> tuple[dict, int]:
        """The student's inputs and the position that predicts the first completion token: every row whole, or with
        --share-prompts, where consecutive rows repeat a prompt, its key-value cache read once (logprobs.py)."""
        shared, last = self.engine.shared, rows.width - 1
        runs = None if shared is None else prompt_runs(rows.ids[:, : rows.width], rows.mask[:, : rows.width])
        if shared is None or runs is None:
            return {"input_ids": rows.ids, "attention_mask": rows.mask, "position_ids": rows.positions}, last
        cache = prompt_kv(call, rows.ids[:, :last], rows.mask[:, :last], shared, runs)
        tail = {"input_ids": rows.ids[:, last:], "attention_mask": rows.mask, "position_ids": rows.positions[:, last:]}
        return {**tail, shared.kwarg: cache}, 0

    def keep_rows(self, step: int, answered: Answered) -> None:
        """The step's first completions for the completions table (the main process's)."""
        if not self.table.kept:
            return
        source, done = self.engine.prompts["train"], answered.rows
        if answered.talks is not None:
            completions: list = [talk.messages for talk in answered.talks]
        else:
            completions = [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in done.completion_ids()]
        prompts = [source.prompts[r] for r in answered.prompts]
        self.table.add(step, prompts, completions, answered.sums.tolist())

    # --------------------------------------------------------------------------- evaluation
    def eval_batch(self, model: nn.Module, batch: Prompts, forward: Callable) -> dict:
        """Each prompt answered once by sampling (its own key): the divergence summed over its tokens, and their
        count."""
        from ..causal_lm.generation import unwrapped

        split, rows = batch.split, batch.rows
        done, _ = self.engine.complete(unwrapped(model), split, rows, 1, self.keys(split, 0, rows, 1))
        found = self.divergence(lambda request: forward(model, request, None), done, timed=False)
        sums = row_sums(found, done.completion)
        return {"divergence": sums[:, 0], "tokens": sums[:, 2]}

    def metrics(self, sums: dict, count: int) -> dict:
        """The divergence's mean over every completion token of the split."""
        return {"loss": sums["divergence"].item() / max(sums["tokens"].item(), 1.0)}

    def describe_data(self, model: nn.Module) -> dict:
        o = self.o
        return {**super().describe_data(model), "teacher": o.teacher, "beta": o.beta, "temperature": o.temperature,
                "divergence_from": "chunks" if self.full is None else f"full logits: {self.full}"}  # fmt: skip


def row_sums(found: Divergence, learned: torch.Tensor) -> torch.Tensor:
    """(rows, 3) float64: each row's summed divergence and entropy and its counted tokens (no host sync)."""
    placed = [torch.zeros(learned.shape, dtype=torch.float64, device=learned.device).masked_scatter(learned, v.double())
              for v in (found.divergence.detach(), found.entropy)]  # fmt: skip
    return torch.stack([placed[0].sum(1), placed[1].sum(1), learned.sum(1).double()], 1)


def teacher_on(teacher: nn.Module | None, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The teacher on the run's device in the student's dtype (its precision is the run's: autocast)."""
    assert teacher is not None, "build_model loads the teacher"
    return teacher.to(device=device, dtype=dtype)
