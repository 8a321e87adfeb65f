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
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import math
import typing
from dataclasses import dataclass
from pathlib import Path

import yaml

from .files import write_atomically


class ConfigError(ValueError):
    """Bad input from the user: reported as one line and exit code 2, before any training."""


class LaunchError(RuntimeError):
    """The processes did not form the group the launch asked for (scenario.py checks)."""


def first_line(e: BaseException) -> str:
    """An exception as one line ("Type: first line of its message"), for a ConfigError that names it."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")


POSITIVE, NON_NEGATIVE, UNIT = "(0, inf)", "[0, inf)", "[0, 1)"  # the usual bounds


def option(
    default,
    help: str,
    *,
    choices=(),
    bounds: str = "",
    resumable=False,
    model_parallel=False,
    flag="",
    aliases=(),
    required=False,
):
    """A section field with its facts. bounds is an interval: '(0, inf)', '[0, 1)', '(0, 1]' ...
    aliases: earlier names of the option, still accepted as flags, YAML keys and keywords.
    required: a run of the task must be given it (flag, YAML or keyword); its default is only a placeholder of
    its type, and a run without it is refused in one line naming the flag and the task (tasks/settle.py)."""
    facts = dict(
        help=help,
        choices=tuple(choices),
        bounds=bounds,
        resumable=resumable,
        model_parallel=model_parallel,
        flag=flag,
        aliases=tuple(aliases),
        required=required,
    )
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=facts)
    return dataclasses.field(default=default, metadata=facts)


@dataclass(frozen=True)
class DataConfig:
    task: str = option(
        "auto",
        "what to learn: a task of the registry (README 'Tasks'), or your own task class as FILE.py:Class, FILE.py "
        "(the one task class it defines) or module:Class; auto = the first task of the registry that recognises the "
        "data (the start-up line says which and why)",
    )
    dataset: str = option(
        "digits",
        "a bundled dataset (below), 'synthetic', a local parquet/csv/json/txt file, a folder of them or a "
        "save_to_disk folder, or a hub dataset name",
        model_parallel=True,
    )
    input_columns: list[str] = option(
        [],
        "feature columns (numbers or fixed-length lists of numbers); empty = every column but the label",
        model_parallel=True,
    )
    label_column: str = option(
        "label",
        "column holding the label: a class id or name (classify), a number (regress; several columns "
        "comma-separated), or a list of class ids or names (multilabel)",
        model_parallel=True,
    )
    num_classes: int = option(
        0, "number of classes; 0 = from the label feature or max label + 1", bounds=NON_NEGATIVE, model_parallel=True
    )
    val_fraction: float = option(
        0.1,
        "share of the data held out for validation when the dataset has no validation split",
        bounds=UNIT,
        model_parallel=True,
    )
    test_fraction: float = option(
        0.2, "share of the data held out for test when the dataset has no test split", bounds=UNIT, model_parallel=True
    )
    streaming: bool = option(
        False,
        "read the dataset as a stream (datasets' IterableDataset) instead of preparing it first: "
        "for datasets bigger than the disk. Needs --max-steps, a validation split in the dataset, and "
        "--num-classes unless the label is a ClassLabel; the main process reads, accelerate dispatches "
        "each rank its slice",
    )
    max_in_memory_mb: int = option(
        1024,
        "tables of numbers whose features (as float32) fit in this many MB are held as "
        "tensors, the fastest path; larger ones stay in memory-mapped Arrow files and are read per "
        "batch (0 = always Arrow). The summary's data_path says which",
        bounds=NON_NEGATIVE,
    )
    synthetic_samples: int = option(20000, "rows of the 'synthetic' dataset", bounds=POSITIVE, model_parallel=True)
    synthetic_features: int = option(64, "features of the 'synthetic' dataset", bounds=POSITIVE, model_parallel=True)
    synthetic_classes: int = option(10, "classes of the 'synthetic' dataset", bounds="[2, inf)", model_parallel=True)
    text_column: str = option(
        "",
        "the text column of a parquet/json/csv/hub dataset: with --label-column the text is classified, alone it "
        "is modelled (lm; for lm, with any model, empty = 'text')",
    )
    block_size: int = option(
        64, "lm: context length in tokens (each training window holds block_size + 1 tokens)", bounds=POSITIVE
    )
    image_size: int = option(
        0, "images: resize every image to N x N pixels; 0 = the first training image's larger side", bounds=NON_NEGATIVE
    )
    augment: list[str] = option(
        ["crop", "flip"],
        "images: training augmentations, any of crop (random crop after padding by "
        "image_size/8) and flip (horizontal); none given = no augmentation",
        choices=("crop", "flip"),
    )
    num_workers: int = option(
        -1,
        "DataLoader worker processes per training process (0 = load in the training process); -1 = "
        "auto: 0 for tables and text (a batch is one index operation); for images 1 where it gets a core "
        "of its own (beside a GPU, or more cores than training threads), else 0 (docs/benchmarks.md has "
        "the figures)",
        bounds="[-1, inf)",
        resumable=True,
    )
    pin_memory: bool = option(
        False, "pin host memory of batches (helps host-to-GPU copies)", resumable=True, model_parallel=True
    )
    persistent_workers: bool = option(
        False, "keep DataLoader workers alive between epochs (needs num_workers > 0)", resumable=True
    )
    tokenizer: str = option(
        "auto",
        "text: char (the training text's characters), byte (UTF-8 bytes, 256 tokens), bpe (byte-level BPE "
        "trained on the training split, --vocab-size tokens, saved as tokenizer.json) or auto: for lm char when "
        "the training alphabet has at most 256 characters and covers the validation text, else byte; to "
        "classify text bpe (at most --vocab-size tokens). --vocab is its earlier name",
        choices=("auto", "char", "byte", "bpe"),
        aliases=("vocab",),
    )
    vocab_size: int = option(
        2000, "--tokenizer bpe: tokens in the vocabulary (the 256 bytes plus learned merges)", bounds="[256, inf)"
    )
    max_length: int = option(
        256,
        "text classification: tokens kept of each text (longer ones are truncated); also the encoder's "
        "positions. Batches are padded to their longest text",
        bounds=POSITIVE,
    )
    packing: bool = option(
        False,
        "tasks that offer packing (transformers causal LMs): texts (chats) concatenated into rows of --max-length "
        "tokens, the attention and positions restarting at each text (no attention across texts); texts longer "
        "than a row are split instead of truncated",
    )


@dataclass(frozen=True)
class ModelConfig:
    """What a model factory receives, with the data's shape: `factory(model: ModelConfig, shape: DataShape)`."""

    name: str = option(
        "auto",
        "the model: mlp, cnn, resnet (classify; resnet needs images), encoder or bag (text classification) or "
        "gpt (lm) from the registry, or your own factory as package.module:function or path/to/file.py:function "
        "(README: 'Your own model and data'); auto = mlp for tables, resnet for images, bag for text to "
        "classify, gpt for text to model",
        model_parallel=True,
        flag="model",
    )
    hidden_sizes: list[int] = option([256, 256], "mlp, bag: hidden layer widths", bounds=POSITIVE, model_parallel=True)
    channels: list[int] = option(
        [16, 32],
        "cnn: conv channels (tabular inputs must form a square image); resnet: the width of each stage",
        bounds=POSITIVE,
        model_parallel=True,
    )
    blocks_per_stage: int = option(
        2, "resnet: residual blocks per stage (--channels 16 32 64 --blocks-per-stage 3 is ResNet-20)", bounds=POSITIVE
    )
    n_layer: int = option(4, "gpt, encoder: transformer blocks", bounds=POSITIVE)
    n_head: int = option(4, "gpt, encoder: attention heads per block (must divide n_embd)", bounds=POSITIVE)
    n_embd: int = option(128, "gpt, encoder, bag: embedding width", bounds=POSITIVE)
    ngrams: int = option(
        1,
        "bag: also average hashed n-grams of 2..N consecutive tokens (fastText-style; with --tokenizer char, "
        "character n-grams); 1 = tokens alone",
        bounds=POSITIVE,
    )
    ngram_buckets: int = option(
        65536, "bag with --ngrams > 1: hash buckets shared by the n-grams (extra embedding rows)", bounds=POSITIVE
    )
    dropout: float = option(
        0.2,
        "dropout after each hidden layer (gpt, encoder: on embeddings, attention and residuals)",
        bounds=UNIT,
        model_parallel=True,
    )
    gradient_checkpointing: bool = option(
        False,
        "transformers models (--model hf:...): recompute each block's activations in the backward pass instead "
        "of keeping them: less memory for about a third more compute, the same gradients",
        resumable=True,
    )
    lora_r: int = option(
        0,
        "tasks that offer LoRA (transformers causal LMs): train LoRA adapters of this rank (through peft) beside the "
        "frozen weights; 0 = full fine-tuning",
        bounds=NON_NEGATIVE,
    )
    lora_alpha: float = option(16.0, "LoRA: the adapters' output is scaled by alpha / r", bounds=POSITIVE)
    lora_dropout: float = option(0.0, "LoRA: dropout on the adapters' inputs", bounds=UNIT)
    lora_targets: str = option(
        "",
        "LoRA: the linear layers to adapt, by name, comma-separated (GPT-2: c_attn,c_proj,c_fc); empty = every "
        "linear projection of the blocks (attention and MLP), not the output layer",
    )


