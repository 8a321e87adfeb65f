"""The task a run trains, settled once, before anything is written: from the options where they say
(--task, --model gpt, text without labels), else from the training labels. The result is a new config
(the task, and a bundled set's columns, filled in), the registry line that trains it, and why, which
the start-up line and summary.json say. Checks that depend on the task happen here too."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ConfigError, TrainConfig
from ..data.bundled import LABELLED_TEXT
from ..data.sources import is_text_dataset
from ..data.splits import Splits
from . import REGISTRY, Task


@dataclass(frozen=True)
class Settled:
    cfg: TrainConfig  # the config with the task settled
    key: str  # its registry line (tasks/__init__.py)
    reason: str  # why this task
    notes: tuple[str, ...] = ()  # defaults fitted to the model, said at start


def settle(cfg: TrainConfig, given=None) -> Settled:
    """The task for this config and data (`given`: a datasets object passed to anytrain.train)."""
    if cfg.model.name.startswith("hf:"):
        from ..hf import transformers

        transformers()  # not installed: one line naming the extra, before any data is read
    cfg = bundled_columns(cfg)
    cfg, named = named_label(cfg, given)
    task, reason = chosen_task(cfg, given)
    if task != cfg.data.task:
        cfg = cfg.replace(task=task)
    key = f"hf:{task}" if cfg.model.name.startswith("hf:") else task
    if f"{key}-images" in REGISTRY and holds_images(cfg, given):  # a transformers vision model, for one
        key = f"{key}-images"
    cfg, notes = fitted_defaults(cfg, key)
    if cfg.model.gradient_checkpointing:
        notes += ("gradient checkpointing: each block's activations are recomputed in the backward pass",)
    check_fits(cfg, key, reason)
    return Settled(best_metric(cfg, key), key, reason, named + notes)


def best_metric(cfg: TrainConfig, key: str) -> TrainConfig:
    """--best-metric auto -> the task's headline metric; any other name must be one the task logs."""
    task = REGISTRY[key]
    name = cfg.eval.best_metric
    if name == "auto":
        return cfg.replace(best_metric=task.headline)
    if name not in task.goals:
        raise ConfigError(f"--best-metric: --task {task.name} logs {', '.join(task.goals)} on validation, not '{name}'")
    return cfg


def fitted_defaults(cfg: TrainConfig, key: str) -> tuple[TrainConfig, tuple[str, ...]]:
    """Options the user left at their defaults, fitted to the model: a transformers model's --max-length to
    its positions (a model with 128 positions trains on 128 tokens rather than being refused)."""
    if not key.startswith("hf:") or "max_length" in cfg.given or key.endswith("-images"):
        return cfg, ()
    from .. import hf

    positions = hf.max_positions(hf.read_config(hf.check_folder(cfg)))
    if positions is None or positions >= cfg.data.max_length:
        return cfg, ()
    note = (
        f"--max-length {positions}: the positions of {cfg.model.name} (the default {cfg.data.max_length} exceeds them)"
    )
    return cfg.replace(max_length=positions), (note,)


def bundled_columns(cfg: TrainConfig) -> TrainConfig:
    """A bundled labelled text set (shakespeare-speakers) names its own text and label columns."""
    if cfg.data.dataset not in LABELLED_TEXT:
        return cfg
    text, label = LABELLED_TEXT[cfg.data.dataset]
    changes = {} if cfg.data.text_column else {"text_column": text}
    if "label_column" not in cfg.given:
        changes["label_column"] = label
    return cfg.replace(**changes) if changes else cfg


LABEL_NAMES = ("label", "labels", "target", "targets", "y")  # what tables usually call their label column


def named_label(cfg: TrainConfig, given=None) -> tuple[TrainConfig, tuple[str, ...]]:
    """--label-column left at 'label' on a table that has no such column but one of the other usual names
    (scikit-learn's frames say 'target'): that column, said at start."""
    from ..data.sources import ImageFolder, opened

    if "label_column" in cfg.given or cfg.data.task not in ("auto", "classify", "regress", "multilabel"):
        return cfg, ()
    if cfg.data.streaming or (task_from_options(cfg) or ("",))[0] == "lm":
        return cfg, ()
    if given is None and (cfg.data.dataset == "synthetic" or ImageFolder.scan(cfg.data.dataset) is not None):
        return cfg, ()
    columns = opened(cfg, given)[0]["train"].column_names
    found = [name for name in LABEL_NAMES if name in columns]
    if not found or found[0] == cfg.data.label_column:
        return cfg, ()
    note = f"--label-column {found[0]}: the table has no '{cfg.data.label_column}' column"
    return cfg.replace(label_column=found[0]), (note,)


def chosen_task(cfg: TrainConfig, given=None) -> tuple[str, str]:
    """(task, why): what the options say (task_from_options), else what the training labels say."""
    said = task_from_options(cfg)
    if said is not None:
        return said
    chats = chat_columns(cfg, given)
    if chats is not None:
        return "sft", f"auto: {chats}"
    labels = training_labels(cfg, given)
    if labels is None:
        return "classify", "auto"
    from ..data.targets import task_from_labels

    return task_from_labels(labels, cfg.data.label_column)


