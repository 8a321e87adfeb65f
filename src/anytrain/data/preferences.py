"""`--dataset preferences`: a generated preference set whose chosen answers can be checked, for preference tuning
offline (`--task dpo`, `--task reward`). Made at run time from a fixed seed (no file, no network): ROWS pairs in
TRL's conversational form, `prompt` (an optional system line and the user's question) and `chosen` / `rejected`
(the assistant's one answer each), plus the question's `kind`.

The questions are those of `instructions` (data/instructions.py); the chosen answer is the right one, the rejected
one a near miss of the kind a small model makes, always wrong and always different:
    add        What is 17 + 25?                        42         41 or 43
    subtract   What is 31 - 9?                         22         21 or 23
    capitals   Write "bakomi" in capital letters.      BAKOMI     Bakomi
    reverse    Spell "bakomi" backwards.               imokab     bakomi
    length     How many letters are in "bakomi"?       6          5 or 7
    first      What is the first letter of "bakomi"?   b          i (the last)
    sort       Sort these numbers: 7 2 9               2 7 9      9 7 2 (descending)
So a held-out prompt is scored by exact match against its chosen answer. The seed differs from `instructions`',
so a model fine-tuned there (the README's SFT -> DPO recipe) meets these prompts for the first time.
"""

from __future__ import annotations

import random

from .instructions import SYSTEM, question

NAME = "preferences"
ROWS = 2000
SEED = 20261125


def near_miss(kind: str, asked: str, answer: str, rng: random.Random) -> str:
    """A wrong answer to the question, close to the right one."""
    if kind in ("add", "subtract", "length"):
        wrong = int(answer) + rng.choice((-1, 1))
        return str(wrong if wrong >= 0 else int(answer) + 1)
    if kind == "capitals":
        return answer[0] + answer[1:].lower()  # only the first letter a capital
    word = asked.split('"')[1] if '"' in asked else ""
    if kind == "reverse":
        return word
    if kind == "first":
        return next(c for c in reversed(word) if c != answer)
    numbers = answer.split()
    descending = " ".join(sorted(numbers, reverse=True))
    if descending != answer:
        return descending
    return " ".join([*numbers, numbers[-1]])  # every number equal: one too many


def pair(rng: random.Random) -> dict:
    """One row: the prompt (an optional system line, the question), the right answer and a near miss."""
    prompt = [{"role": "system", "content": rng.choice(SYSTEM)}] if rng.random() < 0.25 else []
    kind, asked, answer = question(rng)
    prompt.append({"role": "user", "content": asked})
    rejected = near_miss(kind, asked, answer, rng)
    return {
        "prompt": prompt,
        "chosen": [{"role": "assistant", "content": answer}],
        "rejected": [{"role": "assistant", "content": rejected}],
        "kind": kind,
    }


def rows(count: int = ROWS, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    return [pair(rng) for _ in range(count)]


def load_preferences():
    """The generated set as a datasets.Dataset (columns: prompt, chosen, rejected, kind)."""
    import datasets

    return datasets.Dataset.from_list(rows())
