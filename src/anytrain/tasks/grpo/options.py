"""grpo's own options: a section of the config (`grpo:` in YAML), flags in --help, part of the resume check.
Registered with the registry line (tasks/__init__.py); this module imports no torch. The rollout's sampling and tool
options are the rollout engine's, shared with distill (tasks/causal_lm/rollout_options.py: inherited, they come
first in the section)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config import POSITIVE, option
from ..causal_lm.rollout_options import RolloutOptions

NORMALISATIONS = ("dapo", "grpo", "dr_grpo")  # tasks/grpo/loss.py
SCALES = ("group", "batch", "none")
IMPORTANCE = ("token", "sequence", "sequence_sum")
ADVANTAGES = ("grpo", "rloo")
# --advantage rloo: TRL 1.16's RLOOConfig defaults for the options not given (GroupRelative.settle): the completion's
# probability ratio, one loss per completion averaged over completions, no reward scaling, beta 0.05
RLOO_DEFAULTS = {"importance": "sequence_sum", "grpo_loss": "grpo", "scale_rewards": "none", "kl_beta": 0.05}


@dataclass(frozen=True)
class GRPOOptions(RolloutOptions):
    reward: list[str] = option(
        [],
        "grpo: the reward functions, each FILE.py:function or module:function with TRL's signature "
        "fn(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, **columns) -> one number, "
        "bool (1.0 or 0.0) or None (not scored) per completion; a completion no function scored gets advantage 0. "
        "log_metric(name, value) adds a figure to the training log line, log_extra(column, values) a column to "
        "run_dir/completions.jsonl (the completions table, with each function's value, the reward and the "
        "advantage). Or a built-in: answer (1.0 where the completion, stripped, is the row's answer column), "
        "format:REGEX (1.0 where the completion matches the pattern from its start), length:N (0 up to N tokens, "
        "minus the share of N it runs past them); several after one flag or the flag repeated",
        repeatable=True,
    )
    reward_weights: list[float] = option([], "grpo: one weight per --reward (default: 1.0 each)", repeatable=True)
    num_generations: int = option(8, "grpo: completions sampled per prompt (a group: G)", bounds="[2, inf)")
    max_new_tokens: int = option(64, "grpo: the longest completion, in tokens", bounds=POSITIVE)
    temperature: float = option(1.0, "grpo: the sampling temperature", bounds=POSITIVE)
    epsilon: float = option(0.2, "grpo: the importance ratio is clipped to [1 - epsilon, 1 + epsilon]", bounds=POSITIVE)
    epsilon_high: float = option(
        0.0, "grpo: the upper clip, 1 + epsilon_high (DAPO's clip-higher); 0 = --epsilon", bounds="[0, inf)"
    )
    grpo_loss: str = option(
        "dapo",
        "grpo: how the per-token losses are averaged: dapo (over every completion token of the optimizer step: a "
        "long completion counts per token), grpo (each completion's mean, then over completions; --advantage rloo's "
        "default: with --importance sequence_sum a completion's loss is one value, so this is RLOOTrainer's mean "
        "over completions), dr_grpo (their sum over completions x --max-new-tokens: no length normalisation)",
        choices=NORMALISATIONS,
    )
    advantage: str = option(
        "grpo",
        "grpo: each completion's advantage: its reward minus its group's mean (grpo), or minus the mean of the "
        "other G - 1 rewards of its group, the leave-one-out baseline (rloo: TRL 1.16's RLOOTrainer; Ahmadian et "
        "al. 2024). rloo takes RLOOTrainer's defaults for the options not given: --importance sequence_sum, "
        "--grpo-loss grpo, --scale-rewards none, --kl-beta 0.05; and its KL is RLOO's, in the reward, not the "
        "loss (--kl-beta)",
        choices=ADVANTAGES,
    )
    scale_rewards: str = option(
        "group",
        "grpo: the advantage (--advantage: the reward minus its group's mean, or the leave-one-out baseline) "
        "divided by the group's standard deviation of rewards (group), the whole step's (batch), or not divided "
        "(none: Dr. GRPO; --advantage rloo's default, as RLOOTrainer scales none)",
        choices=SCALES,
    )
    normalize_advantages: bool = option(
        False,
        "grpo: after --scale-rewards, the step's advantages (every process's, unscorable ones left out) minus their "
        "mean, over their standard deviation + 1e-4 (TRL RLOOTrainer's normalize_advantages, off there too)",
    )
    importance: str = option(
        "token",
        "grpo: the importance ratio per token (GRPO), per completion as exp of its tokens' mean log-ratio "
        "(sequence: GSPO), or of their sum, the completion's probability ratio (sequence_sum: RLOOTrainer's; "
        "--advantage rloo's default)",
        choices=IMPORTANCE,
    )
    kl_beta: float = option(
        0.0,
        "grpo: the weight of the KL to the reference (TRL's beta; 0: none, no reference). The reference: the "
        "model with its adapter off (--lora-r), else a frozen copy of the starting model. With --advantage grpo a "
        "term of the loss (k3, see --kl-bias-correction); with rloo (default 0.05 there, RLOOTrainer's) RLOO's "
        "placement: beta x the completion's summed log pi_old - log pi_ref over its tokens (k1, pi_old the policy "
        "that sampled it) is taken from its reward before the advantage, and the loss has no KL term",
        bounds="[0, inf)",
    )
    kl_bias_correction: bool = option(
        True,
        "grpo: the KL term multiplied by the importance ratio, so that its gradient is the unbiased reverse-KL "
        "gradient (TRL 1.16's default, use_bias_correction_kl; DeepSeek-V3.2); --no-kl-bias-correction: the k3 "
        "estimate alone (TRL before 1.16). --advantage grpo's KL term only (rloo's KL is in the reward)",
    )
    grpo_iterations: int = option(
        1, "grpo: optimizer steps on each rollout (TRL's num_iterations, mu)", bounds=POSITIVE
    )
    mask_truncated: bool = option(False, "grpo: completions cut at --max-new-tokens count for nothing in the loss")
    environment: str = option(
        "",
        "grpo: FILE.py:Class or module:Class, TRL's environment_factory: one instance per completion, reset(**row) "
        "with the prompt's row (a text it returns is added to the last user message), its public methods the "
        "completion's tools, its get_reward() (if any) a reward function named after the class, weight 1",
    )
    share_prompts: bool = option(
        True,
        "grpo: each distinct prompt is read once for its whole group, by generate and by the log-probabilities (its "
        "key-value cache repeated to the group's completions), not once per completion: the same values to float "
        "rounding, checked on the model at the start (where the model cannot, or with gradient checkpointing, every "
        "row is read whole, as TRL does); --no-share-prompts: always every row whole",
    )
