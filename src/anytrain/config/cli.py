"""The command line: a flag per option, grouped by section, over a YAML file's values (--config); a bad flag is one
line and exit code 2. `--help` shows the common sections and the own section of the --task given (the flag, or the
--config file's); without one, a line per task section says how to see it."""

from __future__ import annotations

import argparse
import typing
from collections.abc import Collection
from pathlib import Path

import yaml

from .checks import check_config
from .facts import ConfigError
from .saved import load_yaml
from .schema import HELP, OPTIONS, SECTIONS, TASK_SECTIONS, TrainConfig, option_of, resolve_task


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (naming the flag) and exit code 2, like every other bad input."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


class KeptLinesFormatter(argparse.HelpFormatter):
    """argparse's help, but a text's own line breaks stay (each line wrapped alone): one line per task section."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        fill = super()._fill_text  # a bare super() does not reach into the generator below
        return "\n".join(fill(line, width, indent) for line in text.splitlines())


def add_options(parser: argparse.ArgumentParser, options, defaults: bool, shown: Collection[str] | None = None) -> None:
    """A flag per option, grouped by section. defaults=False leaves untyped flags out of the result
    (so a YAML file's values stand unless a flag is typed). `shown`: the sections --help shows (None: all); the
    others' flags are still flags, left out of --help."""
    groups = {name: parser.add_argument_group(f"{name} options") for name in SECTIONS if shown is None or name in shown}
    for o in options:
        more = HELP[o.name]() if o.name in HELP else ""
        kwargs: dict = {"help": f"{o.help}{more} " + ("(required)" if o.required else f"(default: {o.default})")}
        if o.section not in groups:
            kwargs["help"] = argparse.SUPPRESS
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
        groups.get(o.section, parser).add_argument(o.flag, *aliases, dest=o.name, **kwargs)


def task_sections() -> dict[str, str]:
    """{section: the --task value that trains with it} of the tasks' own sections in the config now (the registry's,
    and an own task's once its --task is resolved), in section order."""
    tasks: dict[str, str] = {}
    for value, section in TASK_SECTIONS.items():
        tasks.setdefault(section, value)
    return {name: tasks[name] for name in SECTIONS if name in tasks}


def help_sections(task: str | None) -> list[str]:
    """The sections --help shows for a --task value: all of them (None), else the common ones (every section that
    is not a task's own) and the own section of that task, if it has one."""
    if task is None:
        return list(SECTIONS)
    own, tasks = TASK_SECTIONS.get(task), task_sections()
    return [name for name in SECTIONS if name not in tasks or name == own]


def task_pointers(prog: str = "python src/train.py") -> str:
    """One line per task section: how to see its options (--help without a --task shows the common ones only)."""
    return "\n".join(f"{name}'s own options: {prog} --task {task} --help" for name, task in task_sections().items())


def build_parser(task: str | None = None) -> argparse.ArgumentParser:
    """The flags of every option. --help shows `task`'s (a --task value): the common sections and its own section;
    no task ('' or auto): the common sections and how to see each task's; None: every section."""
    parser = OneLineParser(
        prog="train.py",
        usage="%(prog)s [-h] [--config CONFIG] [--task TASK] [options]",
        description="Train a classifier or a language model with one plain PyTorch loop; the hardware comes from "
        "`accelerate launch`. `anytrain sample RUN_DIR` prints text from a trained language model.",
        formatter_class=KeptLinesFormatter,
        # Defaults are applied after the YAML file, so flags only override what the user typed.
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--config",
        help="YAML file with any of the options below, flat or in sections (data:, model:, "
        "optim:, eval:, run:); flags override it",
    )
    options = [option_of(name, task) for name in OPTIONS]  # a name tasks share: the task's section's
    add_options(parser, options, defaults=False, shown=help_sections(task))
    if task in ("", "auto") and task_sections():
        parser.add_argument_group("tasks' own options, shown with their --task", task_pointers())
    return parser


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """defaults <- YAML file (--config) <- flags; raises ConfigError on any bad input."""
    task = task_value(argv)
    resolve_task(task)  # an own task's options become flags before they are read
    args = vars(build_parser(task).parse_args(argv))
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