@dataclass(frozen=True)
class OptimConfig:
    epochs: int = option(40, "passes over the training split", bounds=POSITIVE, resumable=True, model_parallel=True)
    max_steps: int = option(
        0,
        "stop after this many optimizer steps; 0 = no limit",
        bounds=NON_NEGATIVE,
        resumable=True,
        model_parallel=True,
    )
    batch_size: int = option(
        32,
        "samples per process per forward pass (global batch = batch_size x processes x grad_accum_steps)",
        bounds=POSITIVE,
        model_parallel=True,
    )
    grad_accum_steps: int = option(1, "forward/backward passes per optimizer step", bounds=POSITIVE)
    optimizer: str = option("adamw", "adamw or sgd", choices=("adamw", "sgd"), model_parallel=True)
    lr: float = option(2e-3, "peak learning rate", bounds=POSITIVE, model_parallel=True)
    momentum: float = option(0.9, "SGD momentum", bounds=NON_NEGATIVE, model_parallel=True)
    adam_beta1: float = option(0.9, "AdamW beta1", bounds=UNIT)
    adam_beta2: float = option(0.999, "AdamW beta2", bounds=UNIT)
    weight_decay: float = option(
        0.1,
        "weight decay (decoupled for AdamW), applied to weight matrices and embeddings only, not to biases or norms",
        bounds=NON_NEGATIVE,
        model_parallel=True,
    )
    schedule: str = option(
        "cosine",
        "constant, step or cosine (all with linear warm-up), counted in optimizer steps",
        choices=("constant", "step", "cosine"),
        model_parallel=True,
    )
    min_lr: float = option(0.0, "cosine schedule: the learning rate it decays to at the last step", bounds=NON_NEGATIVE)
    warmup_steps: int = option(
        20, "optimizer steps of linear warm-up from 0 to lr", bounds=NON_NEGATIVE, model_parallel=True
    )
    step_size: int = option(
        100,
        "'step' schedule: multiply the lr by gamma every step_size optimizer steps",
        bounds=POSITIVE,
        model_parallel=True,
    )
    gamma: float = option(0.5, "'step' schedule: decay factor", bounds="(0, 1]", model_parallel=True)
    loss: str = option(
        "auto",
        "the training loss: auto = the task's (cross-entropy; MSE for regress; BCE for multilabel), huber "
        "(regress), or your own fn(outputs, targets) -> scalar as package.module:fn or path/to/file.py:fn. "
        "Metrics and early stopping use the task's loss",
    )
    max_grad_norm: float = option(
        1.0,
        "clip the gradient norm to this on each optimizer step; 0 = no clipping",
        bounds=NON_NEGATIVE,
        model_parallel=True,
    )


