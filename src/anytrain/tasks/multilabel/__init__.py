"""multilabel: a table's rows each with a list of labels (tasks/multilabel/task.py), and its own option
(tasks/multilabel/options.py: --threshold, which imports no torch, so `--help` lists it without the task)."""
