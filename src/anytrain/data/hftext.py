"""Text for a transformers model (`--model hf:...`): the dataset read and split as for any table,
tokenised by the model's own tokenizer with `datasets.map(batched=True)` (the trainer calls this
under `accelerator.main_process_first()`, so the main process tokenises and caches, and the other
ranks read its cache), then padded per batch by transformers' `DataCollatorWithPadding`
(`pad_to_multiple_of` 8 under fp16/bf16, for tensor cores).

A batch is `(inputs, targets)`: inputs a dict (input_ids, attention_mask, and token_type_ids where
the tokenizer makes them) that the loop passes as keyword arguments, targets a class id per text
(classify) or the input ids with -100 at padded positions (lm: the model shifts them itself).
"""

from __future__ import annotations

import numpy as np
import torch

from ..config import ConfigError, TrainConfig
from ..shape import IGNORE, DataShape
from .packing import PackedRows
from .sources import carve_rows, opened
from .splits import Rows, Splits
from .targets import labelled_rows
from .textcls import check_texts


class HFRows(Rows):
    """Tokenised texts and their targets; `__getitems__` pads a batch to its longest text (a multiple of
    `multiple`). For a language model the targets are the ids, -100 where padded."""

    def __init__(self, encoded, labels: torch.Tensor | None, tokenizer, multiple: int | None):
        self.encoded, self.labels = encoded, labels
        self.tokenizer, self.multiple = tokenizer, multiple
        self.lengths = np.array([len(ids) for ids in encoded["input_ids"]], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitems__(self, indices: list[int]):
        from transformers import DataCollatorWithPadding

        rows = self.encoded[indices]
        features = [{k: rows[k][i] for k in rows} for i in range(len(indices))]
        inputs = dict(DataCollatorWithPadding(self.tokenizer, pad_to_multiple_of=self.multiple)(features))
        if self.labels is not None:
            return inputs, self.labels[indices]
        return inputs, inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, IGNORE)

    def set_epoch(self, epoch: int) -> None:
        """Nothing is random in a text's tokens (the loop tells every dataset its epoch)."""

    @property
    def targets_per_row(self) -> np.ndarray:
        """Tokens each text contributes to a causal-LM loss: all but its first."""
        return self.lengths - 1


def load_hf_splits(
    cfg: TrainConfig,
    tokenizer,
    given=None,
    *,
    column: str,
    labelled: bool = False,
    whole: bool = False,
    multiple: int | None = None,
) -> Splits:
    """Read, check and split the dataset as for any labelled table (class labels when `labelled`), then
    tokenise every split with the model's tokenizer, truncated at --max-length; `whole`: each text whole, for a
    causal LM (lm_splits). Batches are padded to a `multiple` of their longest row (RunFacts.pad_multiple)."""
    splits, source = opened(cfg, given)
    if not column:
        raise ConfigError("--text-column: a transformers model needs the column that holds the text")
    label = cfg.data.label_column if labelled else None
    for name, ds in splits.items():
        check_texts(ds, column, source, name, label_column=label)
    if labelled:
        parts, num_classes, class_names = labelled_rows(splits, cfg, source)
    else:
        parts = {name: (ds, None) for name, ds in carve_rows(splits, cfg, source).items()}
        num_classes, class_names = 0, None
    if whole:
        return lm_splits(parts, cfg, tokenizer, source, column, multiple)

    def tokenise(batch):
        return tokenizer(batch[column], truncation=True, max_length=cfg.data.max_length)

    rows: dict[str, Rows] = {}
    for name, (ds, labels) in parts.items():
        encoded = ds.map(tokenise, batched=True, remove_columns=ds.column_names, desc=f"tokenising {name}")
        rows[name] = HFRows(encoded, labels, tokenizer, multiple)
    return hf_text_splits(rows, tokenizer, num_classes, class_names, cfg.data.max_length, source, [column])


def lm_splits(parts: dict, cfg: TrainConfig, tokenizer, source: str, column: str, multiple: int | None) -> Splits:
    """A causal LM's texts (`column`), tokenised whole: packed into rows (--packing, data/packing.py), else
    truncated at --max-length, the tokens that drops counted and said at start."""
    max_length = cfg.data.max_length
    rows: dict[str, Rows] = {}
    dropped: dict[str, tuple[int, int]] = {}
    for name, (ds, _) in parts.items():
        encoded = ds.map(
            lambda batch: tokenizer(batch[column]),
            batched=True,
            remove_columns=ds.column_names,
            desc=f"tokenising {name}",
        )
        lengths = np.array([len(ids) for ids in encoded["input_ids"]], dtype=np.int64)
        dropped[name] = (int(np.maximum(lengths - max_length, 0).sum()), int(lengths.sum()))
        if cfg.data.packing:
            rows[name] = PackedRows(encoded["input_ids"], max_length, tokenizer.pad_token_id)
        else:
            cut = encoded.map(lambda b: {k: [v[:max_length] for v in b[k]] for k in b}, batched=True, desc="truncating")
            rows[name] = HFRows(cut, None, tokenizer, multiple)
    splits = hf_text_splits(rows, tokenizer, 0, None, max_length, source, [column])
    lost, total = (0 if cfg.data.packing else dropped["train"][0]), dropped["train"][1]
    splits.facts["truncated_train_tokens"] = lost
    train = rows["train"]
    if isinstance(train, PackedRows):  # --packing
        splits.facts.update(packed_rows=len(train), packed_sequences=train.sequences, truncated_train_texts=0)
        splits.facts["data_path"] = "datasets.map tokenised (cached), packed into rows of --max-length"
    elif lost:
        splits.notes.append(
            f"--max-length {max_length} truncates the training texts: {lost:,} of {total:,} tokens "
            f"({lost / total:.1%}) are dropped (--packing splits long texts instead)"
        )
    return splits


def hf_text_splits(rows: dict, tokenizer, num_classes: int, class_names, max_length: int, source: str, columns):
    """Splits of tokenised rows: the tokens shape (for the checks that try a model on a batch of 2 ids) and facts."""
    train = rows["train"]
    per_text = float(train.lengths.mean())
    facts = {
        "tokenizer": f"{type(tokenizer).__name__} (the model's own)",
        "vocab_size": len(tokenizer),
        "num_classes": num_classes,
        "train_samples": len(train),
        "train_tokens": int(train.lengths.sum()),
        "mean_tokens_per_text": per_text,
        "truncated_train_texts": int((train.lengths >= max_length).sum()),
        "data_path": "datasets.map tokenised (cached), padded per batch",
    }
    shape = DataShape(
        "tokens",
        num_classes=num_classes,
        vocab_size=len(tokenizer),
        max_length=max_length,
        pad_id=tokenizer.pad_token_id,
    )
    return Splits.of(
        rows,
        shape,
        source,
        class_names=class_names,
        input_columns=columns,
        facts=facts,
        tokenizer=tokenizer,
        tokens_per_sample=per_text,
    )


def predict_hf_texts(dataset: str, columns: list[str], tokenizer, max_length: int) -> tuple[HFRows, object, str]:
    """`anytrain predict`'s texts, tokenised by a transformers run's own tokenizer as in training."""
    from .sources import rows_to_predict

    ds, source = rows_to_predict(dataset)
    check_texts(ds, columns[0], source, "predict")
    encoded = ds.map(
        lambda b: tokenizer(b[columns[0]], truncation=True, max_length=max_length),
        batched=True,
        remove_columns=ds.column_names,
    )
    return HFRows(encoded, torch.zeros(len(ds), dtype=torch.long), tokenizer, None), ds, source
