"""anytrain: one plain PyTorch training loop that runs unchanged wherever `accelerate launch` puts it."""

import importlib
import time

IMPORTED_AT = time.perf_counter()  # src/train.py's first import: summary.json's start_to_first_step_s counts from here

__all__ = ["HIGHER", "LOWER", "ConfigError", "DataShape", "Task", "TrainConfig", "load_model", "option", "train"]
__version__ = "0.1.0"
_HOMES = {
    "train": ".api",
    "TrainConfig": ".config",
    "load_model": ".reload",
    "DataShape": ".shape",
    "Task": ".tasks.contract",  # your own task (--task FILE.py:Class): subclass it
    "HIGHER": ".best",
    "LOWER": ".best",
    "option": ".config",  # a task's own options, as fields of a frozen dataclass
    "ConfigError": ".config",  # bad input: one line, naming the option or file (a ValueError)
}


importlib.import_module(".tasks", __name__)  # the registry (no torch): its tasks' option sections exist in every config


def __getattr__(name: str):
    """`anytrain.train` and friends, imported on first use: the command line's `--help` and its
    one-line errors answer without importing torch (2 s here), which only a run needs."""
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name], __name__), name)
    raise AttributeError(f"module 'anytrain' has no attribute {name!r}")
