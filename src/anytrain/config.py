"""The run's configuration: one dataclass, filled from defaults, an optional YAML file, then flags.

Hardware (devices, number of processes, mixed precision) is deliberately NOT here: it comes from
the accelerate config the run is launched with, so the same options train anywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml


class ConfigError(ValueError):
    """Bad input from the user: reported as one line and exit code 2, before any training."""


class LaunchError(RuntimeError):
    """The processes did not form the group the launch asked for (scenario.py checks)."""


def first_line(e: BaseException) -> str:
    """An exception as one line ("Type: first line of its message"), for a ConfigError that names it."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")


@dataclass
class TrainConfig:
    # --- data ---
    task: str = field(default="auto", metadata={"help": "classify or lm (next-token language modelling); auto = lm for text data (shakespeare, .txt, --text-column) or --model gpt, else classify"})
    dataset: str = field(default="digits", metadata={"help": "'digits' (bundled UCI digits), 'shakespeare' (bundled Tiny Shakespeare), 'synthetic', a local parquet/csv/json/txt file, a folder of them or a save_to_disk folder, or a hub dataset name"})
    input_columns: list[str] = field(default_factory=list, metadata={"help": "feature columns (numbers or fixed-length lists of numbers); empty = every column but the label"})
    label_column: str = field(default="label", metadata={"help": "column holding the integer (or string) class label"})
    num_classes: int = field(default=0, metadata={"help": "number of classes; 0 = from the label feature or max label + 1"})
    val_fraction: float = field(default=0.1, metadata={"help": "share of the data held out for validation when the dataset has no validation split"})
    test_fraction: float = field(default=0.2, metadata={"help": "share of the data held out for test when the dataset has no test split"})
    streaming: bool = field(default=False, metadata={"help": "read the dataset as a stream (datasets' IterableDataset) instead of preparing it first: for datasets bigger than the disk. Needs --max-steps, a validation split in the dataset, and --num-classes unless the label is a ClassLabel; the main process reads, accelerate dispatches each rank its slice"})
    max_in_memory_mb: int = field(default=1024, metadata={"help": "tables of numbers whose features (as float32) fit in this many MB are held as tensors, the fastest path; larger ones stay in memory-mapped Arrow files and are read per batch (0 = always Arrow). The summary's data_path says which"})
    synthetic_samples: int = field(default=20000, metadata={"help": "rows of the 'synthetic' dataset"})
    synthetic_features: int = field(default=64, metadata={"help": "features of the 'synthetic' dataset"})
    synthetic_classes: int = field(default=10, metadata={"help": "classes of the 'synthetic' dataset"})
    text_column: str = field(default="", metadata={"help": "lm: column holding the text of a parquet/json/csv/hub dataset (empty = 'text')"})
    vocab: str = field(default="auto", metadata={"help": "lm: char (the training text's characters), byte (UTF-8 bytes, 256 tokens) or auto (char when the training alphabet has at most 256 characters and covers the validation text)"})
    block_size: int = field(default=64, metadata={"help": "lm: context length in tokens (each training window holds block_size + 1 tokens)"})
    image_size: int = field(default=0, metadata={"help": "images: resize every image to N x N pixels; 0 = the first training image's larger side"})
    augment: list[str] = field(default_factory=lambda: ["crop", "flip"], metadata={"help": "images: training augmentations, any of crop (random crop after padding by image_size/8) and flip (horizontal); none given = no augmentation"})
    eval_windows: int = field(default=0, metadata={"help": "lm: validation windows per evaluation; 0 = every non-overlapping window of the validation text"})
    # --- model ---
    model: str = field(default="auto", metadata={"help": "the model: mlp, cnn, resnet (classify; resnet needs images) or gpt (lm) from the registry, or your own factory as package.module:function or path/to/file.py:function (README: 'Your own model and data'); auto = mlp for tables, resnet for images, gpt for text"})
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256], metadata={"help": "MLP hidden layer widths"})
    channels: list[int] = field(default_factory=lambda: [16, 32], metadata={"help": "cnn: conv channels (tabular inputs must form a square image); resnet: the width of each stage"})
    blocks_per_stage: int = field(default=2, metadata={"help": "resnet: residual blocks per stage (--channels 16 32 64 --blocks-per-stage 3 is ResNet-20)"})
    n_layer: int = field(default=4, metadata={"help": "gpt: transformer blocks"})
    n_head: int = field(default=4, metadata={"help": "gpt: attention heads per block (must divide n_embd)"})
    n_embd: int = field(default=128, metadata={"help": "gpt: embedding width"})
    dropout: float = field(default=0.2, metadata={"help": "dropout after each hidden layer (gpt: on embeddings, attention and residuals)"})
    # --- optimisation ---
    epochs: int = field(default=40, metadata={"help": "passes over the training split"})
    max_steps: int = field(default=0, metadata={"help": "stop after this many optimizer steps; 0 = no limit"})
    batch_size: int = field(default=32, metadata={"help": "samples per process per forward pass (global batch = batch_size x processes x grad_accum_steps)"})
    optimizer: str = field(default="adamw", metadata={"help": "adamw or sgd"})
    lr: float = field(default=2e-3, metadata={"help": "peak learning rate"})
    momentum: float = field(default=0.9, metadata={"help": "SGD momentum"})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2"})
    weight_decay: float = field(default=0.1, metadata={"help": "weight decay (decoupled for AdamW), applied to weight matrices and embeddings only, not to biases or norms"})
    schedule: str = field(default="cosine", metadata={"help": "constant, step or cosine (all with linear warm-up), counted in optimizer steps"})
    min_lr: float = field(default=0.0, metadata={"help": "cosine schedule: the learning rate it decays to at the last step"})
    warmup_steps: int = field(default=20, metadata={"help": "optimizer steps of linear warm-up from 0 to lr"})
    step_size: int = field(default=100, metadata={"help": "'step' schedule: multiply the lr by gamma every step_size optimizer steps"})
    gamma: float = field(default=0.5, metadata={"help": "'step' schedule: decay factor"})
    grad_accum_steps: int = field(default=1, metadata={"help": "forward/backward passes per optimizer step"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "clip the gradient norm to this on each optimizer step; 0 = no clipping"})
    # --- evaluation and stopping ---
    eval_every_steps: int = field(default=0, metadata={"help": "also validate every N optimizer steps; 0 = only at epoch ends"})
    early_stopping_patience: int = field(default=0, metadata={"help": "stop after this many validations without improvement of the validation loss; 0 = off"})
    early_stopping_min_delta: float = field(default=0.0, metadata={"help": "improvement smaller than this does not count"})
    # --- data loading ---
    num_workers: int = field(default=-1, metadata={"help": "DataLoader worker processes per training process (0 = load in the training process); -1 = auto: 0 for tables and text (a batch is one index operation); for images 1 where it gets a core of its own (beside a GPU, or more cores than training threads), else 0 (docs/benchmarks.md has the figures)"})
    pin_memory: bool = field(default=False, metadata={"help": "pin host memory of batches (helps host-to-GPU copies)"})
    persistent_workers: bool = field(default=False, metadata={"help": "keep DataLoader workers alive between epochs (needs num_workers > 0)"})
    # --- run ---
    seed: int = field(default=42, metadata={"help": "seed for weights, shuffling and splits"})
    output_dir: str = field(default="runs/default", metadata={"help": "run folder: config, metrics, weights, summary"})
    log_every_steps: int = field(default=10, metadata={"help": "log the training loss (and, with several processes, check for SIGTERM/SIGINT) every N optimizer steps"})
    checkpoint_every_steps: int = field(default=0, metadata={"help": "also save a checkpoint every N optimizer steps; 0 = only at epoch ends"})
    keep_checkpoints: int = field(default=2, metadata={"help": "keep the newest K checkpoints (plus the best by validation loss); 0 = keep all"})
    resume: str = field(default="", metadata={"help": "continue from a checkpoint: bare --resume = latest in --output-dir, or a checkpoint folder; 'auto' = latest if --output-dir has one, else start fresh (for restarted or re-queued jobs)"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing run in --output-dir (otherwise refused)"})
    progress: bool = field(default=True, metadata={"help": "show a tqdm progress bar (main process only)"})
    plot: bool = field(default=True, metadata={"help": "draw the run's curves to curves.png in the run folder at the end (needs matplotlib; skipped without it)"})
    report_to: str = field(default="none", metadata={"help": "also log the metrics to an experiment tracker through accelerate: none, tensorboard, trackio, wandb, mlflow or all (every installed one); metrics.jsonl is always written"})
    run_name: str = field(default="", metadata={"help": "the run's name in the tracker (default: the --output-dir folder's name)"})
    ddp_bucket_mb: int = field(default=0, metadata={"help": "several processes: gradients are all-reduced in buckets of this many MB while the backward pass goes on (DDP's bucket_cap_mb); the numbers do not change. 0 = auto: 5 on CPUs (gloo; 1.33x the samples/s of 25 in docs/benchmarks.md), torch's 25 on GPUs"})
    ddp_comm_hook: str = field(default="none", metadata={"help": "several processes: 'fp16' or 'bf16' rounds each gradient to 16 bits for the all-reduce (half the bytes; the weights then differ from a 1-process run by that rounding); 'none' all-reduces in fp32. bf16 needs NCCL (GPUs)"})
    collective_timeout: int = field(default=1800, metadata={"help": "seconds a rank waits in a collective (gradient all-reduce, barrier) for the others before the job fails with an error: a hung or stopped rank; long enough for the main process to prepare a large dataset first"})

    def __post_init__(self):
        # "auto" is settled here, once, so config.yaml and checkpoints hold what really ran.
        if self.task == "auto":
            self.task = "lm" if self.model == "gpt" or is_text_dataset(self.dataset, self.text_column) else "classify"
        if self.model == "auto" and self.task == "lm":  # a classifier's auto is settled by the data: mlp for tables, resnet for images
            self.model = "gpt"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


TEXT_SUFFIXES = (".txt",)


def is_text_dataset(dataset: str, text_column: str) -> bool:
    """Plain text to model: the bundled Shakespeare, a .txt file, a folder holding .txt files, or a named text column."""
    if dataset == "shakespeare" or text_column or dataset.lower().endswith(TEXT_SUFFIXES):
        return True
    path = Path(dataset).expanduser()
    return path.is_dir() and any(p.suffix.lower() in TEXT_SUFFIXES for p in path.rglob("*") if p.is_file())


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_TYPES = typing.get_type_hints(TrainConfig)
REGISTRY_MODELS = {"classify": ("mlp", "cnn", "resnet"), "lm": ("gpt",)}  # models.REGISTRY, by task
AUGMENTATIONS = ("crop", "flip")
CHOICES = {
    "task": ("auto", "classify", "lm"),
    "vocab": ("auto", "char", "byte"),
    "report_to": ("none", "tensorboard", "trackio", "wandb", "mlflow", "all"),
    "optimizer": ("adamw", "sgd"),
    "schedule": ("constant", "step", "cosine"),
    "ddp_comm_hook": ("none", "fp16", "bf16"),
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (naming the flag) and exit code 2, like every other bad input."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


OneLineParser = _OneLineParser  # for the other commands (sample, predict, plot)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="train.py",
        description="Train a classifier or a language model with one plain PyTorch loop; the hardware comes from `accelerate launch`. `anytrain sample RUN_DIR` prints text from a trained language model.",
        formatter_class=argparse.HelpFormatter,
        # Defaults are applied after the YAML file, so flags only override what the user typed.
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--config", help="YAML file with any of the options below; flags override it", default=argparse.SUPPRESS)
    for name, f in FIELDS.items():
        kind = _TYPES[name]
        kwargs: dict = {"help": f.metadata.get("help", "") + f" (default: {_default(f)})"}
        if name == "resume":
            kwargs.update(nargs="?", const="latest", metavar="CHECKPOINT")
        elif kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is list:
            kwargs.update(nargs="*", type=typing.get_args(kind)[0], metavar=name.upper())
        else:
            kwargs["type"] = kind
            if name in CHOICES:
                kwargs["choices"] = CHOICES[name]
        parser.add_argument(_flag(name), dest=name, **kwargs)
    return parser


def _coerce(name: str, value, source: str):
    """Check a YAML value against the field's type; ints are accepted where floats are expected."""
    kind = _TYPES[name]
    where = f"{source}: option '{name}'"
    if typing.get_origin(kind) is list:
        item = typing.get_args(kind)[0]
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            value = [value] if not isinstance(value, str) else [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list of {item.__name__}, got {value!r}")
        return [_coerce_scalar(item, v, where) for v in value]
    return _coerce_scalar(kind, value, where)


def _coerce_scalar(kind, value, where: str):
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    raise ConfigError(f"{where} must be {kind.__name__}, got {value!r}")


def load_yaml(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config: file not found: {path}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"--config: {path} is not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config: {path} must hold a mapping of option: value")
    values = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in FIELDS:
            raise ConfigError(f"--config: unknown option '{key}' in {path}")
        values[name] = _coerce(name, value, path)
        if name in CHOICES and values[name] not in CHOICES[name]:
            raise ConfigError(f"{path}: option '{name}' must be one of {', '.join(CHOICES[name])}, got {value!r}")
    return values


def validate(cfg: TrainConfig) -> TrainConfig:
    """Range checks that need no data; data-dependent checks happen in data.py."""
    for name, kind in _TYPES.items():
        if kind is float and not math.isfinite(getattr(cfg, name)):
            raise ConfigError(f"{_flag(name)} must be a finite number, got {getattr(cfg, name)}")
    positive = ["collective_timeout", "epochs", "batch_size", "grad_accum_steps", "log_every_steps", "synthetic_samples", "synthetic_features", "step_size", "block_size", "n_layer", "n_head", "n_embd", "blocks_per_stage"]
    non_negative = ["ddp_bucket_mb", "max_in_memory_mb", "image_size", "checkpoint_every_steps", "keep_checkpoints", "max_steps", "warmup_steps", "eval_every_steps", "early_stopping_patience", "num_classes", "max_grad_norm", "weight_decay", "momentum", "dropout", "early_stopping_min_delta", "eval_windows", "min_lr"]
    for name in positive:
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{_flag(name)} must be positive, got {getattr(cfg, name)}")
    for name in non_negative:
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{_flag(name)} must not be negative, got {getattr(cfg, name)}")
    if not cfg.lr > 0:
        raise ConfigError(f"--lr must be positive, got {cfg.lr}")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(cfg, name) < 1:
            raise ConfigError(f"{_flag(name)} must be in [0, 1), got {getattr(cfg, name)}")
    if cfg.min_lr > cfg.lr:
        raise ConfigError(f"--min-lr ({cfg.min_lr}) must not exceed --lr ({cfg.lr})")
    if cfg.n_embd % cfg.n_head:
        raise ConfigError(f"--n-head ({cfg.n_head}) must divide --n-embd ({cfg.n_embd})")
    models = REGISTRY_MODELS[cfg.task]
    if ":" not in cfg.model and cfg.model not in (*models, "auto"):
        known = sum(REGISTRY_MODELS.values(), ())
        if cfg.model in known:
            raise ConfigError(f"--model {cfg.model} does not fit --task {cfg.task} (choose {' or '.join(models)})")
        raise ConfigError(f"--model: unknown model '{cfg.model}' (choose {', '.join(known)}, or give your own as module:factory or file.py:factory)")
    for name in cfg.augment:
        if name not in AUGMENTATIONS:
            raise ConfigError(f"--augment: unknown augmentation '{name}' (choose from {', '.join(AUGMENTATIONS)})")
    if cfg.synthetic_classes < 2:
        raise ConfigError(f"--synthetic-classes must be at least 2, got {cfg.synthetic_classes}")
    if not 0 < cfg.gamma <= 1:
        raise ConfigError(f"--gamma must be in (0, 1], got {cfg.gamma}")
    if cfg.dropout >= 1:
        raise ConfigError(f"--dropout must be below 1, got {cfg.dropout}")
    for name in ("val_fraction", "test_fraction"):
        if not 0 <= getattr(cfg, name) < 1:
            raise ConfigError(f"{_flag(name)} must be in [0, 1), got {getattr(cfg, name)}")
    if cfg.val_fraction + cfg.test_fraction >= 1:
        raise ConfigError("--val-fraction plus --test-fraction must leave some training data")
    if cfg.resume and cfg.overwrite:
        raise ConfigError("--resume and --overwrite contradict each other: choose one")
    if cfg.streaming and not cfg.max_steps:
        raise ConfigError("--streaming needs --max-steps: a stream has no length to size the learning-rate schedule by")
    if cfg.streaming and cfg.task != "classify":
        raise ConfigError("--streaming reads classification data (tables of numbers or images); language-model text is tokenised into memory-mapped files instead")
    if cfg.num_workers < -1:
        raise ConfigError(f"--num-workers must be -1 (auto) or a count, got {cfg.num_workers}")
    if cfg.persistent_workers and cfg.num_workers == 0:
        raise ConfigError("--persistent-workers needs --num-workers > 0")
    for name in ("hidden_sizes", "channels"):
        if any(v <= 0 for v in getattr(cfg, name)):
            raise ConfigError(f"{_flag(name)} must hold positive sizes, got {getattr(cfg, name)}")
    if cfg.model == "cnn" and not cfg.channels:
        raise ConfigError("--channels must name at least one conv layer for the cnn model")
    return cfg


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """defaults <- YAML file (--config) <- flags; raises ConfigError on any bad input."""
    args = vars(build_parser().parse_args(argv))
    values = load_yaml(args.pop("config")) if "config" in args else {}
    values.update(args)
    return validate(TrainConfig(**values))


def is_main_rank() -> bool:
    """Before the Accelerator exists: only rank 0 prints errors, so a 2-rank launch says it once."""
    return int(os.environ.get("RANK", "0")) == 0


def exit_on_config_error(err: ConfigError) -> typing.NoReturn:
    if is_main_rank():
        print(f"train.py: error: {err}", file=sys.stderr)
    else:
        # The other ranks hit the same error. The launcher kills every rank once one exits, so a
        # rank that got there first would cut the main rank off before it says why: let it speak.
        time.sleep(3)
    sys.exit(2)


def save_config(cfg: TrainConfig, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    os.replace(tmp, path)  # whole or absent
