"""Source and target texts generated for the seq2seq tests: word-by-word translation through a fixed
dictionary (English to made-up words), 2 to 6 words a sentence, so every answer can be checked exactly
(exact match) and partly (BLEU)."""

from __future__ import annotations

import random

DICTIONARY = dict(
    zip(
        "river stone forest mountain valley engine cable server signal laser the a of and to in is with".split(),
        "fluv petra silva mont vall moteur kabel servo signa lazo le un de et au en est avec".split(),
    )
)


def pairs(n: int, seed: int = 0) -> list[dict]:
    """n rows {"source": ..., "target": ...}."""
    rng = random.Random(seed)
    words = sorted(DICTIONARY)
    rows = []
    for _ in range(n):
        source = [rng.choice(words) for _ in range(rng.randint(2, 6))]
        rows.append({"source": " ".join(source), "target": " ".join(DICTIONARY[w] for w in source)})
    return rows


def corpus() -> list[str]:
    return [" ".join(DICTIONARY), " ".join(DICTIONARY.values())] * 20
