"""grpo's own figures in each training log line (and summary.json): what a user needs to see that the run learns
and where its time goes. Per rollout, over every process: each reward function's mean and standard deviation,
the total reward's, the share of groups whose rewards are all equal (they give no signal), completion length
(mean, longest, share cut at --max-new-tokens). Per micro-batch, summed over processes when a line is written:
the share of completion tokens whose ratio was clipped (below, above), the KL to the reference (--kl-beta), and
the share of the time since the last line spent generating."""

from __future__ import annotations

import time

import torch


class Figures:
    def __init__(self) -> None:
        self.rollout: torch.Tensor | None = None  # summed over the rollouts since the last line, every process's
        self.longest = 0.0
        self.step = torch.zeros(4, dtype=torch.float64)  # this process's clipped low, high, KL, tokens
        self.generating, self.since, self.names = 0.0, time.perf_counter(), [""]

    def start(self) -> None:
        self.generating, self.since = 0.0, time.perf_counter()

    def add_rollout(
        self, accelerator, table: torch.Tensor, reward: torch.Tensor, done, generations: int, names
    ) -> None:
        """Sums over the rollout's completions on every process (one all-reduce, one gather for the longest)."""
        self.names = names
        seen = ~table.isnan()
        values = table.nan_to_num(0.0)
        lengths = done.completion.sum(1).double()
        groups = reward.view(-1, generations)
        flat = (groups.max(1).values == groups.min(1).values).double()
        local = torch.cat([
            values.sum(0), (values**2).sum(0), seen.double().sum(0),
            torch.stack([reward.sum(), (reward**2).sum(), torch.tensor(float(len(reward)), device=reward.device),
                         lengths.sum(), done.truncated.double().sum(), flat.sum(),
                         torch.tensor(float(len(flat)), device=reward.device)]),
        ]).double()  # fmt: skip
        summed = accelerator.reduce(local, "sum").cpu()
        self.rollout = summed if self.rollout is None else self.rollout + summed
        longest = accelerator.gather(lengths.max().view(1)).max().item()
        self.longest = max(self.longest, longest)

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
        completions = r[3 * k + 2]
        out.update(
            flat_groups=_mean(r[3 * k + 5], r[3 * k + 6]), completion_length=_mean(r[3 * k + 3], completions),
            completion_length_max=self.longest, truncated=_mean(r[3 * k + 4], completions),
            clipped_low=_mean(step[0], step[3]), clipped_high=_mean(step[1], step[3]),
        )  # fmt: skip
        if step[2] != 0:
            out["kl"] = _mean(step[2], step[3])
        elapsed = time.perf_counter() - self.since
        out["generating"] = self.generating / elapsed if elapsed > 0 else None
        self.rollout, self.longest, self.step = None, 0.0, torch.zeros(4, dtype=torch.float64)
        self.start()
        return out


def _mean(total: torch.Tensor, count: torch.Tensor) -> float | None:
    return (total / count).item() if count > 0 else None


def _std(total: torch.Tensor, squares: torch.Tensor, count: torch.Tensor) -> float | None:
    return ((squares / count - (total / count) ** 2).clamp(min=0) ** 0.5).item() if count > 0 else None