@dataclass(frozen=True)
class EvalConfig:
    eval_every_steps: int = option(
        0, "also validate every N optimizer steps; 0 = only at epoch ends", bounds=NON_NEGATIVE, resumable=True
    )
    eval_windows: int = option(
        0,
        "lm: validation windows per evaluation; 0 = every non-overlapping window of the validation text",
        bounds=NON_NEGATIVE,
    )
    early_stopping_patience: int = option(
        0,
        "stop after this many validations without improvement of the --best-metric; 0 = off",
        bounds=NON_NEGATIVE,
        resumable=True,
    )
    early_stopping_min_delta: float = option(
        0.0, "improvement of the --best-metric smaller than this does not count", bounds=NON_NEGATIVE, resumable=True
    )
    best_metric: str = option(
        "auto",
        "the validation metric that picks the best weights (--final-weights best, checkpoints/best) and that early "
        "stopping watches, higher or lower being better as the task declares: auto = the task's headline metric, "
        "or any metric the task logs on validation (loss, accuracy, ...)",
    )
    final_weights: str = option(
        "best",
        "the weights the run ends with, evaluates on the test split and saves as model.safetensors: best = those of "
        "the best validation by --best-metric (when there is a validation split), last = the last step's",
        choices=("best", "last"),
        resumable=True,
    )


