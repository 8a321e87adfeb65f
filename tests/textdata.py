"""Labelled text generated for the tests: sentences of filler words with topic words (one in four)
drawn from one of two vocabularies (the label), a fifth of them with one word of the other topic, of
very uneven lengths (1 to 49 words), so batches are padded a lot and differently."""

from __future__ import annotations

import json
import random
from pathlib import Path

TOPICS = {
    "nature": "river stone forest mountain valley meadow creek pine cedar moss fern brook cliff".split(),
    "tech": "engine circuit cable server socket signal packet driver kernel cache switch laser".split(),
}
FILLER = "the a of and to in is was with on for that it as at by from this".split()


def texts(n: int, seed: int = 0) -> list[dict]:
    """n rows {"text": ..., "label": "nature" or "tech"}."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.choice(sorted(TOPICS))
        other = TOPICS["tech" if label == "nature" else "nature"]
        words = [rng.choice(FILLER) for _ in range(rng.randint(0, 36))]
        for _ in range(1 + len(words) // 3):
            words.insert(rng.randrange(len(words) + 1), rng.choice(TOPICS[label]))
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words) + 1), rng.choice(other))
        rows.append({"text": " ".join(words), "label": label})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
