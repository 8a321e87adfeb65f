"""anytrain from Python: `anytrain.train(config, model=..., dataset=...)` runs the same loop as
`accelerate launch src/train.py`, with objects allowed where the command line takes names.

    import anytrain
    summary = anytrain.train("my.yaml", model=MyNet(), dataset=my_dataset_dict, epochs=5)

In a plain Python process (a notebook) it trains on one device; under `accelerate launch` a
script calling it trains on every process of the launch, as the command line does.
"""

from __future__ import annotations

from pathlib import Path

from .config import ConfigError, TrainConfig, check_config, load_yaml, options_from, resolve_task
from .usermodel import OBJECT


def make_config(config=None, model=None, dataset=None, loss_fn=None, **options) -> TrainConfig:
    """TrainConfig from a TrainConfig, a dict (flat or in sections) or a YAML file, then keyword
    options; checked like flags. `task` may be a task class: it is named by its file (FILE.py:Class)."""
    given = None  # the options in values
    if "task" in options:
        options["task"] = task_spec(options["task"])
        resolve_task(options["task"])  # an own task's options are known before they are read
    if isinstance(config, TrainConfig):
        values, given = config.flat(), config.given
    elif isinstance(config, (str, Path)):
        values = load_yaml(str(config))
    elif isinstance(config, dict) or config is None:
        values = options_from(dict(config or {}), "config")
    else:
        raise ConfigError(f"config: expected a TrainConfig, a dict or a YAML file path, got {type(config).__name__}")
    options = options_from(options, "config")
    values.update(options)
    if model is not None:  # a name or factory path is recorded as given; an object by its type's name
        values["model"] = (
            model if isinstance(model, str) else OBJECT + getattr(model, "__qualname__", type(model).__qualname__)
        )
    if loss_fn is not None:  # recorded by name; the function itself is passed on
        values["loss"] = OBJECT + getattr(loss_fn, "__qualname__", type(loss_fn).__qualname__)
    if dataset is not None:
        values["dataset"] = dataset if isinstance(dataset, str) else f"<{type(dataset).__name__} object>"
    if given is not None:  # a TrainConfig's given options, and what was passed here
        given = given | set(options) | {k for k, v in (("model", model), ("loss", loss_fn), ("dataset", dataset)) if v}
    return check_config(TrainConfig(_given=given, **values))


def task_spec(task) -> str:
    """--task's value for `task=`: a name or spec as it is, a task class as FILE.py:Class (so that predict finds
    it again), the class itself used for this run."""
    if isinstance(task, str):
        return task
    import inspect

    from .tasks import OWN_CLASSES

    if not isinstance(task, type) or "<locals>" in task.__qualname__:
        raise ConfigError(f"task: expected a task name, FILE.py:Class or a module-level task class, got {task!r}")
    try:
        spec = f"{inspect.getfile(task)}:{task.__qualname__}"
    except (TypeError, OSError):  # defined in a notebook: by its module, if that imports
        spec = f"{task.__module__}:{task.__qualname__}"
    OWN_CLASSES[spec] = task
    return spec


def train(config=None, *, model=None, dataset=None, loss_fn=None, **options) -> dict:
    """Train and return the run's summary (the contents of summary.json).

    config: a TrainConfig, a dict of options (flat or in sections) or a YAML file; keyword options override it.
    model: a registry name or "module:factory" string, an nn.Module, or a factory(model, shape) -> nn.Module
        (model: the config's model section, config.ModelConfig; shape: anytrain.DataShape).
    dataset: a name or path as --dataset takes, or a datasets.Dataset / DatasetDict.
    loss_fn: your training loss, fn(outputs, targets) -> scalar tensor (as --loss module:fn).
    task: a task name, "FILE.py:Class" / "module:Class", or your task class (anytrain.Task).
    Bad input raises anytrain.config.ConfigError (a ValueError) with the same one-line message the
    command line prints.
    """
    from accelerate.state import AcceleratorState

    from .trainer import Given
    from .trainer import train as run

    cfg = make_config(config, model, dataset, loss_fn, **options)
    objects = {
        "model": None if isinstance(model, str) else model,
        "dataset": None if isinstance(dataset, str) else dataset,
    }
    given = Given(**objects, loss_fn=loss_fn)
    try:
        return run(cfg, given)
    finally:
        AcceleratorState._reset_state(
            True
        )  # accelerate allows one Accelerator per process state: let a notebook train again
