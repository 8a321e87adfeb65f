"""Tagged sentences generated for the token-classification tests, as CoNLL datasets hold them: a list of
words and a list of IOB tags, one per word. Filler and topic words are O; people (one or two words,
B-PER I-PER) and places (B-LOC) are drawn from small lists, and a place may also be a word that is a
person elsewhere ("Romeo's Verona" is LOC only by its list), so the tags follow the words."""

from __future__ import annotations

import random

from textdata import FILLER, TOPICS

PEOPLE = [["Romeo"], ["Juliet"], ["Hamlet"], ["Marcus", "Brutus"], ["Caius", "Marcius"], ["Lady", "Capulet"]]
PLACES = ["Rome", "Verona", "Padua", "Venice", "London", "Mantua"]
WORDS = FILLER + [w for topic in TOPICS.values() for w in topic]


def tagged(n: int, seed: int = 0) -> list[dict]:
    """n rows {"tokens": [...], "tags": [...]}, 2 to 30 words each."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        tokens = [rng.choice(WORDS) for _ in range(rng.randint(1, 24))]
        tags = ["O"] * len(tokens)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(tokens) + 1)
            if rng.random() < 0.6:
                person = rng.choice(PEOPLE)
                tokens[at:at] = person
                tags[at:at] = ["B-PER"] + ["I-PER"] * (len(person) - 1)
            else:
                tokens[at:at] = [rng.choice(PLACES)]
                tags[at:at] = ["B-LOC"]
        rows.append({"tokens": tokens, "tags": tags})
    return rows
