"""The task a run trains, settled once, before anything is written: --task when given (a name of the
registry, or your own FILE.py:Class), else the first registry line whose task recognises the data (its
`detect`, over a description of the source read once). The result is a new config (the task, and a bundled
set's columns, filled in), the registry line that trains it, and why, which the start-up line and
summary.json say. What the settled task rules out is refused here, from what the task declares."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import OPTIONS, ConfigError, TrainConfig
from ..data.bundled import LABELLED_TEXT
from ..data.describe import Source
from ..data.sources import shared_openings
from ..data.splits import Splits
from . import HF, classes, is_own, line_class, make_task, names, own_spec, own_task
from .contract import ASKED_BY, CAPABILITIES, Task, offered, refusal


@dataclass(frozen=True)
class Settled:
    cfg: TrainConfig  # the config with the task settled
    key: str  # its registry line (tasks/__init__.py), or FILE.py:Class
    reason: str  # why this task
    notes: tuple[str, ...] = ()  # defaults fitted to the model, said at start


def settle(cfg: TrainConfig, given=None) -> Settled:
    """The task for this config and data (`given`: a datasets object passed to anytrain.train)."""
    if cfg.model.name.startswith(HF):
        from ..hf import transformers

        transformers()  # not installed: one line naming the extra, before any data is read
    if is_own(cfg.data.task):
        spec = own_spec(cfg.data.task)  # FILE.py alone: FILE.py:Class, as config.yaml and the weights name it
        cls = own_task(spec)
        cfg = cfg if spec == cfg.data.task else cfg.replace(task=spec)
        return checked(cfg, spec, cls, f"--task {spec}", ())
    cfg = bundled_columns(cfg)
    source = Source(cfg, given)
    cfg, named = named_label(cfg, source)
    source.cfg = cfg
    name, reason = chosen_task(cfg, source)
    if name != cfg.data.task:
        cfg = cfg.replace(task=name)
    key = line_for(cfg, name, source)
    cls = line_class(key)
    cfg, notes = cls.settle(cfg)
    if cfg.model.gradient_checkpointing:
        notes += ("gradient checkpointing: each block's activations are recomputed in the backward pass",)
    return checked(cfg, key, cls, reason, named + notes)


def checked(cfg: TrainConfig, key: str, cls: type[Task], reason: str, notes: tuple[str, ...]) -> Settled:
    check_required(cfg, cls)
    check_offered(cfg, cls)
    check_model(cfg, cls)
    cls.check_settled(cfg, reason)
    return Settled(best_metric(cfg, cls), key, reason, notes)


def chosen_task(cfg: TrainConfig, source: Source) -> tuple[str, str]:
    """(task name, why): --task when given, else the first registry line whose task recognises the data."""
    if cfg.data.task != "auto":
        if cfg.data.task not in names():
            raise ConfigError(f"--task: unknown task '{cfg.data.task}' (choose auto, {', '.join(sorted(names()))})")
        return cfg.data.task, f"--task {cfg.data.task}"
    for cls in classes().values():
        why = cls.detect(source)
        if why is not None:
            return cls.name, why
    raise ConfigError("--task: no task of the registry recognises this data; name one with --task")


def line_for(cfg: TrainConfig, name: str, source: Source) -> str:
    """The registry line of a task for this model family (a transformers model, or not) and data."""
    family = cfg.model.name.startswith(HF)
    lines = [key for key, cls in classes().items() if cls.name == name and key.startswith(HF) == family]
    for key in lines:
        if line_class(key).reads(source):
            return key
    if family:
        hf_tasks = sorted({cls.name for key, cls in classes().items() if key.startswith(HF)})
        raise ConfigError(f"--model {cfg.model.name}: transformers models train --task {', '.join(hf_tasks)} here")
    raise ConfigError(f"--task {name} trains a transformers model: --model hf:FOLDER_OR_ID")


def best_metric(cfg: TrainConfig, task: type[Task]) -> TrainConfig:
    """--best-metric auto -> the task's headline metric; any other name must be one the task logs."""
    name = cfg.eval.best_metric
    if name == "auto":
        return cfg.replace(best_metric=task.headline)
    if name not in task.goals:
        raise ConfigError(f"--best-metric: --task {task.name} logs {', '.join(task.goals)} on validation, not '{name}'")
    return cfg


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


