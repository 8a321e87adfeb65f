"""grpo's reward functions (--reward, --reward-weights): plain callables with TRL's signature,

    fn(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, **columns)
        -> list[float | bool | None]

one value per completion, so a TRL reward function runs unchanged. Each prompt's row appears once per completion:
`prompts` as given (text, or a chat), `completions` as text (for chat prompts a one-message chat,
[{"role": "assistant", "content": ...}], as TRL gives them), `completion_ids` the token ids, and every other column of
the dataset by its name. As TRL also gives: `trainer_state` (global_step: optimizer steps done, epoch: epochs done as
a fraction, max_steps, num_train_epochs; our `TrainerState`), `log_metric(name, value)` (a number, averaged over each
rollout's calls on every process, then over the rollouts of a log window: a figure of the training log line and
metrics.jsonl under its own name) and `log_extra(column, values)` (one value per completion: a column of the run's
completions table, tasks/grpo/completions.py). In evaluation they are given too, and what is logged is dropped.

A value is a number (a bool counts as 1.0 or 0.0) or None: this function does not score that completion. A
completion's reward is the weighted sum of the values of the functions that scored it; one that no function scored
is unscorable (its reward NaN, as TRL): it counts in no mean nor standard deviation, and its advantage is 0
(tasks/grpo/loss.py). Built-ins for the common cases: `answer`, `format:REGEX`, `length:N` (tasks/grpo/options.py
says what each scores). A function that raises, returns the wrong number of values, a non-number or NaN, logs a
metric under a name the log line has, or a column without one value per completion or under a name the table has,
stops the run in one line naming the function (and the row).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ...config import ConfigError, first_line
from ...usermodel import import_attr
from ..causal_lm.completions import text_of
from ..causal_lm.tools import resolved


@dataclass(frozen=True)
class Reward:
    name: str  # what the log calls it: the function's name, or the built-in's
    fn: Callable
    weight: float


@dataclass(frozen=True)
class TrainerState:
    """What a reward function gets as `trainer_state`: the fields of transformers' TrainerState
    (transformers/trainer_callback.py) that shape a reward over training, with their meanings there."""

    global_step: int  # optimizer steps done when the completions were sampled
    epoch: float  # epochs done, with the fraction of the current one
    max_steps: int  # the run's optimizer steps
    num_train_epochs: int


@dataclass
class RewardCall:
    """What one scoring gives the reward functions beyond the data (`given`: trainer_state, log_metric, log_extra),
    and what they logged through it: each metric's values, each extra column's values (the last call's). `figures`
    and `columns`: the names the log line and the completions table have already, which a metric or a column may
    not take."""

    state: TrainerState
    figures: frozenset[str] = frozenset()
    columns: frozenset[str] = frozenset()
    metrics: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, list] = field(default_factory=dict)

    def given(self) -> dict:
        return {"trainer_state": self.state, "log_metric": self.log_metric, "log_extra": self.log_extra}

    def log_metric(self, name: str, value) -> None:
        if str(name) in self.figures:
            raise ValueError(f"log_metric({name!r}): the training log line has its own {name!r}; choose another name")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"log_metric({name!r}): {value!r} is not a number") from None
        self.metrics.setdefault(str(name), []).append(number)

    def log_extra(self, column: str, values) -> None:
        if str(column) in self.columns:
            raise ValueError(
                f"log_extra({column!r}): the completions table has its own {column!r}; choose another name"
            )
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            raise TypeError(
                f"log_extra({column!r}): {type(values).__name__} is not a list of values, one per completion"
            )
        self.extra[str(column)] = list(values)

    def check(self, scorer: Reward, n: int) -> None:
        """After a function's call: every extra column has one value per completion."""
        for column, values in self.extra.items():
            if len(values) != n:
                raise ConfigError(
                    f"--reward {scorer.name}: log_extra({column!r}) got {len(values)} values for {n} completions "
                    "(one each)"
                )


def answer_reward(prompts, completions, completion_ids, answer=None, **columns) -> list[float | None]:
    """1.0 where the completion, stripped, is the row's `answer`, else 0.0 (exact match, as sft's evaluation)."""
    if answer is None:
        raise ValueError("the dataset has no 'answer' column")
    return [float(text_of(c).strip() == str(expected).strip()) for c, expected in zip(completions, answer)]


def format_reward(pattern: str) -> Callable:
    compiled = re.compile(pattern, re.S)

    def format_(prompts, completions, completion_ids, **columns) -> list[float | None]:
        return [float(compiled.match(text_of(c)) is not None) for c in completions]

    return format_


def length_reward(limit: int) -> Callable:
    def length(prompts, completions, completion_ids, **columns) -> list[float | None]:
        return [-max(0, len(ids) - limit) / limit for ids in completion_ids]

    return length


def builtin(spec: str) -> tuple[str, Callable] | None:
    if spec == "answer":
        return "answer", answer_reward
    if spec.startswith("format:"):
        try:
            return "format", format_reward(spec[len("format:") :])
        except re.error as e:
            raise ConfigError(f"--reward {spec}: not a regular expression ({e})") from None
    if spec.startswith("length:"):
        limit = spec[len("length:") :]
        if not limit.isdigit() or int(limit) < 1:
            raise ConfigError(f"--reward {spec}: length:N needs a whole number of tokens N >= 1")
        return "length", length_reward(int(limit))
    return None


def load_rewards(specs: list[str], weights: list[float], owned: Reward | None = None) -> list[Reward]:
    """The --reward functions, each imported (or built in) and weighted, then `owned` (an --environment's
    get_reward); ConfigError naming the option."""
    if not specs and owned is None:
        raise ConfigError(
            "--reward: --task grpo needs at least one reward function (FILE.py:function, module:function, answer, "
            "format:REGEX or length:N), or an --environment with get_reward"
        )
    if weights and len(weights) != len(specs):
        raise ConfigError(f"--reward-weights: {len(weights)} weights for {len(specs)} reward functions")
    rewards = []
    for spec, weight in zip(specs, weights or [1.0] * len(specs)):
        found = builtin(spec)
        if found is None:
            if ":" not in spec:
                raise ConfigError(
                    f"--reward {spec}: not a built-in (answer, format:REGEX, length:N) nor FILE.py:function or "
                    "module:function"
                )
            fn = import_attr(spec, "--reward")
            if not callable(fn):
                raise ConfigError(f"--reward {spec}: {spec.rpartition(':')[2]} is not a function")
            found = (spec.rpartition(":")[2], fn)
        rewards.append(Reward(found[0], found[1], weight))
    rewards += [owned] if owned is not None else []
    names = [r.name for r in rewards]
    if len(set(names)) != len(names):
        raise ConfigError(f"--reward: two reward functions are called the same ({', '.join(names)})")
    return rewards


def called(scorer: Reward, args: dict, given: dict, where: Callable[[int], str]) -> list:
    """The function's values for a batch; on an exception, the first row that raises it is named (`args` sliced to
    the row, `given` passed as it is)."""
    try:
        return resolved(scorer.fn(**args, **given))  # an async function awaited, as TRL's
    except Exception as e:  # noqa: BLE001 - the user's function: one line naming it and the row
        for k in range(len(args["completions"])):
            try:
                resolved(scorer.fn(**{name: values[k : k + 1] for name, values in args.items()}, **given))
            except Exception as row_error:  # noqa: BLE001
                raise ConfigError(f"--reward {scorer.name}: raised {first_line(row_error)} (on {where(k)})") from None
        raise ConfigError(f"--reward {scorer.name}: raised {first_line(e)}") from None


def scores(
    rewards: list[Reward], args: dict, where: Callable[[int], str], call: RewardCall | None = None
) -> torch.Tensor:
    """(completions, functions) float64: each function's values, NaN where it returned None, a bool as 1.0 or 0.0;
    checked. `call`: what the functions are given beyond `args` (trainer_state, log_metric, log_extra)."""
    n = len(args["completions"])
    table = torch.full((n, len(rewards)), float("nan"), dtype=torch.float64)
    for j, scorer in enumerate(rewards):
        values = called(scorer, args, call.given() if call else {}, where)
        if not isinstance(values, (list, tuple)) or len(values) != n:
            got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
            raise ConfigError(f"--reward {scorer.name}: returned {got} values for {n} completions (one each)")
        if call is not None:
            call.check(scorer, n)
        for k, value in enumerate(values):
            if value is None:
                continue
            if isinstance(value, (bool, np.bool_)):  # as TRL, which makes a tensor of the values
                value = float(value)
            if not isinstance(value, numbers.Real) or math.isnan(value):
                raise ConfigError(f"--reward {scorer.name}: returned {value!r} for {where(k)} (a number or None)")
            table[k, j] = float(value)
    return table


def total(table: torch.Tensor, rewards: list[Reward]) -> torch.Tensor:
    """Each completion's reward: the weighted sum of its functions' values, those returning None left out; NaN
    where every function returned None (unscorable, as TRL)."""
    weights = torch.tensor([r.weight for r in rewards], dtype=torch.float64, device=table.device)
    return (table * weights).nansum(1).masked_fill(table.isnan().all(1), float("nan"))


def environment_reward(cls: type) -> Reward | None:
    """--environment's get_reward() of each completion's instance, as a reward function (TRL: named after the class,
    weight 1); None where the class has none."""
    if not callable(getattr(cls, "get_reward", None)):
        return None

    def get_reward(environments, **columns) -> list:
        return [resolved(environment.get_reward()) for environment in environments]  # async: awaited

    return Reward(cls.__name__, get_reward, 1.0)
