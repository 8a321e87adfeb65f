"""kto: Kahneman-Tversky Optimization (TRL 1.16's KTOTrainer) of a transformers causal LM on unpaired preferences
(tasks/kto/task.py), with the losses of tasks/kto/losses.py, its rows and their fixed KL pairs (tasks/kto/rows.py,
tasks/kto/batches.py), its training figures (tasks/kto/figures.py) and its own options (tasks/kto/options.py, which
imports no torch). docs/kto.md is its reference."""
