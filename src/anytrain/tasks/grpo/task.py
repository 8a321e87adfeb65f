"""grpo: online reinforcement learning with verifiable rewards (GRPO and its variants: Dr. GRPO, DAPO, GSPO; RLOO with
--advantage rloo) for a transformers causal LM. Each optimizer step, every process answers its --batch-size prompts
--num-generations times (tasks/causal_lm/generation.py: the model's own generate, reproducible sampling), scores every
completion with the --reward functions (tasks/grpo/rewards.py), turns the rewards into advantages within each
prompt's group (its mean, or RLOO's leave-one-out baseline), and trains on the completions' tokens with the clipped
importance ratio (tasks/grpo/loss.py), in --grad-accum-steps micro-batches, for --grpo-iterations steps per rollout.
The loop is the one every task trains through: this task's step (`train_step`) is what differs; what it shares with
distill (the rollout slots, sampling, holding a rollout across its micro-steps, the time, length and tool figures, the
completions table's upkeep, the start-up line) is the base's (tasks/causal_lm/sampled.py).

Validation and test: each held-out prompt answered once by sampling (its own key, the run's temperature) and once
greedily; `reward` and `greedy_reward` are their mean rewards. There is no evaluation loss (goals name none): the
validation and test lines and summary.json hold the rewards alone; the training lines keep the objective's value as
their loss. The best weights are those of the best validation reward. The model exports to run_dir/hf and
`anytrain sample` answers, as sft's do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ...best import HIGHER
from ...config import ConfigError, TrainConfig
from ...data.splits import Splits
from ..causal_lm.generation import Completions
from ..causal_lm.logprobs import bare, completion_logps
from ..causal_lm.prompt_rows import Prompts, is_prompts
from ..causal_lm.reference import Reference
from ..causal_lm.sampled import SampledCausalLM
from ..causal_lm.slots import Slot
from ..causal_lm.turns import Conversation
from ..contract import RunContext
from . import loss as objective
from .completions import CompletionsTable, taken
from .figures import Figures, reserved
from .options import RLOO_DEFAULTS, GRPOOptions
from .rewards import RewardCall, TrainerState, environment_reward, load_rewards, scores, total


@dataclass
class Rollout:
    """One process's rollout: its completions, their advantages, the log-probabilities of the policy that sampled
    them (--grpo-iterations > 1) and of the reference (--kl-beta > 0), and the step's share per micro-batch."""

    rows: Completions
    advantages: torch.Tensor
    keep: torch.Tensor
    old: torch.Tensor | None
    ref: torch.Tensor | None
    share: float


