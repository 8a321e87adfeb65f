"""`--dataset tool-sums`: generated chats in TRL's tool-calling format, for teaching a causal LM to use a calculator
(`--task sft`); `--dataset sum-questions`: the same kind of questions as prompts with their answers, for
`--task grpo --tools anytrain.data.sums:add --reward answer`. Made at run time from a fixed seed (no file, no
network). Each question adds two numbers of 4 to 6 digits, too long for a small model to add in its head:

    user       What is 48213 + 90876?
    assistant  a call: add(a=48213, b=90876)
    tool       139089
    assistant  139089

In a share WRONG of the chats the first call leaves b out ("b": null), the tool answers with its error, and the
assistant calls again rightly: the model sees what a failed call looks like and how to recover. The `tools` column
holds the add tool's JSON schema (a JSON text, as TRL reads it), so the chat template shows it as it will be shown
when the model is trained with the tool (`--tools anytrain.data.sums:add`).

`digits=N` (the Python functions only) makes every number N digits wide: each digit the model copies (from the question
into the call, from the tool's answer into the reply) then sits at a fixed distance from where it is written, which a
small model learns in hundreds of steps, where the bundled mixed widths ask it to find the digits by their content
(examples/distill_sums.py).
"""

from __future__ import annotations

import json
import random

NAME, QUESTIONS = "tool-sums", "sum-questions"
ROWS = 4000
SEED = 20261127
WRONG = 0.2


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def schema() -> list[dict]:
    from transformers.utils import get_json_schema

    return [get_json_schema(add)]


def numbers(rng: random.Random, digits: int | None = None) -> tuple[int, int]:
    """Two numbers of 4 to 6 digits each, or of `digits` digits both."""
    widths = (rng.randint(4, 6), rng.randint(4, 6)) if digits is None else (digits, digits)
    return tuple(rng.randrange(10 ** (d - 1), 10**d) for d in widths)  # type: ignore[return-value]


def call(a: int, b: int | None) -> dict:
    """An assistant turn that calls add (b None: left out, as a wrong call)."""
    function = {"name": "add", "arguments": {"a": a, "b": b}}
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": function}]}


def answered(result) -> dict:
    return {"role": "tool", "name": "add", "content": str(result)}


def conversation(rng: random.Random, digits: int | None = None) -> dict:
    """One row: the question, the call (after a wrong one, now and then), the tool's answer, the reply."""
    a, b = numbers(rng, digits)
    messages = [{"role": "user", "content": f"What is {a} + {b}?"}]
    if rng.random() < WRONG:
        try:
            add(a, None)  # type: ignore[arg-type]
        except TypeError as e:
            messages += [call(a, None), answered({"error": str(e)})]
    messages += [call(a, b), answered(a + b), {"role": "assistant", "content": str(a + b)}]
    return {"messages": messages, "answer": str(a + b)}


def rows(count: int = ROWS, seed: int = SEED, digits: int | None = None) -> list[dict]:
    rng = random.Random(seed)
    return [conversation(rng, digits) for _ in range(count)]


def load_tool_sums(digits: int | None = None):
    """The chats as a datasets.Dataset (columns: messages, tools, answer)."""
    import datasets

    tools = json.dumps(schema())
    return datasets.Dataset.from_list([{**row, "tools": tools} for row in rows(digits=digits)])


def load_sum_questions(count: int = ROWS, seed: int = SEED + 1, digits: int | None = None):
    """The questions as prompts (columns: prompt, the user's question; answer, the sum's text), another seed's."""
    import datasets

    asked = rows(count, seed, digits)
    return datasets.Dataset.from_list([{"prompt": r["messages"][:1], "answer": r["answer"]} for r in asked])
