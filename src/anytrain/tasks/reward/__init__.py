"""reward: a reward model on preference pairs (tasks/reward/task.py), read as dpo reads them (tasks/dpo/pairs.py)."""
