"""anytrain: one plain PyTorch training loop that runs unchanged wherever `accelerate launch` puts it."""

import importlib
import time

IMPORTED_AT = time.perf_counter()  # src/train.py's first import: summary.json's start_to_first_step_s counts from here

__all__ = [
    "HIGHER",
    "LOWER",
    "ConfigError",
    "DataShape",
    "ModelConfig",
    "Splits",
    "Task",
    "TensorPairs",
    "TrainConfig",
    "load_labelled",
    "load_model",
    "make_model",
    "option",
    "predict_rows",
    "read_config",
    "train",
]
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
    "read_config": ".config",  # a run folder's config.yaml as a TrainConfig (a teacher's split, a base run's options)
    "ModelConfig": ".config",  # the model section, as your --model factory gets it
    # what your own task builds from (docs/guide.md "Your own task"): the same pieces the registry's tasks use
    "Splits": ".data.splits",  # what load_data returns: train, validation and test, the data's shape, its facts
    "TensorPairs": ".data.splits",  # a split held in memory: (inputs, targets) tensors, one row each
    "load_labelled": ".data.tables",  # a labelled table (the classify task's data), split as --task classify does
    "predict_rows": ".data.tables",  # predict's rows of a table: (features in the run's column order, rows, file name)
    "make_model": ".usermodel",  # the model --model names (registry, your factory, an object), checked on a batch
}


importlib.import_module(".tasks", __name__)  # the registry (no torch): its tasks' option sections exist in every config


def __getattr__(name: str):
    """`anytrain.train` and friends, imported on first use: the command line's `--help` and its
    one-line errors answer without importing torch (2 s here), which only a run needs."""
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name], __name__), name)
    raise AttributeError(f"module 'anytrain' has no attribute {name!r}")