@dataclass(frozen=True)
class RunConfig:
    seed: int = option(42, "seed for weights, shuffling and splits", model_parallel=True)
    output_dir: str = option("runs/default", "run folder: config, metrics, weights, summary", resumable=True)
    log_every_steps: int = option(
        10,
        "log the training loss (and, with several processes, check for SIGTERM/SIGINT) every N optimizer steps",
        bounds=POSITIVE,
        resumable=True,
    )
    checkpoint_every_steps: int = option(
        0, "also save a checkpoint every N optimizer steps; 0 = only at epoch ends", bounds=NON_NEGATIVE, resumable=True
    )
    keep_checkpoints: int = option(
        2,
        "keep the newest K checkpoints (plus the best by --best-metric); 0 = keep all",
        bounds=NON_NEGATIVE,
        resumable=True,
    )
    resume: str = option(
        "",
        "continue from a checkpoint: bare --resume = latest in --output-dir, or a checkpoint folder; "
        "'auto' = latest if --output-dir has one, else start fresh (for restarted or re-queued jobs)",
        resumable=True,
    )
    overwrite: bool = option(False, "replace an existing run in --output-dir (otherwise refused)", resumable=True)
    progress: bool = option(True, "show a tqdm progress bar (main process only)", resumable=True)
    plot: bool = option(
        True,
        "draw the run's curves to curves.png in the run folder at the end (needs matplotlib; skipped without it)",
        resumable=True,
    )
    report_to: str = option(
        "none",
        "also log the metrics to an experiment tracker through accelerate: none, tensorboard, "
        "trackio, wandb, mlflow or all (every installed one); metrics.jsonl is always written",
        choices=("none", "tensorboard", "trackio", "wandb", "mlflow", "all"),
        resumable=True,
    )
    run_name: str = option(
        "", "the run's name in the tracker (default: the --output-dir folder's name)", resumable=True
    )
    peak_tflops: float = option(
        0.0,
        "one device's peak TFLOP/s for the MFU in summary.json and the last line; 0 = a table of GPUs by name and "
        "precision, a CPU's measured by a short matrix product",
        bounds=NON_NEGATIVE,
        resumable=True,
    )
    ddp_bucket_mb: int = option(
        0,
        "several processes: gradients are all-reduced in buckets of this many MB while the backward "
        "pass goes on (DDP's bucket_cap_mb); the numbers do not change. 0 = auto: 5 on CPUs (gloo; "
        "1.33x the samples/s of 25 in docs/benchmarks.md), torch's 25 on GPUs",
        bounds=NON_NEGATIVE,
        resumable=True,
    )
    ddp_comm_hook: str = option(
        "none",
        "several processes: 'fp16' or 'bf16' rounds each gradient to 16 bits for the "
        "all-reduce (half the bytes; the weights then differ from a 1-process run by that rounding); "
        "'none' all-reduces in fp32. bf16 needs NCCL (GPUs)",
        choices=("none", "fp16", "bf16"),
    )
    collective_timeout: int = option(
        1800,
        "seconds a rank waits in a collective (gradient all-reduce, barrier) for the others "
        "before the job fails with an error: a hung or stopped rank; long enough for the main "
        "process to prepare a large dataset first",
        bounds=POSITIVE,
        resumable=True,
    )