class GroupRelative(SampledCausalLM[Rollout]):
    name = "grpo"
    goals = {"reward": HIGHER, "greedy_reward": HIGHER}  # no "loss": it evaluates by generating, not by a loss
    headline = "reward"
    options = GRPOOptions
    figures_type, table_type = Figures, CompletionsTable  # its table: run_dir/completions.jsonl (completions.py)
    figures: Figures
    table: CompletionsTable

    @classmethod
    def detect(cls, source) -> str | None:
        if not source.readable or not is_prompts(source.train.column_names):
            return None
        return "auto: a prompt column without answers (prompts the model answers, scored by --reward)"

    @classmethod
    def settle(cls, cfg: TrainConfig) -> tuple[TrainConfig, tuple[str, ...]]:
        """With --advantage rloo, the options not given take TRL's RLOOTrainer defaults (RLOO_DEFAULTS)."""
        cfg, notes = super().settle(cfg)
        fitted = {k: v for k, v in RLOO_DEFAULTS.items() if k not in cfg.given}
        if cfg.section(cls.name).advantage != "rloo" or not fitted:
            return cfg, notes
        said = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in fitted.items())
        return cfg.replace(**fitted), (*notes, f"--advantage rloo: {said} (TRL's RLOOTrainer defaults)")

    @classmethod
    def check_settled(cls, cfg: TrainConfig, reason: str) -> None:
        o, engine = cfg.section(cls.name), cls.loaded_engine(cfg)
        owned = environment_reward(engine.environment) if engine.environment else None
        load_rewards(o.reward, o.reward_weights, owned)
        if o.advantage == "rloo" and not o.kl_bias_correction:
            raise ConfigError("--no-kl-bias-correction: with --advantage rloo the KL is in the reward, not the loss")
        if cfg.optim.batch_size * o.num_generations < cfg.optim.grad_accum_steps:
            raise ConfigError(
                f"--grad-accum-steps {cfg.optim.grad_accum_steps}: more micro-batches than the step's "
                f"{cfg.optim.batch_size} x {o.num_generations} completions per process"
            )

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.rewards: list = []  # the --reward functions (load_data; check_settled refused the run without one)
        self.state: TrainerState | None = None  # the last training rollout's (what evaluation's rewards get)
        lora = bool(cfg.model.lora_r)  # --kl-beta: the starting model, frozen, or with LoRA the model adapter off
        self.reference = Reference(("adapter" if lora else "live") if self.o.kl_beta > 0 else "none")
        self.device = torch.device("cpu")  # the run's (on_run_start)

    # --------------------------------------------------------------------------- data and model
    def load_data(self, given=None) -> Splits:
        """The prompts and their columns, as the rewards are given them; a rollout: --batch-size prompts per process,
        trained for --grpo-iterations steps."""
        self.engine.load()
        owned = environment_reward(self.engine.environment) if self.engine.environment else None
        self.rewards = load_rewards(self.o.reward, self.o.reward_weights, owned)
        self.read_model()
        per_epoch = "train_rollouts_per_epoch"
        positions = self.model_positions(self.model_config)
        return self.read_prompts(given, positions, self.cfg.optim.batch_size, self.o.grpo_iterations, per_epoch)

    def after_check(self) -> None:
        """The start-up check ran one rollout and step: none of it counts (its rollout, figures, table rows, the
        trainer state the reward functions were given)."""
        super().after_check()
        self.state = None

    def on_run_start(self, ctx: RunContext) -> None:
        """With --kl-beta and full fine-tuning, a frozen copy of the starting model; the start-up line."""
        self.device = ctx.accelerator.device
        self.reference.start(ctx)
        super().on_run_start(ctx)

    def described(self) -> str:
        """What the start-up line says of the rollout, the loss and the rewards."""
        o, names = self.o, ", ".join(f"{r.name} (x{r.weight:g})" for r in self.rewards)
        return (
            f"{o.num_generations} completions per prompt, {self.cfg.optim.batch_size} prompts per process and step, "
            f"{o.grpo_iterations} step(s) per rollout; loss {o.grpo_loss}, advantages {o.advantage} scaled by "
            f"{o.scale_rewards}{', normalised' * o.normalize_advantages}, ratio per {o.importance}, KL weight "
            f"{o.kl_beta:g}{' (in the reward)' * (o.advantage == 'rloo')}; rewards: {names}"
        )

    # --------------------------------------------------------------------------- the step
    def train_step(self, ctx: RunContext, slot: Slot) -> torch.Tensor:
        """The rollout at the first micro-batch of its first step; then this micro-batch's completions trained (which
        of the step's micro-batches it is: ctx.micro of ctx.micro_batches)."""
        rollout, index = self.held(ctx, slot)
        rows = rollout.rows.rows(index)
        logps = completion_logps(ctx.forward, rows, self.o.temperature, self.engine.shared)
        old = logps.detach() if rollout.old is None else rollout.old[index]
        ref = None if rollout.ref is None else rollout.ref[index]
        keep = rollout.keep[index]
        losses, stats = objective.token_losses(logps, old, ref, rollout.advantages[index], keep, self.settings())
        self.figures.add_step(stats, keep.sum())
        self.last_counts = (len(index), int(keep.sum()))
        return objective.summed(losses, keep, self.o.grpo_loss) / rollout.share

    def settings(self) -> dict:
        o = self.o
        return {"importance": o.importance, "epsilon": o.epsilon, "epsilon_high": o.epsilon_high, "kl_beta": o.kl_beta,
                "kl_bias_correction": o.kl_bias_correction, "advantage": o.advantage}  # fmt: skip

    def roll_out(self, ctx: RunContext, slot: Slot) -> Rollout:
        """Generate, score, advantages, the step's count; the old and reference log-probabilities where needed."""
        accelerator, model = ctx.accelerator, ctx.accelerator.unwrap_model(ctx.model)
        done, talks = self.complete(ctx, slot, self.o.num_generations)
        call = self.reward_call(self.trainer_state(ctx.step))
        with self.figures.timed("rewards"):
            table, args = self.score(done, slot.rows, "train", call=call, talks=talks)
        reward = total(table, self.rewards).to(accelerator.device)  # NaN: unscorable
        keep = objective.counted(done.completion, done.truncated, self.o.mask_truncated)
        kl_in_reward = self.o.advantage == "rloo" and self.o.kl_beta > 0
        with torch.no_grad(), accelerator.autocast(), self.figures.timed("logps"):
            old = self.rollout_logps(bare(model), done) if self.o.grpo_iterations > 1 or kl_in_reward else None
            ref = self.reference_logps(model, done) if self.o.kl_beta > 0 else None
        advantage = self.advantages(accelerator, reward, keep, old, ref)
        old = old if self.o.grpo_iterations > 1 else None  # one step per rollout: the policy itself, detached
        share = self.step_share(accelerator, objective.step_count(keep, self.o.grpo_loss, self.o.max_new_tokens))
        names = [r.name for r in self.rewards]
        self.figures.add_rollout(
            accelerator, table.to(accelerator.device), reward, self.o.num_generations, names, call.metrics
        )
        self.table.add(ctx.step, args, table, names, reward.cpu(), advantage.cpu(), call.extra)
        return Rollout(done, advantage, keep, old, ref, share)

    def advantages(self, accelerator, reward: torch.Tensor, keep: torch.Tensor, old, ref) -> torch.Tensor:
        """The rollout's advantages (tasks/grpo/loss.py); with rloo and --kl-beta, of its rewards less beta x each
        completion's summed log pi_old - log pi_ref (RLOOTrainer: the KL in the reward, under the sampling policy)."""
        o = self.o
        if o.advantage == "rloo" and ref is not None:
            reward = reward - o.kl_beta * ((old - ref) * keep).sum(1).double()
        batch_std = objective.nanstd(accelerator.gather(reward)) if o.scale_rewards == "batch" else None
        normalise = accelerator.gather if o.normalize_advantages else None
        return objective.advantages(reward, o.num_generations, o.scale_rewards, batch_std, o.advantage, normalise)

    def rollout_logps(self, call: Callable, done: Completions) -> torch.Tensor:
        """The rollout's per-token log-probabilities under the model `call` calls (logprobs.bare: no gradients, no
        wrappers), a micro-batch of completions at a time: the peak is one micro-batch's, as in training."""
        count = self.cfg.optim.grad_accum_steps
        pieces = torch.tensor_split(torch.arange(len(done.ids)), count)
        return torch.cat(
            [completion_logps(call, done.rows(index), self.o.temperature, self.engine.shared) for index in pieces]
        )

    def reference_logps(self, model: nn.Module, done: Completions) -> torch.Tensor:
        """The reference's per-token log-probabilities: the frozen starting model, or the model with its adapter off
        (LoRA: its weights as they were loaded)."""
        with self.reference.calling(model) as reference:
            return self.rollout_logps(reference, done)

    def trainer_state(self, step: int) -> TrainerState:
        """The trainer_state reward functions get at a rollout after `step` optimizer steps."""
        total_steps = min(self.cfg.optim.max_steps or math.inf, self.cfg.optim.epochs * self.steps_per_epoch)
        self.state = TrainerState(step, step / self.steps_per_epoch, int(total_steps), self.cfg.optim.epochs)
        return self.state

    def reward_call(self, state: TrainerState) -> RewardCall:
        names = [r.name for r in self.rewards]
        return RewardCall(state, figures=reserved(names), columns=taken(names))

    def score(
        self,
        done: Completions,
        rows: list[int],
        split: str,
        per_row: int | None = None,
        call: RewardCall | None = None,
        talks: list[Conversation] | None = None,
    ) -> tuple[torch.Tensor, dict]:
        """(completions, functions) rewards of the completions of `rows` (each `per_row` times, default G), and the
        arguments the functions got; `call`: trainer_state, log_metric, log_extra (a training rollout's); `talks`:
        the completions as conversations (tools: each its messages; an environment: each its instance)."""  # fmt: skip
        per_row = per_row or self.o.num_generations
        source = self.engine.prompts[split]
        ids = done.completion_ids()
        texts = [self.tokenizer.decode(t, skip_special_tokens=True) for t in ids]
        chats = isinstance(source.prompts[rows[0]], list)
        completions = [[{"role": "assistant", "content": t}] for t in texts] if chats else texts
        if talks is not None:
            completions = [talk.messages for talk in talks]
        args = {"prompts": [source.prompts[r] for r in rows for _ in range(per_row)], "completions": completions,
                "completion_ids": ids}  # fmt: skip
        for name, values in source.columns.items():
            args[name] = [values[r] for r in rows for _ in range(per_row)]
        if talks is not None and self.engine.environment is not None:
            args["environments"] = [talk.environment for talk in talks]
        call = call or self.reward_call(self.state or self.trainer_state(0))  # evaluation: what it logs is dropped
        return scores(self.rewards, args, lambda k: f"completion {k % per_row} of {split} row {rows[k // per_row]}",
                      call), args  # fmt: skip

    # --------------------------------------------------------------------------- a rollout across a kill
    def rank_state(self) -> dict[str, torch.Tensor]:
        """With --grpo-iterations above 1, the rollout in progress (a checkpoint may fall inside it): its completions
        and the log-probabilities of the policy that sampled them cannot be made again from later weights."""
        r = self.rollout
        if r is None or self.o.grpo_iterations == 1:
            return {}
        rows = r.rows
        out = {"ids": rows.ids, "mask": rows.mask, "positions": rows.positions, "completion": rows.completion,
               "truncated": rows.truncated, "advantages": r.advantages, "keep": r.keep,
               "share": torch.tensor(r.share, dtype=torch.float64), "width": torch.tensor(rows.width)}  # fmt: skip
        return {**out, **{k: v for k, v in (("old", r.old), ("ref", r.ref)) if v is not None}}

    def load_rank_state(self, tensors: dict[str, torch.Tensor]) -> None:
        if not tensors:
            return
        t = {k: v.to(self.device) for k, v in tensors.items()}
        rows = Completions(t["ids"], t["mask"], t["positions"], t["completion"], t["truncated"], int(t["width"]))
        self.rollout = Rollout(rows, t["advantages"], t["keep"], t.get("old"), t.get("ref"), float(t["share"]))

    # --------------------------------------------------------------------------- evaluation
    def eval_batch(self, model: nn.Module, batch: Prompts, forward: Callable) -> dict:
        """Each prompt answered once by sampling (its own key) and once greedily: their rewards."""
        from ..causal_lm.generation import unwrapped

        split, rows = batch.split, batch.rows
        stats = {}
        for name, k in (("reward", self.keys(split, 0, rows, 1)), ("greedy_reward", None)):
            done, talks = self.engine.complete(unwrapped(model), split, rows, 1, k)
            reward = total(self.score(done, rows, split, 1, talks=talks)[0], self.rewards).to(self.device)
            stats[name], stats[f"{name}_scored"] = reward.nan_to_num(0.0), (~reward.isnan()).double()
        return stats

    def metrics(self, sums: dict, count: int) -> dict:
        """Each reward's mean over the completions some function scored (0 where none was); no loss."""
        return {k: sums[k].item() / max(sums[f"{k}_scored"].item(), 1.0) for k in ("reward", "greedy_reward")}

    def describe_data(self, model: nn.Module) -> dict:
        o = self.o
        rewards = {"rewards": [r.name for r in self.rewards], "reward_weights": [r.weight for r in self.rewards]}
        return {
            **super().describe_data(model),
            "num_generations": o.num_generations,
            "grpo_loss": o.grpo_loss,
            "advantage": o.advantage,
            **rewards,
        }