def task_from_options(cfg: TrainConfig) -> tuple[str, str] | None:
    """(task, why) as far as the options tell: --task when given; lm for --model gpt and for text without
    labels (the bundled shakespeare, .txt files, --text-column without --label-column); None when the
    data is labelled, so its labels decide."""
    if cfg.data.task != "auto":
        return cfg.data.task, f"--task {cfg.data.task}"
    if cfg.model.name == "gpt":
        return "lm", "auto: --model gpt models text"
    labelled = "label_column" in cfg.given
    if is_text_dataset(cfg.data.dataset, cfg.data.text_column) and not (cfg.data.text_column and labelled):
        return "lm", "auto: text without labels"
    return None


def chat_columns(cfg: TrainConfig, given=None) -> str | None:
    """What makes the data chats (TRL's columns: messages, or prompt and completion), or None."""
    from ..data.chats import MESSAGES, chat_format
    from ..data.sources import ImageFolder, opened

    if cfg.data.streaming or (
        given is None and (cfg.data.dataset == "synthetic" or ImageFolder.scan(cfg.data.dataset))
    ):
        return None
    train = opened(cfg, given)[0]["train"]
    form = chat_format(train.column_names, train.features, cfg.data.text_column)
    if form == MESSAGES:
        return f"a '{cfg.data.text_column or MESSAGES}' column of messages"
    return None if form is None else "prompt and completion columns"


def holds_images(cfg: TrainConfig, given=None) -> bool:
    """An image folder, or a dataset whose training split has an Image column."""
    from ..data.images import image_column
    from ..data.sources import ImageFolder, opened

    if given is None and ImageFolder.scan(cfg.data.dataset) is not None:
        return True
    return not cfg.data.text_column and image_column(opened(cfg, given)[0]["train"], cfg) is not None


def training_labels(cfg: TrainConfig, given=None):
    """The training split's labels as data/targets.py reads them; None where classification is the only
    choice (streams, images, generated data) or the label column is missing (the loader names it)."""
    from ..data.sources import ImageFolder, opened
    from ..data.targets import label_columns, labels_of

    if cfg.data.streaming or (given is None and cfg.data.dataset == "synthetic"):
        return None
    if given is None and ImageFolder.scan(cfg.data.dataset) is not None:
        return None
    train = opened(cfg, given)[0]["train"]
    if any(c not in train.column_names for c in label_columns(cfg)):
        return None
    return labels_of(train, cfg)


def check_fits(cfg: TrainConfig, key: str, reason: str = "") -> None:
    """What the settled task rules out: a model that does not fit it, a loss for another task, text for
    regress or multilabel, a stream of anything but classification data."""
    from ..models import FITS, LABELLED

    data, model, task = cfg.data, cfg.model, cfg.data.task
    known = sorted({cls.name for cls in REGISTRY.values()})
    if task not in known:
        raise ConfigError(f"--task: unknown task '{task}' (choose auto, {', '.join(known)})")
    if key not in REGISTRY:
        hf_tasks = sorted({cls.name for key, cls in REGISTRY.items() if key.startswith("hf:")})
        if model.name.startswith("hf:"):
            raise ConfigError(f"--model {model.name}: transformers models train --task {', '.join(hf_tasks)} here")
        raise ConfigError(f"--task {task} trains a transformers model: --model hf:FOLDER_OR_ID")
    if data.packing and key not in ("hf:lm", "hf:sft"):
        raise ConfigError(f"--packing packs texts for causal language models (--task lm or sft), not --task {task}")
    if model.lora_r and key not in ("hf:lm", "hf:sft"):
        raise ConfigError(f"--lora-r: LoRA adapts causal language models here (--task lm or sft), not --task {task}")
    if cfg.optim.loss in ("mse", "huber") and task != "regress":
        said = f"--task {task} has its own (--loss auto)" if "task" in cfg.given else f"this data is a {task} task"
        raise ConfigError(f"--loss {cfg.optim.loss} is a regression loss; {said}")
    if task == "multilabel" and data.text_column and reason.startswith("auto"):
        raise ConfigError(
            f"--label-column: '{data.label_column}' holds lists (several labels a row); text (--text-column) is "
            "classified one label a text here: give one label per row, or use a table of numbers for multi-label"
        )
    if task in ("regress", "multilabel") and data.text_column:
        raise ConfigError(
            f"--task {task} learns from tables of numbers; text (--text-column) is classified (--task classify) "
            "or modelled (--task lm)"
        )
    if data.streaming and (task != "classify" or data.text_column):
        raise ConfigError(
            "--streaming reads classification data (tables of numbers or images); text is tokenised first instead "
            "(into memory, or memory-mapped files for language models)"
        )
    learns = "classify text" if task == "classify" and data.text_column else task
    if ":" in model.name or model.name in (*FITS.get(learns, ()), "auto"):
        return
    registry_models = (*LABELLED, "encoder", "bag", "gpt")
    if model.name in registry_models:
        fits = {"classify text": "--task classify with --text-column"}.get(learns, f"--task {learns}")
        raise ConfigError(f"--model {model.name} does not fit {fits} (choose {' or '.join(FITS[learns])})")
    raise ConfigError(
        f"--model: unknown model '{model.name}' (choose {', '.join(registry_models)}, or give your own as "
        "module:factory or file.py:factory)"
    )


def load(cfg: TrainConfig, given=None) -> tuple[Settled, Task, Splits]:
    """The task settled, then its data loaded: (settled, task, data). The trainer calls this with the
    main process first (it prepares and caches the dataset), model_parallel and your code directly."""
    from . import make_task

    settled = settle(cfg, given)
    task = make_task(settled.cfg, settled.key)
    return settled, task, task.load_data(given)