BASE_SECTIONS = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "eval": EvalConfig, "run": RunConfig}
SECTIONS: dict[str, type] = dict(BASE_SECTIONS)  # + the sections of tasks that declare options (add_section)
TASK_SECTIONS: dict[str, str] = {}  # a --task value (a name, or FILE.py:Class) -> its own section
SHARED_SECTIONS: set[str] = set()  # the registry's task sections: in every config (own tasks' only in their runs)
SET_ASIDE: dict[str, tuple[int, type]] = {}  # registry sections (place, class) whose option names an own task took
TASK_RESOLVERS: list[typing.Callable[[str], None]] = []  # register the section of a --task value (tasks/ adds one)
HELP: dict[str, typing.Callable[[], str]] = {}  # option name -> more help, built where the facts live (the registry)


@dataclass(frozen=True)
class Option:
    """One option's facts, as the flags, the YAML loader and the checks read them."""

    name: str  # the flag without dashes: --n-layer -> n_layer; the model's name field -> model
    section: str
    field: str  # its field in the section
    kind: typing.Any  # int, float, str, bool or list[int] / list[str]
    default: typing.Any
    help: str
    choices: tuple
    bounds: str
    resumable: bool
    model_parallel: bool
    aliases: tuple
    required: bool = False  # the run must be given it: no usable default

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _options() -> dict[str, Option]:
    found = {}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            facts = dict(f.metadata)
            name = facts.pop("flag") or f.name
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            found[name] = Option(name, section, f.name, hints[f.name], default, **facts)
    return found


OPTIONS = _options()  # by option name, in section order
ALIASES = {alias: o.name for o in OPTIONS.values() for alias in o.aliases}  # an earlier name -> the option's name


def add_section(task: str, name: str, cls: type, shared: bool = False, at: int | None = None) -> None:
    """A task's own options (a frozen dataclass of option() fields) as section `name`: its flags, YAML section,
    checks and resume check come with it. `task` is the --task value that trains with it; `shared`: a registry
    task's, part of every config (else part of its own runs' only). An own task's option may share a registry
    task's name (grpo's --temperature, a distiller's --temperature): that registry section steps aside while the
    own task's runs are configured, and comes back for the next run of a registry task (restore_shared), `at`
    its place among the sections."""
    TASK_SECTIONS[task] = name
    if shared:
        SHARED_SECTIONS.add(name)
    if SECTIONS.get(name) is cls:
        return
    if name in BASE_SECTIONS or name in OPTIONS:
        raise ConfigError(f"--task {task}: its options section '{name}' is already an option or a section")
    yields = SHARED_SECTIONS - {name} if not shared else set(SECTIONS) - SHARED_SECTIONS - set(BASE_SECTIONS)
    for other in [o for o in yields if o in SECTIONS and _flags(SECTIONS[o]) & _flags(cls)]:
        place = list(SECTIONS).index(other)
        stepped_aside = SECTIONS.pop(other)
        if not shared:
            SET_ASIDE[other] = (place, stepped_aside)
    items = list(SECTIONS.items())
    items.insert(len(items) if at is None else at, (name, cls))
    SECTIONS.clear()
    SECTIONS.update(items)
    found = _options()
    clash = sorted(k for k, o in found.items() if o.section == name and k in OPTIONS and OPTIONS[k].section != name)
    clash = [k for k in clash if OPTIONS[k].section in SECTIONS]
    if clash:
        del SECTIONS[name]
        raise ConfigError(
            f"--task {task}: its option '{clash[0]}' is already an option of section {OPTIONS[clash[0]].section}"
        )
    OPTIONS.clear()
    OPTIONS.update(found)
    ALIASES.update({alias: o.name for o in OPTIONS.values() for alias in o.aliases})


