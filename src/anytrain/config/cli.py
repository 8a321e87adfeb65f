"""The command line: a flag per option, grouped by section, over a YAML file's values (--config); a bad flag is one
line and exit code 2."""

from __future__ import annotations

import argparse
import typing
from pathlib import Path

import yaml

from .checks import check_config
from .facts import ConfigError
from .saved import load_yaml
from .schema import HELP, OPTIONS, SECTIONS, TrainConfig, resolve_task


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
            if o.repeatable:
                kwargs["action"] = "extend"
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
