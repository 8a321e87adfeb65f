"""grpo's --environment: TRL's environment_factory contract. A class whose instance is one completion's world: made
new for each completion (never shared between completions, rollouts or processes), `reset(**row)` with the prompt's
row (every column, the prompt too; a text it returns is added to the last user message), its public methods (not
`reset`, not `get_reward`, no leading underscore) the completion's tools beside --tools, and, where it has one,
`get_reward()` a reward function named after the class with weight 1, scoring the completion from the instance's
state after the conversation. Reward functions get the instances as `environments` (one per completion), as TRL's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ...config import ConfigError, first_line
from ..causal_lm.tools import schema_of
from .rewards import Reward

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


def environment_reward(cls: type) -> Reward | None:
    """get_reward() of each completion's instance, as a reward function (TRL: named after the class, weight 1)."""
    if not callable(getattr(cls, "get_reward", None)):
        return None

    def get_reward(environments, **columns) -> list:
        return [environment.get_reward() for environment in environments]

    return Reward(cls.__name__, get_reward, 1.0)
