"""dpo: preference tuning of a transformers causal LM on pairs of a prompt, a chosen and a rejected answer
(tasks/dpo/task.py), with the losses of tasks/dpo/losses.py, log-probabilities from the output layer a chunk at a
time (tasks/causal_lm/logprobs.py), the reference without a second model (tasks/dpo/reference.py), the pair formats
(tasks/dpo/pairs.py) and its own options (tasks/dpo/options.py, which imports no torch)."""
