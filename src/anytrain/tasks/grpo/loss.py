"""grpo's advantages and loss.

Advantage (--advantage): each completion's reward minus its group's mean (grpo: the prompt's --num-generations
completions), or minus the mean of the group's other rewards (rloo, the leave-one-out baseline of TRL 1.16's
RLOOTrainer and Ahmadian et al. 2024: r_i - (sum - r_i) / (k - 1), k the group's scorable completions; G/(G-1)
times grpo's where every one is scorable), divided by the group's standard deviation (--scale-rewards group), the
whole step's over every process (batch) or by nothing (none), plus 1e-4; with --normalize-advantages (TRL
RLOOTrainer's normalize_advantages) then minus the step's mean advantage, over its standard deviation + 1e-4. As
TRL: an unscorable completion (no reward function scored it: its reward is NaN) is left out of its group's mean and
baselines, of every standard deviation and mean (unbiased, as torch.std), and its advantage is 0; so is every
advantage whose standard deviation has fewer than 2 values, and each of a group with one scorable completion
(rloo: no other reward to take the baseline from). A group whose rewards are all equal has advantage 0: no signal
(the log says how many). With rloo and --kl-beta the reward is first less beta x the completion's summed
log pi_old - log pi_ref (RLOOTrainer's KL in the reward: tasks/grpo/task.py, roll_out), and the loss has no KL term.

Per token: -min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A), r = exp(log pi - log pi_old) the importance
ratio, per token or, for the whole completion, exp of its mean log-ratio (--importance sequence: GSPO) or of their
sum (sequence_sum: the completion's probability ratio, RLOOTrainer's); with grpo's advantage
plus --kl-beta x r x (exp(q) - q - 1), q = log pi_ref - log pi (the k3 estimate of the KL to the reference, times
the importance ratio: TRL 1.16's use_bias_correction_kl, whose gradient is the unbiased reverse-KL gradient; without
r with --no-kl-bias-correction). With one update per rollout pi_old is pi itself (detached): r = 1 in value, and the
gradient is the policy gradient. Every log-probability is under softmax(logits / --temperature), the policy that
sampled (tasks/causal_lm/logprobs.py); positions after a completion's stop hold 0, so nothing there overflows.

Averaged over the optimizer step (--grpo-loss): dapo, the sum over every counted completion token of the step; grpo,
each completion's mean over its tokens, summed over completions; dr_grpo, the sum over tokens; each divided by the
step's count (tokens, completions, completions x --max-new-tokens) over every process. A micro-batch's loss is its
sum over its share of that count, so the step is the same on any number of processes and accumulation steps.
RLOOTrainer's loss (the rloo defaults): sequence_sum's per-token losses are one value per completion, its loss, so
grpo's mean of them over the step's completions is RLOOTrainer's per_sequence_loss.mean().
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def nanstd(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The unbiased standard deviation of the values that are not NaN (torch.std's where none is), over `dim` (None:
    all); NaN where fewer than 2 are (TRL's nanstd)."""
    if dim is None:
        values, dim = values.reshape(-1), 0
    count = (~values.isnan()).sum(dim)
    squares = ((values - values.nanmean(dim, keepdim=True)) ** 2).nansum(dim)
    return torch.where(count > 1, squares / (count - 1).clamp(min=1), torch.full_like(squares, float("nan"))).sqrt()


def advantages(
    rewards: torch.Tensor,
    generations: int,
    scale: str,
    batch_std: torch.Tensor | None,
    estimator: str = "grpo",
    normalise: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """(n,) float32 advantages of n = prompts x generations rewards (float64, NaN: unscorable), grouped by prompt;
    `batch_std`: the step's nanstd over every process (scale "batch"); `estimator`: grpo (the group's mean) or rloo
    (the leave-one-out mean); `normalise`: None, or what gathers every process's values (--normalize-advantages:
    then standardised over the step). NaN advantages become 0 (as TRL)."""
    groups = rewards.view(-1, generations)
    if estimator == "rloo":  # RLOOTrainer: (nansum - r) / (scorable - 1): NaN where r is alone or unscorable
        baseline = (groups.nansum(1, keepdim=True) - groups) / ((~groups.isnan()).sum(1, keepdim=True) - 1)
    else:
        baseline = groups.nanmean(1, keepdim=True)
    centred = (groups - baseline).view(-1)
    if scale == "group":
        centred = centred / (nanstd(groups, 1).repeat_interleave(generations) + 1e-4)
    elif scale == "batch":
        assert batch_std is not None
        centred = centred / (batch_std + 1e-4)
    if normalise is not None:
        every = normalise(centred)
        centred = (centred - every.nanmean()) / (nanstd(every) + 1e-4)
    return centred.nan_to_num(nan=0.0).float()


def counted(completion: torch.Tensor, truncated: torch.Tensor, mask_truncated: bool) -> torch.Tensor:
    """(n, T) float: the completion tokens the loss counts (with --mask-truncated, none of a truncated one's)."""
    keep = completion.float()
    return keep * (~truncated).float()[:, None] if mask_truncated else keep


def step_count(keep: torch.Tensor, normalisation: str, max_new_tokens: int) -> torch.Tensor:
    """This process's part of the step's count: tokens (dapo), completions (grpo), completions x T (dr_grpo)."""
    if normalisation == "dapo":
        return keep.sum()
    completions = torch.tensor(float(len(keep)), device=keep.device)  # a fully masked one counts too (as TRL)
    return completions * (max_new_tokens if normalisation == "dr_grpo" else 1)


def token_losses(logps, old, ref, advantage, keep, settings: dict) -> tuple[torch.Tensor, dict]:
    """(n, T) per-token losses and this batch's sums for the log (clipped tokens, KL)."""
    log_ratio = logps - old
    if settings["importance"] == "sequence":  # GSPO: one ratio per completion, its mean log-ratio
        log_ratio = ((log_ratio * keep).sum(1) / keep.sum(1).clamp(min=1.0))[:, None].expand_as(logps)
    elif settings["importance"] == "sequence_sum":  # RLOOTrainer: the completion's probability ratio
        log_ratio = (log_ratio * keep).sum(1)[:, None].expand_as(logps)
    ratio = log_ratio.exp()
    low, high = 1 - settings["epsilon"], 1 + (settings["epsilon_high"] or settings["epsilon"])
    a = advantage[:, None]
    losses = -torch.min(ratio * a, ratio.clamp(low, high) * a)
    stats = {
        "clipped_low": (((ratio < low) & (a < 0)).float() * keep).sum().detach(),
        "clipped_high": (((ratio > high) & (a > 0)).float() * keep).sum().detach(),
    }
    if settings["kl_beta"] > 0 and settings.get("advantage") == "rloo":  # in the reward (roll_out): logged only
        stats["kl"] = ((old - ref) * keep).sum().detach()  # RLOOTrainer's kl: k1 under the policy that sampled
    elif settings["kl_beta"] > 0:
        q = ref - logps
        kl = q.exp() - q - 1
        stats["kl"] = (kl * keep).sum().detach()
        if settings["kl_bias_correction"]:
            kl = kl * ratio
        losses = losses + settings["kl_beta"] * kl
    return losses, stats


def summed(losses: torch.Tensor, keep: torch.Tensor, normalisation: str) -> torch.Tensor:
    """The micro-batch's sum under the normalisation: over tokens, or of each completion's mean (grpo)."""
    if normalisation == "grpo":
        return ((losses * keep).sum(1) / keep.sum(1).clamp(min=1.0)).sum()
    return (losses * keep).sum()