def restore_shared() -> None:
    """The registry sections an own task's options set aside, back (a registry task's run is configured next)."""
    for name in sorted(SET_ASIDE, key=lambda n: SET_ASIDE[n][0]):
        task = next(t for t, section in TASK_SECTIONS.items() if section == name)
        place, cls = SET_ASIDE.pop(name)
        add_section(task, name, cls, shared=True, at=place)


def _flags(cls: type) -> set[str]:
    return {dict(f.metadata).get("flag") or f.name for f in dataclasses.fields(cls)}


def resolve_task(value: str) -> None:
    """Register the options of the task a --task value names (an own task's file is imported for them)."""
    for resolve in TASK_RESOLVERS:
        resolve(value)


class TrainConfig:
    """All options, by section: `cfg.optim.lr`, `cfg.model.name`. Made from options by their flag
    names (`TrainConfig(lr=1e-3, model="gpt")`) and/or whole sections (`TrainConfig(optim={...})`).
    Frozen once made: a changed option (a settled --task, tasks/settle.py) is a new config, `replace()`.
    `given` names the options that were set rather than left at their defaults."""

    data: DataConfig
    model: ModelConfig
    optim: OptimConfig
    eval: EvalConfig
    run: RunConfig
    given: frozenset[str]

    def __init__(self, _given: frozenset[str] | None = None, **values):
        data = values.get("data")
        task = values.get("task", data.get("task") if isinstance(data, dict) else getattr(data, "task", None))
        resolve_task(task if isinstance(task, str) else "auto")  # an own task's options are known before they are read
        sections: dict[str, dict] = {name: {} for name in SECTIONS}
        given: set[str] = set()
        for key, value in values.items():
            key = ALIASES.get(key, key)
            if key in SECTIONS and not (key == "model" and isinstance(value, str)):
                fields = (
                    dataclasses.asdict(value)
                    if dataclasses.is_dataclass(value) and not isinstance(value, type)
                    else value
                )
                sections[key].update(fields)
                given.update(section_fields(key)[f] for f in fields if f in section_fields(key))
            elif key in OPTIONS:
                sections[OPTIONS[key].section][OPTIONS[key].field] = value
                given.add(key)
            else:
                raise ConfigError(f"config: unknown option '{key}'")
        for name, cls in SECTIONS.items():
            object.__setattr__(self, name, cls(**sections[name]))
        object.__setattr__(self, "given", frozenset(given if _given is None else _given))

    def __setattr__(self, name, value):
        raise AttributeError(f"TrainConfig is frozen: use cfg.replace({name}=...) for a changed config")

    def get(self, name: str):
        """An option's value by its option name ('lr', 'model')."""
        o = OPTIONS[name]
        return getattr(getattr(self, o.section), o.field)

    def flat(self) -> dict:
        """{option name: value}, in section order: what flags and the resume check compare. The five sections,
        the registry's task sections, and your own task's section in its own runs only: another own task
        registered in the same process is not part of this config."""
        own = TASK_SECTIONS.get(self.data.task)
        kept = {*BASE_SECTIONS, *SHARED_SECTIONS, own}
        return {name: self.get(name) for name, o in OPTIONS.items() if o.section in kept}

    def section(self, name: str):
        """A section by name: a task's own options, `cfg.section("distill").temperature`."""
        return getattr(self, name)

    def to_dict(self) -> dict:
        """The sectioned form, as config.yaml holds it: the five sections, and the options of the run's task."""
        own = TASK_SECTIONS.get(self.data.task)
        return {name: dataclasses.asdict(getattr(self, name)) for name in (*BASE_SECTIONS, *([own] if own else []))}

    def replace(self, **options) -> TrainConfig:
        """A new config with these options changed; the options given stay given."""
        return TrainConfig(_given=self.given | {ALIASES.get(k, k) for k in options}, **{**self.flat(), **options})

    def __eq__(self, other) -> bool:
        return isinstance(other, TrainConfig) and self.flat() == other.flat()

    def __repr__(self) -> str:
        return f"TrainConfig({', '.join(f'{k}={v!r}' for k, v in self.flat().items())})"


# --------------------------------------------------------------------------- flags


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (naming the flag) and exit code 2, like every other bad input."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


