"""grpo: online reinforcement learning with verifiable rewards for a transformers causal LM (tasks/grpo/task.py),
standing on the causal-LM base (its prompts, rollout engine, tools and environments, and the rollout slots, sampling
and figures it shares with distill: tasks/causal_lm/sampled.py): the reward functions (tasks/grpo/rewards.py),
advantages and loss (tasks/grpo/loss.py), the completions table (tasks/grpo/completions.py), the log's figures
(tasks/grpo/figures.py) and its own options (tasks/grpo/options.py, which imports no torch)."""
