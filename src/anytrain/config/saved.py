"""Options as values (a YAML file, a dict, anytrain.train's keywords) and as a run saved them (config.yaml, a
checkpoint, the weights' metadata, runs saved before sections): read, checked against each option's type, written."""

from __future__ import annotations

import contextlib
import typing
from pathlib import Path

import yaml

from ..files import write_atomically
from .facts import ConfigError, first_line
from .schema import (
    ALIASES,
    ALSO,
    OPTIONS,
    SECTIONS,
    SET_ASIDE,
    SHARED_SECTIONS,
    TASK_SECTIONS,
    TrainConfig,
    resolve_task,
    section_fields,
)


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
    tables: list[dict] = [SECTIONS, OPTIONS, ALSO, ALIASES, TASK_SECTIONS, SET_ASIDE]
    kept, shared = [dict(table) for table in tables], set(SHARED_SECTIONS)
    try:
        yield
    finally:
        if not kept[0].keys() <= SECTIONS.keys():
            for table, before in zip(tables, kept):
                table.clear()
                table.update(before)
            SHARED_SECTIONS.clear()
            SHARED_SECTIONS.update(shared)


# --------------------------------------------------------------------------- checks
