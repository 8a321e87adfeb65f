"""Tagged words for a transformers token classifier (tasks/hf_tag/): a column of word lists
(`--text-column`, default `tokens`) and a column of tag lists (`--label-column`), one tag per word, as
in CoNLL-style datasets. The lists are checked (tasks/hf_tag/tagging.py), the missing splits carved, and each
sentence tokenised by the model's own tokenizer with `is_split_into_words`: a word's tag goes on its
first sub-token, -100 on its other sub-tokens and on special tokens (transformers' run_ner convention),
so a word counts once in the loss and the metrics. A batch is padded by DataCollatorForTokenClassification.
"""

from __future__ import annotations

import numpy as np
import torch

from ...config import ConfigError, TrainConfig
from ...data.sources import carve_rows, opened, rows_to_predict
from ...data.splits import Rows, Splits
from ...shape import IGNORE, DataShape
from .tagging import align_labels, check_tagged

WORDS = "tokens"  # the words column when --text-column is not given (CoNLL datasets on the hub name it so)


class TaggedRows(Rows):
    """Tokenised sentences with their sub-token tags; `__getitems__` pads a batch (tags with -100). Rows may
    also carry each sub-token's word index and the words (predict): kept beside the model's inputs."""

    def __init__(self, encoded, tokenizer, multiple: int | None):
        self.encoded, self.tokenizer, self.multiple = encoded, tokenizer, multiple
        self.lengths = np.array([len(ids) for ids in encoded["input_ids"]], dtype=np.int64)
        self.targets_per_row = np.array([sum(t != IGNORE for t in tags) for tags in encoded["labels"]], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitems__(self, indices: list[int]):
        from transformers import DataCollatorForTokenClassification

        rows = self.encoded[indices]
        model_keys = [k for k in rows if k not in ("word_ids", "words")]
        features = [{k: rows[k][i] for k in model_keys} for i in range(len(indices))]
        batch = dict(DataCollatorForTokenClassification(self.tokenizer, pad_to_multiple_of=self.multiple)(features))
        targets = batch.pop("labels")
        if "word_ids" in rows:  # predict: which word each sub-token belongs to, and the words
            batch["word_ids"], batch["words"] = rows["word_ids"], rows["words"]
        return batch, targets

    def set_epoch(self, epoch: int) -> None:
        """Nothing is random in a sentence's tokens."""


def tag_vocabulary(splits: dict, column: str, source: str) -> tuple[list[str], dict]:
    """(tag names, tag -> id) from the training split: a Sequence(ClassLabel)'s names (ids as they are), ids
    without names (0..max), or string tags sorted; a validation or test tag the training split lacks is one
    line naming it."""
    feature = splits["train"].features[column]
    names = getattr(getattr(feature, "feature", None), "names", None)
    if names:
        return list(names), {k: k for k in range(len(names))}
    values = {t for row in splits["train"][column] for t in row}
    if all(isinstance(t, int) for t in values):
        count = max(values) + 1
        names, ids = [str(k) for k in range(count)], {k: k for k in range(count)}
    else:
        names = sorted(map(str, values))
        ids = {n: k for k, n in enumerate(names)}
    for split, ds in splits.items():
        unknown = sorted({t for row in ds[column] for t in row} - set(ids), key=str)
        if unknown:
            raise ConfigError(
                f"--label-column: the {split} split of {source} has the tag {unknown[0]!r}, which the training "
                f"split never uses (its tags: {', '.join(names[:12])})"
            )
    return names, ids


def encode(ds, tokenizer, words: str, tags: str | None, ids: dict, max_length: int, keep_words: bool = False):
    """Sentences tokenised (words pre-split), each word's tag on its first sub-token and -100 elsewhere."""

    def tokenise(batch):
        enc = tokenizer(batch[words], is_split_into_words=True, truncation=True, max_length=max_length)
        word_ids = [enc.word_ids(i) for i in range(len(batch[words]))]
        rows = batch[tags] if tags else [[0] * len(w) for w in batch[words]]
        enc["labels"] = [align_labels(w, [ids[t] for t in row]) for w, row in zip(word_ids, rows)]
        if keep_words:
            enc["word_ids"] = [[-1 if i is None else i for i in w] for w in word_ids]
            enc["words"] = batch[words]
        return enc

    return ds.map(tokenise, batched=True, remove_columns=ds.column_names, desc="tokenising tagged words")


def load_tagged_splits(cfg: TrainConfig, tokenizer) -> tuple[dict, str, list[str], dict]:
    """Check and carve the tagged splits; ({split: dataset}, source, tag names, tag -> id)."""
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"--model {cfg.model.name}: token classification needs a fast tokenizer (its word ids)")
    splits, source = opened(cfg, None)
    words = cfg.data.text_column or WORDS
    for name, ds in splits.items():
        check_tagged(ds, words, cfg.data.label_column, source, name)
    names, ids = tag_vocabulary(splits, cfg.data.label_column, source)
    return carve_rows(splits, cfg, source), source, names, ids


def tagged_splits(cfg: TrainConfig, tokenizer, given=None, multiple: int | None = None) -> Splits:
    """The tagged data, tokenised: Splits whose batches are ({input_ids, attention_mask, ...}, tags)."""
    if given is not None:
        raise ConfigError("dataset: token classification reads --dataset (a datasets object is not supported yet)")
    parts, source, names, ids = load_tagged_splits(cfg, tokenizer)
    words = cfg.data.text_column or WORDS
    rows = {
        name: TaggedRows(
            encode(ds, tokenizer, words, cfg.data.label_column, ids, cfg.data.max_length), tokenizer, multiple
        )
        for name, ds in parts.items()
    }
    train = rows["train"]
    facts = {
        "tokenizer": f"{type(tokenizer).__name__} (the model's own)",
        "num_tags": len(names),
        "tags": names,
        "train_samples": len(train),
        "train_tokens": int(train.lengths.sum()),
        "train_words_tagged": int(train.targets_per_row.sum()),
        "data_path": "datasets.map tokenised (cached), padded per batch",
    }
    shape = DataShape(
        "tokens",
        num_classes=len(names),
        vocab_size=len(tokenizer),
        max_length=cfg.data.max_length,
        pad_id=tokenizer.pad_token_id,
    )
    return Splits.of(
        rows,
        shape,
        source,
        class_names=names,
        input_columns=[words],
        facts=facts,
        tokenizer=tokenizer,
        tokens_per_sample=float(train.lengths.mean()),
    )


def predict_tagged(dataset: str, column: str, tokenizer, max_length: int) -> tuple[TaggedRows, object, str]:
    """`anytrain predict`'s sentences (word lists), tokenised as in training, each row keeping its words."""
    ds, source = rows_to_predict(dataset)
    check_tagged(ds, column, None, source, "predict")
    encoded = encode(ds, tokenizer, column, None, {0: 0}, max_length, keep_words=True)
    return TaggedRows(encoded, tokenizer, None), ds, source


def word_tags(logits: torch.Tensor, word_ids: list[list[int]], words: list[list[str]], names: list[str]) -> list[dict]:
    """Each sentence's words with the tag predicted on their first sub-token (None for words cut by --max-length)."""
    best = logits.argmax(-1).tolist()
    rows = []
    for ids, row_words, row_best in zip(word_ids, words, best):
        tags: list[str | None] = [None] * len(row_words)
        seen = set()
        for position, word in enumerate(ids):
            if word >= 0 and word not in seen:
                seen.add(word)
                tags[word] = names[row_best[position]]
        rows.append({"words": row_words, "tags": tags})
    return rows
