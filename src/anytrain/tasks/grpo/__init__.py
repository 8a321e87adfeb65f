"""grpo: online reinforcement learning with verifiable rewards for a transformers causal LM (tasks/grpo/task.py): the
prompts and rollout slots (tasks/grpo/prompts.py), reproducible sampling (tasks/grpo/rollout.py), the reward
functions (tasks/grpo/rewards.py), advantages and loss (tasks/grpo/loss.py), the log's figures
(tasks/grpo/figures.py) and its own options (tasks/grpo/options.py, which imports no torch)."""