def add_options(parser: argparse.ArgumentParser, options, defaults: bool) -> None:
    """A flag per option, grouped by section. defaults=False leaves untyped flags out of the result
    (so a YAML file's values stand unless a flag is typed)."""
    groups = {name: parser.add_argument_group(f"{name} options") for name in SECTIONS}
    for o in options:
        more = HELP[o.name]() if o.name in HELP else ""
        kwargs: dict = {"help": f"{o.help}{more} " + ("(required)" if o.required else f"(default: {o.default})")}
        if defaults:
            kwargs["default"] = o.default
        if o.name == "resume":
            kwargs.update(nargs="?", const="latest", metavar="CHECKPOINT")
        elif o.kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(o.kind) is list:
            kwargs.update(nargs="*", type=typing.get_args(o.kind)[0], metavar=o.name.upper())
        else:
            kwargs["type"] = o.kind
            if o.choices:
                kwargs["choices"] = o.choices
        aliases = ["--" + alias.replace("_", "-") for alias in o.aliases]
        groups[o.section].add_argument(o.flag, *aliases, dest=o.name, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="train.py",
        description="Train a classifier or a language model with one plain PyTorch loop; the hardware comes from "
        "`accelerate launch`. `anytrain sample RUN_DIR` prints text from a trained language model.",
        # Defaults are applied after the YAML file, so flags only override what the user typed.
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--config",
        help="YAML file with any of the options below, flat or in sections (data:, model:, "
        "optim:, eval:, run:); flags override it",
    )
    add_options(parser, OPTIONS.values(), defaults=False)
    return parser


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """defaults <- YAML file (--config) <- flags; raises ConfigError on any bad input."""
    resolve_task(task_value(argv))  # an own task's options become flags before they are read
    args = vars(build_parser().parse_args(argv))
    values = load_yaml(args.pop("config")) if "config" in args else {}
    values.update(args)
    return check_config(TrainConfig(**values))


# --------------------------------------------------------------------------- YAML and dicts


def task_value(argv: list[str] | None) -> str:
    """The --task a command line asks for (the flag, else its --config file's), before the flags are parsed."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--task", default="")
    pre.add_argument("--config", default="")
    known = pre.parse_known_args(argv)[0]
    if known.task or not known.config or not Path(known.config).is_file():
        return known.task
    try:
        data = yaml.safe_load(Path(known.config).read_text()) or {}
    except yaml.YAMLError:
        return ""  # load_yaml says so
    inner = data.get("data") if isinstance(data, dict) else None
    return str((inner if isinstance(inner, dict) else data if isinstance(data, dict) else {}).get("task", ""))


def load_yaml(path: str) -> dict:
    """{option name: value} from a YAML file, sectioned or flat."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config: file not found: {path}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"--config: {path} is not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config: {path} must hold a mapping of option: value")
    return options_from(data, path)


def options_from(data: dict, source: str) -> dict:
    """Sectioned ({'optim': {'lr': ...}}) or flat ({'lr': ...}) values -> {option name: checked value}.
    `model` is the model section when it holds a mapping, the --model option when it holds a name."""
    flat: dict = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        name = ALIASES.get(name, name)
        if name in SECTIONS and isinstance(value, dict):
            fields = section_fields(name)
            for inner, inner_value in value.items():
                inner_name = str(inner).replace("-", "_")
                if inner_name not in fields:
                    raise ConfigError(f"{source}: unknown option '{inner}' in section '{name}'")
                flat[fields[inner_name]] = inner_value
        elif name in OPTIONS:
            flat[name] = value
        else:
            raise ConfigError(f"{source}: unknown option '{key}'")
    return {name: coerce(name, value, source) for name, value in flat.items()}


