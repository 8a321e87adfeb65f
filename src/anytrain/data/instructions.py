"""`--dataset instructions`: a generated chat set whose answers can be checked exactly, for fine-tuning a
transformers causal LM offline (`--task sft`; `--dataset questions`: the same rows as prompts and answers, for
`--task grpo`). Made at run time from a fixed seed (no file, no network):
ROWS conversations in TRL's `messages` form (`[{"role": ..., "content": ...}, ...]`), each a user
question and the assistant's one answer, some with a system line, some with an earlier exchange first.

The questions (each answer is a function of its question, so a held-out prompt is scored by exact match):
    add        What is 17 + 25?                              42
    subtract   What is 31 - 9?                               22
    capitals   Write "bakomi" in capital letters.            BAKOMI
    reverse    Spell "bakomi" backwards.                     imokab
    length     How many letters are in "bakomi"?             6
    first      What is the first letter of "bakomi"?         b
    sort       Sort these numbers: 7 2 9                     2 7 9
The words are made of syllables (so no answer is a word the model has seen as a whole), the numbers
under 50. The split is carved by --val-fraction/--test-fraction like any table's.
"""

from __future__ import annotations

import random

NAME = "instructions"
ROWS = 4000
SEED = 20261124
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
SYSTEM = ("You are a careful assistant. Answer with the result only.", "Reply tersely.")


def word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))


def question(rng: random.Random) -> tuple[str, str, str]:
    """(kind, question, answer) of one generated question."""
    kind = rng.choice(("add", "subtract", "capitals", "reverse", "length", "first", "sort"))
    a, b, w = rng.randrange(50), rng.randrange(50), word(rng)
    if kind == "add":
        return kind, f"What is {a} + {b}?", str(a + b)
    if kind == "subtract":
        a, b = max(a, b), min(a, b)
        return kind, f"What is {a} - {b}?", str(a - b)
    if kind == "capitals":
        return kind, f'Write "{w}" in capital letters.', w.upper()
    if kind == "reverse":
        return kind, f'Spell "{w}" backwards.', w[::-1]
    if kind == "length":
        return kind, f'How many letters are in "{w}"?', str(len(w))
    if kind == "first":
        return kind, f'What is the first letter of "{w}"?', w[0]
    numbers = [rng.randrange(10) for _ in range(rng.randint(3, 5))]
    return kind, f"Sort these numbers: {' '.join(map(str, numbers))}", " ".join(map(str, sorted(numbers)))


def conversation(rng: random.Random) -> dict:
    """One row: an optional system line, an optional earlier exchange, then the question and its answer."""
    messages = []
    if rng.random() < 0.25:
        messages.append({"role": "system", "content": rng.choice(SYSTEM)})
    if rng.random() < 0.2:
        _, earlier, reply = question(rng)
        messages += [{"role": "user", "content": earlier}, {"role": "assistant", "content": reply}]
    kind, asked, answer = question(rng)
    messages += [{"role": "user", "content": asked}, {"role": "assistant", "content": answer}]
    return {"messages": messages, "kind": kind}


def rows(count: int = ROWS, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    return [conversation(rng) for _ in range(count)]


def load_instructions():
    """The generated set as a datasets.Dataset (columns: messages, kind)."""
    import datasets

    return datasets.Dataset.from_list(rows())


def load_questions():
    """`--dataset questions`: the same generated set as prompts for --task grpo (columns: prompt, every turn before
    the last answer; answer, that answer's text, checked exactly by --reward answer; kind)."""
    import datasets

    return datasets.Dataset.from_list(
        [{"prompt": r["messages"][:-1], "answer": r["messages"][-1]["content"], "kind": r["kind"]} for r in rows()]
    )
