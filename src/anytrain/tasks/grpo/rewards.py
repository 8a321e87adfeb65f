"""grpo's reward functions (--reward, --reward-weights): plain callables with TRL's signature,

    fn(prompts, completions, completion_ids, **columns) -> list[float | None]

one value per completion (None: this function does not score it), so a TRL reward function runs unchanged. Each
prompt's row appears once per completion: `prompts` as given (text, or a chat), `completions` as text (for chat
prompts a one-message chat, [{"role": "assistant", "content": ...}], as TRL gives them), `completion_ids` the token
ids, and every other column of the dataset by its name. Built-ins for the common cases: `answer`, `format:REGEX`,
`length:N` (tasks/grpo/options.py says what each scores). A function that raises, returns the wrong number of values, a
non-number or NaN stops the run in one line naming the function and the row.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...config import ConfigError, first_line
from ...usermodel import import_attr


@dataclass(frozen=True)
class Reward:
    name: str  # what the log calls it: the function's name, or the built-in's
    fn: Callable
    weight: float


def text_of(completion) -> str:
    """A completion's text: itself, or a chat's last message's content."""
    return completion if isinstance(completion, str) else str(completion[-1]["content"])


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


def load_rewards(specs: list[str], weights: list[float]) -> list[Reward]:
    """The --reward functions, each imported (or built in) and weighted; ConfigError naming the option."""
    if not specs:
        raise ConfigError(
            "--reward: --task grpo needs at least one reward function (FILE.py:function, module:function, answer, "
            "format:REGEX or length:N)"
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
    names = [r.name for r in rewards]
    if len(set(names)) != len(names):
        raise ConfigError(f"--reward: two reward functions are called the same ({', '.join(names)})")
    return rewards


def called(scorer: Reward, args: dict, where: Callable[[int], str]) -> list:
    """The function's values for a batch; on an exception, the first row that raises it is named."""
    try:
        return scorer.fn(**args)
    except Exception as e:  # noqa: BLE001 - the user's function: one line naming it and the row
        for k in range(len(args["completions"])):
            try:
                scorer.fn(**{name: values[k : k + 1] for name, values in args.items()})
            except Exception as row_error:  # noqa: BLE001
                raise ConfigError(f"--reward {scorer.name}: raised {first_line(row_error)} (on {where(k)})") from None
        raise ConfigError(f"--reward {scorer.name}: raised {first_line(e)}") from None


def scores(rewards: list[Reward], args: dict, where: Callable[[int], str]) -> torch.Tensor:
    """(completions, functions) float64: each function's values, NaN where it returned None; checked."""
    n = len(args["completions"])
    table = torch.full((n, len(rewards)), float("nan"), dtype=torch.float64)
    for j, scorer in enumerate(rewards):
        values = called(scorer, args, where)
        if not isinstance(values, (list, tuple)) or len(values) != n:
            got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
            raise ConfigError(f"--reward {scorer.name}: returned {got} values for {n} completions (one each)")
        for k, value in enumerate(values):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
                raise ConfigError(f"--reward {scorer.name}: returned {value!r} for {where(k)} (a number or None)")
            table[k, j] = float(value)
    return table


def total(table: torch.Tensor, rewards: list[Reward]) -> torch.Tensor:
    """Each completion's scorer: the weighted sum of its functions' values, those returning None left out."""
    weights = torch.tensor([r.weight for r in rewards], dtype=torch.float64)
    return (table * weights).nansum(1)
