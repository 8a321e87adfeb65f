"""The checks of a made config: what each option's facts say (finite, bounds, choices), then the rules between
options. The task's checks are in tasks/settle.py, the data's in data/."""

from __future__ import annotations

import math

from .facts import NON_NEGATIVE, POSITIVE, ConfigError, Option
from .schema import OPTIONS, TrainConfig, option_of
from .sections import HF_PREFIX


def _outside(value: float, bounds: str) -> bool:
    low, high = (float(v) for v in bounds[1:-1].split(","))
    below = value < low if bounds[0] == "[" else value <= low
    above = value > high if bounds[-1] == "]" else value >= high
    return below or above


def _bounds_message(o: Option, value) -> str:
    if o.bounds == POSITIVE:
        return f"{o.flag} must be positive, got {value}"
    if o.bounds == NON_NEGATIVE:
        return f"{o.flag} must not be negative, got {value}"
    return f"{o.flag} must be in {o.bounds}, got {value}"


def check_options(cfg: TrainConfig) -> None:
    """What every option's facts say: finite numbers, bounds, choices."""
    for name in OPTIONS:
        o = option_of(name, cfg.data.task)  # a name registry tasks share: the run's task's facts
        value = cfg.get(o.name)
        values = value if isinstance(value, list) else [value]
        if o.kind is float and not math.isfinite(value):
            raise ConfigError(f"{o.flag} must be a finite number, got {value}")
        if o.bounds and any(_outside(v, o.bounds) for v in values):
            if isinstance(value, list):
                raise ConfigError(f"{o.flag} must hold positive sizes, got {value}")
            raise ConfigError(_bounds_message(o, value))
        bad = [v for v in values if o.choices and v not in o.choices]
        if bad and isinstance(value, list):
            raise ConfigError(f"{o.flag}: unknown value '{bad[0]}' (choose from {', '.join(o.choices)})")
        if bad:
            raise ConfigError(f"{o.flag} must be one of {', '.join(o.choices)}, got {value!r}")


def check_config(cfg: TrainConfig) -> TrainConfig:
    """The options' own facts, then the rules between options; the task's checks are in tasks/settle.py and
    the data's in data/."""
    check_options(cfg)
    data, model, optim, run = cfg.data, cfg.model, cfg.optim, cfg.run
    if optim.min_lr > optim.lr:
        raise ConfigError(f"--min-lr ({optim.min_lr}) must not exceed --lr ({optim.lr})")
    if model.n_embd % model.n_head:
        raise ConfigError(f"--n-head ({model.n_head}) must divide --n-embd ({model.n_embd})")
    if data.val_fraction + data.test_fraction >= 1:
        raise ConfigError("--val-fraction plus --test-fraction must leave some training data")
    if run.resume and run.overwrite:
        raise ConfigError("--resume and --overwrite contradict each other: choose one")
    if data.streaming and not optim.max_steps:
        raise ConfigError("--streaming needs --max-steps: a stream has no length to size the learning-rate schedule by")
    if data.persistent_workers and data.num_workers == 0:
        raise ConfigError("--persistent-workers needs --num-workers > 0")
    if model.gradient_checkpointing and not model.name.startswith(HF_PREFIX):
        raise ConfigError("--gradient-checkpointing recomputes the blocks of transformers models (--model hf:...) only")
    if data.packing and not model.name.startswith(HF_PREFIX):
        raise ConfigError("--packing packs texts for transformers causal LMs (--model hf:...) only")
    if model.lora_r and not model.name.startswith(HF_PREFIX):
        raise ConfigError("--lora-r: LoRA adapts transformers models (--model hf:...) only")
    if model.name == "cnn" and not model.channels:
        raise ConfigError("--channels must name at least one conv layer for the cnn model")
    return cfg
