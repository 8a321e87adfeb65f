"""Words tagged one label each: the checks on their columns, a word's tag on its first sub-token, and
entities found in IOB tags the way seqeval does by default (conlleval's rules), so that entity-level
precision, recall and F1 can be summed sentence by sentence, over batches and ranks.

Chunking (seqeval's default, non-strict mode): a tag is PREFIX-TYPE with PREFIX one of B, I, E, S (O
alone is outside). A chunk ends after an E or S tag, after B or I when the next tag is B, S or O, and
whenever the type changes; it starts at B or S, at E or I after E, S or O, and whenever the type changes.
So an I-PER after O opens a PER entity, as in conlleval. tests/test_hf_tag.py checks this against
seqeval on random tag sequences.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ...config import ConfigError
from ...shape import IGNORE


def align_labels(word_ids: list[int | None], word_labels: list[int]) -> list[int]:
    """Per sub-token labels: a word's label on its first sub-token, IGNORE on its others and on special tokens
    (word id None), as a fast tokenizer's `word_ids()` numbers them."""
    labels, previous = [], None
    for word in word_ids:
        labels.append(IGNORE if word is None or word == previous else word_labels[word])
        previous = word
    return labels


def entities(tags: list[str]) -> set[tuple[str, int, int]]:
    """The (type, first, last) chunks of one sentence's IOB/IOBES tags, by seqeval's default rules."""
    found, start, prev, prev_kind = set(), 0, "O", ""
    for i, tag in enumerate([*tags, "O"]):
        prefix, kind = (tag[:1] or "O"), (tag[1:].split("-", 1)[-1] or "_")
        changed = kind != prev_kind
        if (
            prev in ("E", "S")
            or (prev in ("B", "I") and prefix in ("B", "S", "O"))
            or (prev not in ("O", ".") and changed)
        ):
            found.add((prev_kind, start, i - 1))
        if (
            prefix in ("B", "S")
            or (prev in ("E", "S", "O") and prefix in ("E", "I"))
            or (prefix not in ("O", ".") and changed)
        ):
            start = i
        prev, prev_kind = prefix, kind
    return found


def entity_counts(predicted: list[str], true: list[str]) -> tuple[int, int, int]:
    """One sentence's (correct entities, predicted entities, true entities)."""
    guessed, actual = entities(predicted), entities(true)
    return len(guessed & actual), len(guessed), len(actual)


def prf(correct: int, predicted: int, true: int) -> dict[str, float]:
    """Micro precision, recall and F1 over summed entity counts; 0 where there is nothing to divide by."""
    return {
        "precision": correct / predicted if predicted else 0.0,
        "recall": correct / true if true else 0.0,
        "f1": 2 * correct / (predicted + true) if predicted + true else 0.0,
    }


def check_tagged(ds, words: str, tags: str | None, source: str, split: str) -> None:
    """A split of tagged sentences: rows, a column of word lists, a column of tag lists (strings or ids) with
    one tag per word. ConfigError, one line naming the option, the split and the row, otherwise."""
    if len(ds) == 0:
        raise ConfigError(f"--dataset: the {split} split of {source} is empty")
    for flag, name in (("--text-column", words), ("--label-column", tags)):
        if name is not None and name not in ds.column_names:
            raise ConfigError(f"{flag}: column '{name}' not in {source} (columns: {', '.join(ds.column_names)})")
    table = ds.with_format("arrow")
    column = table[words].combine_chunks() if hasattr(table[words], "combine_chunks") else table[words]
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) or not pa.types.is_string(
        column.type.value_type
    ):
        raise ConfigError(
            f"--text-column: column '{words}' of {source} holds {column.type}, not lists of words (one list per "
            "sentence, as CoNLL datasets hold them)"
        )
    counts = pc.list_value_length(column).fill_null(0)
    empty = pc.equal(counts, 0)
    if pc.any(empty).as_py():
        raise ConfigError(
            f"--dataset: row {pc.index(empty, True).as_py()} of the {split} split of {source} has no words"
        )
    if tags is None:
        return
    labels = table[tags].combine_chunks() if hasattr(table[tags], "combine_chunks") else table[tags]
    inner = getattr(labels.type, "value_type", None)
    if inner is None or not (pa.types.is_string(inner) or pa.types.is_integer(inner)):
        raise ConfigError(
            f"--label-column: column '{tags}' of {source} holds {labels.type}, not lists of tags (one tag per word)"
        )
    differ = pc.not_equal(pc.list_value_length(labels).fill_null(0), counts)
    if pc.any(differ).as_py():
        row = pc.index(differ, True).as_py()
        raise ConfigError(
            f"--label-column: row {row} of the {split} split of {source} has {len(labels[row].as_py() or [])} tags "
            f"for its {counts[row].as_py()} words"
        )
