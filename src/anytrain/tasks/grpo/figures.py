"""grpo's own figures in each training log line (and summary.json): what a user needs to see that the run learns
and where its time goes. Per rollout, over every process: each reward function's mean and standard deviation
(over the completions it scored), the total reward's (over the scorable completions, as TRL's `reward`), the share
of groups that give no signal (their scorable rewards all equal, or none scorable). Per micro-batch, summed over
processes when a line is written: the share of completion tokens whose ratio was clipped (below, above), the KL to
the reference (--kl-beta). And what the reward functions logged with log_metric, each under its own name: the mean
of each rollout's mean over its calls on every process (as TRL), over the line's rollouts. The completion length
(mean, longest, share cut at --max-new-tokens), the tool figures and the time figures are the causal-LM base's
(causal_lm/figures.py), which distill shares: `generating`, the share of the time since the last line spent on
rollouts, and its parts (`time_generate`: the model's generate, `time_tools`: the tools' calls, and grpo's own
`time_rewards`: the reward functions, `time_logps`: the old and reference log-probabilities, each a share of the
line's time)."""

from __future__ import annotations

import math

import torch

from ..causal_lm.figures import LENGTHS, TOOLS, RolloutFigures
from ..causal_lm.figures import mean as _mean
from ..causal_lm.figures import std as _std

PHASES = (*RolloutFigures.PHASES, "rewards", "logps")  # where a rollout's time goes: time_PHASE, shares of the line's
LOOP_KEYS = ("kind", "split", "step", "epoch", "loss", "lr", "samples_per_s", "tokens_per_s", "skipped_steps")
OWN = ("reward", "reward_std", "flat_groups", *LENGTHS, "clipped_low", "clipped_high", "kl", "generating", *TOOLS,
       *(f"time_{p}" for p in PHASES))  # fmt: skip


def reserved(names: list[str]) -> frozenset[str]:
    """The names a training log line already has (the loop's, these figures'): no log_metric may take them."""
    return frozenset([*LOOP_KEYS, *OWN, *(f"reward_{n}" for n in names), *(f"reward_{n}_std" for n in names)])


class Figures(RolloutFigures):
    PHASES = PHASES

    def __init__(self) -> None:
        super().__init__()
        self.rollout: torch.Tensor | None = None  # summed over the rollouts since the last line, every process's
        self.step = torch.zeros(4, dtype=torch.float64)  # this process's clipped low, high, KL, tokens
        self.names = [""]
        self.logged: list[dict[str, tuple[float, int]]] = []  # per rollout: this process's log_metric sums, counts

    def add_rollout(self, accelerator, table: torch.Tensor, reward: torch.Tensor, generations: int, names,
                    logged: dict) -> None:  # fmt: skip
        """Sums over the rollout's rewards on every process (one all-reduce); `logged`: this process's log_metric
        values, reduced when the line is written."""
        self.names = names
        self.logged.append({name: (math.fsum(values), len(values)) for name, values in logged.items()})
        seen = ~table.isnan()
        values = table.nan_to_num(0.0)
        scored = ~reward.isnan()
        rewards = reward.nan_to_num(0.0)
        local = torch.cat([
            values.sum(0), (values**2).sum(0), seen.double().sum(0),
            torch.stack([rewards.sum(), (rewards**2).sum(), scored.double().sum(),
                         flat_groups(reward, generations).sum(),
                         torch.tensor(float(len(reward) // generations), device=reward.device)]),
        ]).double()  # fmt: skip
        summed = accelerator.reduce(local, "sum").cpu()
        self.rollout = summed if self.rollout is None else self.rollout + summed

    def add_step(self, stats: dict, tokens: torch.Tensor) -> None:
        for k, name in enumerate(("clipped_low", "clipped_high", "kl")):
            if name in stats:
                self.step[k] += stats[name].double().cpu()
        self.step[3] += float(tokens)

    def take(self, accelerator) -> dict:
        """The figures since the last line (every process calls this together), then a new window."""
        if self.rollout is None:
            return {}
        k = len(self.names)
        r, step = self.rollout, accelerator.reduce(self.step.to(accelerator.device), "sum").cpu()
        out = {"reward": _mean(r[3 * k], r[3 * k + 2]), "reward_std": _std(r[3 * k], r[3 * k + 1], r[3 * k + 2])}
        for j, name in enumerate(self.names):
            out[f"reward_{name}"] = _mean(r[j], r[2 * k + j])
            out[f"reward_{name}_std"] = _std(r[j], r[k + j], r[2 * k + j])
        out.update(flat_groups=_mean(r[3 * k + 3], r[3 * k + 4]), **self.length_figures(),
                   clipped_low=_mean(step[0], step[3]), clipped_high=_mean(step[1], step[3]))  # fmt: skip
        if step[2] != 0:
            out["kl"] = _mean(step[2], step[3])
        out.update(self.time_figures())
        out.update(self.logged_means(accelerator))
        out.update(self.tool_figures())
        self.rollout, self.step = None, torch.zeros(4, dtype=torch.float64)
        self.logged = []
        self.start()
        return out

    def logged_means(self, accelerator) -> dict[str, float | None]:
        """Each log_metric name's mean over the line's rollouts of its mean over every process's calls in the
        rollout (NaN ones left out). Every process has had the same rollouts: it gathers the names, then reduces
        one (rollouts, names, 2) tensor of sums and counts in the names' sorted order."""
        from accelerate.utils import gather_object

        if not self.logged:
            return {}
        names = sorted(set(gather_object(sorted({n for rollout in self.logged for n in rollout}))))
        if not names:
            return {}
        local = [[rollout.get(n, (0.0, 0)) for n in names] for rollout in self.logged]
        sums = accelerator.reduce(torch.tensor(local, dtype=torch.float64, device=accelerator.device), "sum").cpu()
        out = {}
        for j, name in enumerate(names):
            means = [total / count for total, count in sums[:, j].tolist() if count > 0]
            means = [m for m in means if not math.isnan(m)]
            out[name] = math.fsum(means) / len(means) if means else None
        return out


def flat_groups(reward: torch.Tensor, generations: int) -> torch.Tensor:
    """(groups,) float: 1 where a group gives no signal: its scorable rewards all equal (or none is scorable)."""
    groups = reward.view(-1, generations)
    missing = groups.isnan()
    high = groups.masked_fill(missing, -math.inf).max(1).values
    low = groups.masked_fill(missing, math.inf).min(1).values
    return ((high == low) | missing.all(1)).double()
