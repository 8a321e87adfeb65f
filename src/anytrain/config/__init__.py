"""The run's options, grouped in five sections, each option with all its facts in one place.

    data   what is read and how it is batched        model  which network, and its sizes
    optim  optimizer, schedule, steps and batches   eval   validation and early stopping
    run    seed, run folder, logging, checkpoints, trackers, DDP

Every option is a field of its section made by `option()`: default, help, choices, bounds, whether
it may change on `--resume`, and whether model_parallel.py offers it. The flags (flat: `--lr`,
`--n-layer`), YAML loading (sectioned or flat), the range checks, the resume check and
model_parallel's flags are all derived from those facts.

Hardware (devices, number of processes, mixed precision) is deliberately NOT here: it comes from
the accelerate config the run is launched with, so the same options train anywhere.

One file a job: facts.py (what an option is, the error types), sections.py (the five sections),
schema.py (the registry of sections and options, TrainConfig), cli.py (flags), saved.py (YAML, dicts
and saved configs), checks.py (the rules). This module names them all.
"""

from .checks import check_config, check_options
from .cli import OneLineParser, add_options, build_parser, parse_config, task_value
from .facts import NON_NEGATIVE, POSITIVE, UNIT, ConfigError, LaunchError, Option, first_line, option
from .saved import (
    CONFIG_FILE,
    coerce,
    load_yaml,
    options_from,
    read_config,
    read_saved,
    registration_kept,
    save_config,
    saved_options,
    with_defaults,
)
from .schema import (
    ALIASES,
    BASE_SECTIONS,
    HELP,
    OPTIONS,
    SECTIONS,
    SET_ASIDE,
    SHARED_SECTIONS,
    TASK_RESOLVERS,
    TASK_SECTIONS,
    TrainConfig,
    add_section,
    resolve_task,
    restore_shared,
    section_fields,
)
from .sections import HF_PREFIX, DataConfig, EvalConfig, ModelConfig, OptimConfig, RunConfig

__all__ = [
    "ALIASES",
    "BASE_SECTIONS",
    "CONFIG_FILE",
    "HELP",
    "HF_PREFIX",
    "NON_NEGATIVE",
    "OPTIONS",
    "POSITIVE",
    "SECTIONS",
    "SET_ASIDE",
    "SHARED_SECTIONS",
    "TASK_RESOLVERS",
    "TASK_SECTIONS",
    "UNIT",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "LaunchError",
    "ModelConfig",
    "OneLineParser",
    "OptimConfig",
    "Option",
    "RunConfig",
    "TrainConfig",
    "add_options",
    "add_section",
    "build_parser",
    "check_config",
    "check_options",
    "coerce",
    "first_line",
    "load_yaml",
    "option",
    "options_from",
    "parse_config",
    "read_config",
    "read_saved",
    "registration_kept",
    "resolve_task",
    "restore_shared",
    "save_config",
    "saved_options",
    "section_fields",
    "task_value",
    "with_defaults",
]
