"""Text classification data: a text column (`--text-column`) and a label column (`--label-column`).

Every source goes through `datasets` as tables do (data/__init__.py): the labels are read, checked and
the missing splits carved by the same code. The tokenizer (`--tokenizer`: characters, bytes or a BPE)
is made from the training split only. Each split's texts are then tokenised once, truncated to
`--max-length` tokens, and held as one flat id array with each text's offset.

A batch is `(inputs, targets)` like any other: inputs are int64 ids (batch, the batch's longest
text), every shorter text padded at its end with PAD (dynamic padding, done by `__getitems__` behind
the DataLoader). Models tell real tokens from padding by `inputs != PAD` (DataShape.pad_id), and the
loss and metrics are per text (one label each), so padding never counts in either.
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import torch

from ..config import ConfigError, TrainConfig
from ..shape import DataShape
from .sources import opened
from .splits import BatchRows, Splits
from .targets import labelled_rows
from .text import CHUNK_DOCS
from .tokenizer import Vocab, bpe_for_run

PAD, UNK = 0, 1  # ids of the padding and of characters the training text lacks (--tokenizer char)
SPECIALS = 2  # the tokenizer's token t is id t + SPECIALS


class TokenRows(BatchRows):
    """Texts as token ids (one flat array, and where each text starts) with their labels. A batch is
    padded with PAD to its longest text."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray, targets: torch.Tensor):
        self.tokens, self.offsets, self.targets = tokens, offsets, targets

    def __getitems__(self, indices: list[int]):
        index = np.asarray(indices, dtype=np.int64)
        starts, lengths = self.offsets[index], self.offsets[index + 1] - self.offsets[index]
        positions = np.arange(lengths.max(initial=0))
        real = positions < lengths[:, None]  # (batch, longest): True at a text's tokens
        ids = np.where(real, self.tokens[np.where(real, starts[:, None] + positions, 0)], PAD)
        return torch.from_numpy(ids.astype(np.int64)), self.targets[torch.from_numpy(index)]

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])


def load_text_class_splits(cfg: TrainConfig, given=None) -> Splits:
    """Load and check the dataset, carve the missing splits, make the tokenizer from the training split,
    tokenise; ConfigError on bad input."""
    splits, source = opened(cfg, given)
    column = cfg.data.text_column
    for name, ds in splits.items():
        check_texts(ds, column, source, name, label_column=cfg.data.label_column)
    parts, num_classes, class_names = labelled_rows(splits, cfg, source)
    vocab = choose_tokenizer(cfg, lambda: texts_of(parts["train"][0], column), source)
    encoded = {name: encode_texts(vocab, texts_of(ds, column), cfg.data.max_length) for name, (ds, _) in parts.items()}
    rows = {name: TokenRows(*encoded[name][:2], labels) for name, (_, labels) in parts.items()}
    per_text = rows["train"].num_tokens / len(rows["train"])  # real tokens (after truncation) per training text
    facts = {
        "tokenizer": vocab.kind,
        "vocab_size": vocab.size + SPECIALS,
        "num_classes": num_classes,
        "train_samples": len(rows["train"]),
        "train_tokens": rows["train"].num_tokens,
        "mean_tokens_per_text": per_text,
        "truncated_train_texts": encoded["train"][2],
        "data_path": "in-memory token array, padded per batch",
    }
    shape = DataShape(
        "tokens", num_classes=num_classes, vocab_size=vocab.size + SPECIALS, max_length=cfg.data.max_length, pad_id=PAD
    )
    return Splits.of(
        rows,
        shape,
        source,
        class_names=class_names,
        input_columns=[column],
        facts=facts,
        metadata={"vocab": vocab.to_dict()},
        files=vocab.files(),
        tokenizer=vocab,
        tokens_per_sample=per_text,
    )


def check_texts(
    ds, column: str, source: str, split: str, label_column: str | None = None, flag="--text-column"
) -> None:
    """The split has rows, the label column (when given) and a string text column without an empty text
    (named by `flag` in messages: the option that names it)."""
    import datasets

    columns = ds.column_names
    if len(ds) == 0:
        raise ConfigError(f"--dataset: the {split} split of {source} is empty")
    for option, name in ((flag, column), ("--label-column", label_column)):
        if name is not None and name not in columns:
            raise ConfigError(f"{option}: column '{name}' not in {source} (columns: {', '.join(columns)})")
    feature = ds.features[column]
    if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
        raise ConfigError(f"{flag}: column '{column}' of {source} is not text ({feature})")
    text = ds.with_format("arrow")[column].combine_chunks()
    empty = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(text.fill_null(""))), 0)
    if pc.any(empty).as_py():
        row = pc.index(empty, True).as_py()
        raise ConfigError(
            f"--dataset: row {row} of the {split} split of {source} has an empty text in column '{column}' (empty "
            "or whitespace only)"
        )


def texts_of(ds, column: str):
    """The split's texts, a list of CHUNK_DOCS at a time."""
    for first in range(0, len(ds), CHUNK_DOCS):
        yield ds.with_format("arrow")[first : first + CHUNK_DOCS][column].to_pylist()


def choose_tokenizer(cfg: TrainConfig, train_texts, source: str):
    """--tokenizer for text to classify: a BPE trained on the training texts (auto: one of at most
    --vocab-size tokens, fewer where the text supports fewer), bytes, or the training texts' characters
    (characters the training texts lack become UNK in the other splits and in predict)."""
    if cfg.data.tokenizer in ("bpe", "auto"):
        return bpe_for_run(cfg, train_texts, source, exact=cfg.data.tokenizer == "bpe")
    if cfg.data.tokenizer == "byte":
        return Vocab("byte")
    return Vocab("char", "".join(sorted(set().union(*(set(text) for chunk in train_texts() for text in chunk)))))


def encode_texts(vocab, chunks, max_length: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Every text's ids (shifted by SPECIALS; unknown characters UNK), its first max_length kept:
    (the ids as one array, each text's offset into it plus the end, how many texts were truncated)."""
    pieces, lengths, truncated = [], [0], 0
    for chunk in chunks:
        for ids in vocab.ids_batch(chunk):
            truncated += len(ids) > max_length
            ids = ids[:max_length]
            pieces.append(np.where(ids < 0, UNK, ids + SPECIALS))
            lengths.append(len(ids))
    dtype = np.uint16 if vocab.size + SPECIALS <= 2**16 else np.int64
    return np.concatenate(pieces).astype(dtype), np.cumsum(lengths), truncated


def predict_texts(dataset: str, columns: list[str], vocab, max_length: int) -> tuple[TokenRows, object, str]:
    """`anytrain predict`'s texts, tokenised as in training (the run's tokenizer, its --max-length), as rows
    whose batches are padded to their longest text."""
    from .sources import rows_to_predict

    ds, source = rows_to_predict(dataset)
    check_texts(ds, columns[0], source, "predict")
    tokens, offsets, _ = encode_texts(vocab, texts_of(ds, columns[0]), max_length)
    return TokenRows(tokens, offsets, torch.zeros(len(ds), dtype=torch.long)), ds, source
