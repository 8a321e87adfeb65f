"""Test data for grpo with tools: sums as chat prompts, the tools, and a scripted first turn.

A tiny random model never writes a well-formed tool call by itself, so the tests script each completion's first
turn (`scripted`: generate wrapped, the first turn's tokens replaced by a call chosen by the completion's key) and
let the model write every later turn itself. Everything after the first turn is anytrain's: the call parsed by
transformers' response parsing, run, answered through the chat template, the model's next turn sampled, the masks,
the log-probabilities, the loss. The first turn's tokens count as the model's own (they are what it "sampled").

    kind (key % 5)   first turn
    0  right         <tool_call> add(a, b) </tool_call>: answered with a + b
    1  bad argument  add(a, "many"): the tool raises, the model reads the error
    2  unknown       mul(a, b): no such tool, counted as failed
    3  malformed     a call cut in its JSON: parsed as text, no call
    4  none          the model's own text (no call)
Greedy generation (no keys, evaluation's greedy_reward) calls add rightly.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import torch
from textdata import write_jsonl

TOOLS = '''
import time

from math import floor  # imported: not a tool


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def wait(seconds: float) -> str:
    """Wait a while.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "done"


def _private(x: int) -> int:
    return x
'''

KINDS = ("right", "bad argument", "unknown", "malformed", "none")


def sum_rows(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(1000, 9999), rng.randint(1000, 9999)
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)})
    return rows


def write_sums(folder: Path, train: int = 4, held_out: int = 2) -> list[dict]:
    rows = sum_rows(train + 2 * held_out)
    folder.mkdir(parents=True, exist_ok=True)
    cuts = {"train": rows[:train], "validation": rows[train : train + held_out], "test": rows[train + held_out :]}
    for split, part in cuts.items():
        write_jsonl(folder / f"{split}.jsonl", part)
    return rows


def first_call(kind: str, a: str, b: str) -> str | None:
    """The scripted first turn's text (without its end of turn), None: the model's own."""
    call = '<tool_call>\n{{"name": "{}", "arguments": {{"a": {}, "b": {}}}}}\n</tool_call>'
    return {
        "right": call.format("add", a, b),
        "bad argument": call.format("add", a, '"many"'),
        "unknown": call.format("mul", a, b),
        "malformed": '<tool_call>\n{"name": "add", "argu\n</tool_call>',
        "none": None,
    }[kind]


def kind_of(key: int | None) -> str:
    return "right" if key is None else KINDS[key % len(KINDS)]


def scripted(monkeypatch, tokenizer) -> list[dict]:
    """turns.generate wrapped: each first turn scripted by its key (module docstring); returns what it scripted,
    in order: each first turn's kind and its prompt's text."""
    import anytrain.tasks.causal_lm.turns as turns

    real, seen = turns.generate, []
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(model, prompts, keys, sampling, chunk=0, shared=None):
        done = real(model, prompts, keys, sampling, chunk, shared)
        for k, prompt in enumerate(prompts):
            text = tokenizer.decode(prompt)
            if "</tool_response>" in text.rsplit("<|im_start|>user", 1)[-1]:
                continue  # a later turn: the model's own
            kind = kind_of(None if keys is None else int(keys[k]))
            seen.append({"kind": kind, "prompt": text})
            a, b = re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1]
            call = first_call(kind, a, b)
            if call is not None:
                write_turn(done, k, tokenizer(call).input_ids + [end], sampling.max_new_tokens)
        return done

    monkeypatch.setattr(turns, "generate", generate)
    return seen


def write_turn(done, k: int, ids: list[int], limit: int) -> None:
    """Row k of a generate call's Completions made to hold `ids` as its completion (cut at `limit`)."""
    w, n = done.width, min(len(ids), limit)
    done.ids[k, w : w + n] = torch.tensor(ids[:n])
    done.completion[k] = False
    done.completion[k, :n] = True
    done.truncated[k] = n < len(ids)
