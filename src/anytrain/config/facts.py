"""What an option is: `option()` makes a section field carrying all its facts (default, help, choices, bounds,
whether it may change on resume, whether model_parallel offers it, earlier names), `Option` reads them back; the
error types for bad input."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass


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
    repeatable=False,
):
    """A section field with its facts. bounds is an interval: '(0, inf)', '[0, 1)', '(0, 1]' ...
    aliases: earlier names of the option, still accepted as flags, YAML keys and keywords.
    required: a run of the task must be given it (flag, YAML or keyword); its default is only a placeholder of
    its type, and a run without it is refused in one line naming the flag and the task (tasks/settle.py).
    repeatable: a list option whose flag, repeated, adds to it (`--reward a --reward b`); another list option's
    last flag wins, as a scalar's does (a flag typed after a base command overrides it)."""
    facts = dict(
        help=help,
        choices=tuple(choices),
        bounds=bounds,
        resumable=resumable,
        model_parallel=model_parallel,
        flag=flag,
        aliases=tuple(aliases),
        required=required,
        repeatable=repeatable,
    )
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=facts)
    return dataclasses.field(default=default, metadata=facts)


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
    repeatable: bool = False  # a list option whose repeated flag adds to it

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")
