"""`--dataset shakespeare-speakers`: who speaks, a text-classification set derived at run time from the
bundled Tiny Shakespeare (no file, no network). The play text is parsed into speeches (a line `NAME:`,
then its lines, up to a blank line; a name with no lines after it is no speech), and each speech of the
NUM_SPEAKERS most frequent speakers becomes a row: `text` (the speech without the name line) and
`speaker` (the label, the name as the text spells it). N = 8: the count drops there (127 speeches for
the 8th, 124 for the 9th and 10th), so no tie decides who is in. The split is fixed, per speaker and
contiguous: each speaker's speeches in text order, the first 70 % train, the next 10 % validate, the
last 20 % test (floor counts): every speaker is in every split, and its test speeches are whole later
scenes (a random split puts one conversation on both sides and rewards remembering scenes). Reasons and
figures: docs/guide.md.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

from .bundled import LABELLED_TEXT, SHAKESPEARE_PATH

NAME = "shakespeare-speakers"
TEXT_COLUMN, LABEL_COLUMN = LABELLED_TEXT[NAME]
NUM_SPEAKERS = 8
HELD_OUT = (("validation", 0.1), ("test", 0.2))  # the share of each speaker's speeches, taken from its end
SPLITS = ("train", "validation", "test")


def parse_speeches(text: str) -> list[tuple[str, str]]:
    """(speaker, speech) pairs in text order. A block between blank lines is a speech when its first
    line is `NAME:` and lines follow it; the speech is those lines, without the name."""
    speeches = []
    for block in re.split(r"\n\s*\n", text):
        head, _, body = block.strip("\n").partition("\n")
        head, body = head.strip(), body.strip()
        if head.endswith(":") and len(head) > 1 and body:
            speeches.append((head[:-1], body))
    return speeches


def top_speakers(speeches: list[tuple[str, str]], n: int) -> list[str]:
    """The n speakers with the most speeches, most first; equal counts in name order."""
    counts = Counter(speaker for speaker, _ in speeches)
    return [name for name, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def split_speeches(speeches: list[tuple[str, str]], speakers: list[str]) -> dict[str, list[int]]:
    """{split: indices into speeches, in text order}: per speaker, in text order, the first speeches
    train, then floor(10 %) validate, then floor(20 %) test."""
    chosen = set(speakers)
    by_speaker: dict[str, list[int]] = {name: [] for name in speakers}
    for i, (speaker, _) in enumerate(speeches):
        if speaker in chosen:
            by_speaker[speaker].append(i)
    out: dict[str, list[int]] = {name: [] for name in SPLITS}
    for indices in by_speaker.values():
        counts = {name: math.floor(len(indices) * share) for name, share in HELD_OUT}
        train = len(indices) - sum(counts.values())
        out["train"] += indices[:train]
        out["validation"] += indices[train : train + counts["validation"]]
        out["test"] += indices[train + counts["validation"] :]
    return {name: sorted(indices) for name, indices in out.items()}


def load_speakers(num_speakers: int = NUM_SPEAKERS, path: Path = SHAKESPEARE_PATH):
    """The set as a datasets.DatasetDict (train, validation, test), columns `text` and `speaker` (strings)."""
    import datasets

    speeches = parse_speeches(Path(path).read_text(encoding="utf-8"))
    splits = split_speeches(speeches, top_speakers(speeches, num_speakers))
    features = datasets.Features({TEXT_COLUMN: datasets.Value("string"), LABEL_COLUMN: datasets.Value("string")})
    return datasets.DatasetDict(
        {
            name: datasets.Dataset.from_dict(
                {TEXT_COLUMN: [speeches[i][1] for i in indices], LABEL_COLUMN: [speeches[i][0] for i in indices]},
                features=features,
            )
            for name, indices in splits.items()
        }
    )
