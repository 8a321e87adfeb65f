"""distill: on-policy knowledge distillation (TRL 1.16's DistillationTrainer) of a transformers causal LM from a
teacher (tasks/distill/task.py), standing on the causal-LM base (its prompts, rollout engine, tools and environments,
the slots, sampling and figures it shares with grpo: tasks/causal_lm/sampled.py, and the chunked divergence:
tasks/causal_lm/divergence.py): the teacher's checks and loading (tasks/distill/teacher.py), the completions table
(tasks/distill/completions.py), the log's figures (tasks/distill/figures.py) and its own options
(tasks/distill/options.py, which imports no torch). docs/distill.md is its reference."""