def coerce(name: str, value, source: str):
    """Check a value against the option's type and choices; ints are accepted where floats are expected."""
    o = OPTIONS[name]
    where = f"{source}: option '{name}'"
    if typing.get_origin(o.kind) is list:
        item = typing.get_args(o.kind)[0]
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            value = [value] if not isinstance(value, str) else [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list of {item.__name__}, got {value!r}")
        return [_coerce_scalar(item, v, where) for v in value]
    value = _coerce_scalar(o.kind, value, where)
    if o.choices and value not in o.choices:
        raise ConfigError(f"{where} must be one of {', '.join(o.choices)}, got {value!r}")
    return value


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


def saved_options(saved: dict) -> dict:
    """{option name: value} of a config stored with a run (config.yaml, a checkpoint, the weights'
    metadata): sectioned, or flat from runs saved before sections; unknown options are left out."""
    known = {}
    inner = saved.get("data")
    section = inner if isinstance(inner, dict) else saved
    if isinstance(section.get("task"), str):
        resolve_task(section["task"])  # its own section; a moved file is said where the task is needed
    for key, value in saved.items():
        key = ALIASES.get(key, key)
        if key in SECTIONS and isinstance(value, dict):
            fields = section_fields(key)
            known.update({fields[k]: v for k, v in value.items() if k in fields})
            known.update({k: v for k, v in value.items() if k not in fields and k in OPTIONS})  # moved since
        elif key in OPTIONS:
            known[key] = value
    return known


def with_defaults(options: dict) -> dict:
    """saved_options' answer with each option it does not name at its default: the run was made before the option
    existed, or the option is in another task's section, which config.yaml leaves out."""
    return {**{name: o.default for name, o in OPTIONS.items()}, **options}


def section_fields(section: str) -> dict:
    """{field name or an alias of it: option name} of one section."""
    fields = {o.field: o.name for o in OPTIONS.values() if o.section == section}
    return {**{alias: name for alias, name in ALIASES.items() if OPTIONS[name].section == section}, **fields}


CONFIG_FILE = "config.yaml"  # a run folder's config: written at its start, as the run settled it


def save_config(cfg: TrainConfig, path: Path) -> None:
    write_atomically(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def read_saved(path: Path) -> dict:
    """A saved config.yaml's mapping, sectioned as save_config wrote it; ConfigError naming the file."""
    try:
        saved = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: not a readable config ({first_line(e)})") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: not a config (a mapping of sections)")
    return saved


def read_config(run_dir: str | Path) -> TrainConfig:
    """The config a run was trained with (`anytrain.read_config(run_dir)`): its config.yaml, the task settled,
    options it did not save at their defaults. Reading it never displaces the options of a run being configured in
    this process (a distiller reading its teacher's run)."""
    path = Path(run_dir)
    path = path / CONFIG_FILE if path.is_dir() else path
    if not path.is_file():
        raise ConfigError(f"run_dir: no {CONFIG_FILE} in {run_dir} (an anytrain run folder is needed)")
    saved = read_saved(path)
    with registration_kept():
        return TrainConfig(**saved_options(saved))


@contextlib.contextmanager
def registration_kept():
    """Sections registered in the block stay; a section the block displaced (reading a registry task's run brings
    back the registry sections an own task had set aside, and sets that task's aside) puts everything back."""
    state = (SECTIONS, OPTIONS, ALIASES, TASK_SECTIONS, SET_ASIDE, SHARED_SECTIONS)
    kept = [copy.copy(part) for part in state]
    try:
        yield
    finally:
        if not kept[0].keys() <= SECTIONS.keys():
            for now, before in zip(state, kept):
                now.clear()
                now.update(before)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- checks


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
    for o in OPTIONS.values():
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
    if optim.loss not in ("auto", "mse", "huber") and ":" not in optim.loss:
        raise ConfigError(f"--loss: unknown loss '{optim.loss}' (choose auto, mse, huber, or your own as module:fn)")
    if data.persistent_workers and data.num_workers == 0:
        raise ConfigError("--persistent-workers needs --num-workers > 0")
    if model.gradient_checkpointing and not model.name.startswith("hf:"):
        raise ConfigError("--gradient-checkpointing recomputes the blocks of transformers models (--model hf:...) only")
    if data.packing and not model.name.startswith("hf:"):
        raise ConfigError("--packing packs texts for transformers causal LMs (--model hf:...) only")
    if model.lora_r and not model.name.startswith("hf:"):
        raise ConfigError("--lora-r: LoRA adapts transformers models (--model hf:...) only")
    if model.name == "cnn" and not model.channels:
        raise ConfigError("--channels must name at least one conv layer for the cnn model")
    return cfg