def named_label(cfg: TrainConfig, source: Source) -> tuple[TrainConfig, tuple[str, ...]]:
    """--label-column left at 'label' on a table that has no such column but one of the other usual names
    (scikit-learn's frames say 'target'): that column, said at start. For the tasks that read labels
    (Task.labelled) only."""
    if "label_column" in cfg.given or not source.readable:
        return cfg, ()
    if cfg.data.task == "auto":
        if any(not cls.labelled and cls.detect(source) for cls in classes().values()):
            return cfg, ()  # a task without labels claims the data (text to model, prompts, pairs)
    elif not any(cls.name == cfg.data.task and cls.labelled for cls in classes().values()):
        return cfg, ()
    columns = source.train.column_names
    found = [name for name in LABEL_NAMES if name in columns]
    if not found or found[0] == cfg.data.label_column:
        return cfg, ()
    note = f"--label-column {found[0]}: the table has no '{cfg.data.label_column}' column"
    return cfg.replace(label_column=found[0]), (note,)


def check_required(cfg: TrainConfig, task: type[Task]) -> None:
    """The task's own options declared required (option(..., required=True)) were given, and not left empty."""
    for o in OPTIONS.values():
        if o.required and o.section == task.name and (o.name not in cfg.given or cfg.get(o.name) in ("", [])):
            raise ConfigError(f"{o.flag} is required by --task {cfg.data.task}")


def check_offered(cfg: TrainConfig, task: type[Task]) -> None:
    """An option that needs a capability the task does not declare: one line, naming the tasks that do."""
    for capability, option in ASKED_BY.items():
        if cfg.get(option) and not offered(task, capability):
            those = [cls.name for cls in classes().values() if offered(cls, capability)]
            flag = OPTIONS[option].flag
            raise ConfigError(refusal(task, capability, flag) + f" (tasks that do: {', '.join(dict.fromkeys(those))})")
    check_loss(cfg, task)


def check_loss(cfg: TrainConfig, task: type[Task]) -> None:
    """--loss by name: one that a task of the registry declares (Task.losses), and the settled task's."""
    loss = cfg.optim.loss
    if loss == "auto" or ":" in loss:
        return
    owners = {name: cls.name for cls in classes().values() for name in cls.losses}
    if loss not in owners:
        raise ConfigError(f"--loss: unknown loss '{loss}' (choose auto, {', '.join(owners)}, or your own as module:fn)")
    if loss not in task.losses:
        said = (
            f"--task {task.name} has its own (--loss auto)"
            if "task" in cfg.given
            else f"this data is a {task.name} task"
        )
        raise ConfigError(f"--loss {loss} is a loss of --task {owners[loss]}; {said}")


def check_model(cfg: TrainConfig, task: type[Task]) -> None:
    """A model of the registry that does not fit the task (the task says which do)."""
    from ..models import REGISTRY as MODELS

    name = cfg.model.name
    fitting, what = task.fits(cfg)
    if ":" in name or name == "auto" or fitting is None or name in fitting:
        return
    if name in MODELS:
        raise ConfigError(f"--model {name} does not fit {what} (choose {' or '.join(fitting)})")
    raise ConfigError(
        f"--model: unknown model '{name}' (choose {', '.join(MODELS)}, or give your own as module:factory or "
        "file.py:factory)"
    )


def load(cfg: TrainConfig, given=None, run=None) -> tuple[Settled, Task, Splits]:
    """The task settled, then its data loaded: (settled, task, data). The trainer calls this with the
    main process first (it prepares and caches the dataset) and where the run is (`run`: contract.RunFacts),
    model_parallel and your code directly. The dataset is opened once: the task's data loading gets the one the
    settling looked at (shared_openings)."""
    with shared_openings():
        settled = settle(cfg, given)
        task = make_task(settled.cfg, settled.key, run)
        return settled, task, task.load_data(given)


__all__ = ["CAPABILITIES", "Settled", "load", "settle"]
