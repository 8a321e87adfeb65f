"""Tool-calling chats in TRL's format for the sft tests (tests/test_sft_tools.py, the conformance suite), generated
from a seed: a question, the assistant's call of a tool (`tool_calls`, content empty, absent or a short text), the
tool's result (a `tool` message) and the assistant's answer; some rows end at the call (the last answer is a call),
some make two calls in one turn, some have a system line. Each row's `tools` column holds the schemas of the two
tools, made from the Python functions below by transformers' `get_json_schema`, as a list or (`as_json`) its JSON
text."""

from __future__ import annotations

import json
import random

SYLLABLES = [c + v for c in "bdfgklmnprst" for v in "aeiou"]


def add(a: int, b: int):  # no return type, short descriptions: the schemas are much of a row's tokens
    """Add.

    Args:
        a: x
        b: y
    """
    return a + b


def reverse(word: str):
    """Reverse.

    Args:
        word: w
    """
    return word[::-1]


def schemas() -> list[dict]:
    from transformers.utils import get_json_schema

    return [get_json_schema(add), get_json_schema(reverse)]


def call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def question(rng: random.Random) -> tuple[str, dict, str]:
    """(the question, the call that answers it, the tool's result)."""
    if rng.random() < 0.5:
        a, b = rng.randrange(50), rng.randrange(50)
        return f"What is {a} + {b}?", call("add", a=a, b=b), str(a + b)
    word = "".join(rng.choice(SYLLABLES) for _ in range(2))
    return f'Spell "{word}" backwards.', call("reverse", word=word), word[::-1]


def chat(rng: random.Random) -> list[dict]:
    messages = [{"role": "system", "content": "Use the tools."}] if rng.random() < 0.25 else []
    asked = [question(rng) for _ in range(2 if rng.random() < 0.2 else 1)]
    messages.append({"role": "user", "content": " And ".join(q for q, _, _ in asked)})
    turn: dict = {"role": "assistant", "tool_calls": [c for _, c, _ in asked]}
    kind = rng.random()
    if kind < 0.6:
        turn["content"] = "" if kind < 0.3 else "Calling."
    messages.append(turn)
    if rng.random() < 0.2:  # the chat ends at the call
        return messages
    messages += [{"role": "tool", "name": c["function"]["name"], "content": r} for _, c, r in asked]
    return [*messages, {"role": "assistant", "content": " and ".join(r for _, _, r in asked)}]


def rows(count: int, seed: int = 0, as_json: bool = False) -> list[dict]:
    rng, tools = random.Random(seed), schemas()
    return [{"messages": chat(rng), "tools": json.dumps(tools) if as_json else tools} for _ in range(count)]
