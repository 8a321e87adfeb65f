"""--environment: TRL's environment_factory contract. A class whose instance is one completion's world: made new for
each completion (never shared between completions, rollouts or processes), `reset(**row)` with the prompt's row
(every column, the prompt too; a text it returns is added to the last user message), its public methods (not
`reset`, not `get_reward`, no leading underscore) the completion's tools beside --tools. grpo also scores with its
`get_reward()` (grpo/rewards.py: environment_reward) and gives its reward functions the instances as `environments`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ...config import ConfigError, first_line
from .tools import schema_of

HOOKS = ("reset", "get_reward")


def load_environment(spec: str) -> type:
    """The class, checked: it can be made without arguments, it has reset, its methods are tools."""
    from ...usermodel import import_attr

    if ":" not in spec:
        raise ConfigError(f"--environment {spec}: expected FILE.py:Class or module:Class")
    cls = import_attr(spec, "--environment")
    if not inspect.isclass(cls):
        raise ConfigError(f"--environment {spec}: {spec.rpartition(':')[2]} is not a class")
    if not callable(getattr(cls, "reset", None)):
        raise ConfigError(
            f"--environment {spec}: {cls.__name__} has no reset method (TRL's environment_factory contract: "
            "reset(**row) starts a completion's environment)"
        )
    instance = made(cls, spec)
    for method in methods(instance):
        schema_of(method, f"--environment {spec}")
    return cls


def made(cls: type, spec: str):
    try:
        return cls()
    except Exception as e:  # noqa: BLE001 - the user's class: one line
        raise ConfigError(f"--environment {spec}: {cls.__name__}() raised {first_line(e)}") from None


def methods(instance) -> list[Callable]:
    """The instance's tools: its class's public functions but reset and get_reward, bound to it."""
    found = inspect.getmembers(type(instance), predicate=inspect.isfunction)
    return [getattr(instance, name) for name, _ in found if name not in HOOKS and not name.startswith("_")]
