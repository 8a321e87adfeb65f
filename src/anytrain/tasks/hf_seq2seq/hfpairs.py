"""Source and target texts for a transformers encoder-decoder (tasks/hf_seq2seq/): a source column
(`--text-column`, default `source`) and a target column (`--label-column`, default `target`), each
checked as text, the missing splits carved, both tokenised by the model's own tokenizer (targets with
`text_target=`, truncated at --max-length like the sources). A batch is padded by transformers'
DataCollatorForSeq2Seq (targets with -100) and gets the decoder's inputs: the targets shifted right
behind the model's decoder start token, as the model itself makes them from labels."""

from __future__ import annotations

import numpy as np
import torch

from ...config import TrainConfig
from ...data.sources import carve_rows, opened, rows_to_predict
from ...data.splits import Rows, Splits
from ...data.textcls import check_texts
from ...shape import IGNORE, DataShape

SOURCE, TARGET = "source", "target"  # the columns when --text-column / --label-column are not given


def columns(cfg: TrainConfig) -> tuple[str, str]:
    return cfg.data.text_column or SOURCE, cfg.data.label_column if "label_column" in cfg.given else TARGET


class PairRows(Rows):
    """Tokenised sources and targets; `__getitems__` pads a batch and adds the decoder's inputs."""

    def __init__(self, encoded, tokenizer, multiple: int | None, decoder_start: int):
        self.encoded, self.tokenizer, self.multiple, self.decoder_start = encoded, tokenizer, multiple, decoder_start
        self.lengths = np.array([len(ids) for ids in encoded["input_ids"]], dtype=np.int64)
        has_targets = "labels" in encoded.column_names
        self.targets_per_row = np.array([len(t) for t in encoded["labels"]] if has_targets else [], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitems__(self, indices: list[int]):
        from transformers import DataCollatorForSeq2Seq

        rows = self.encoded[indices]
        features = [{k: rows[k][i] for k in rows} for i in range(len(indices))]
        collate = DataCollatorForSeq2Seq(self.tokenizer, label_pad_token_id=IGNORE, pad_to_multiple_of=self.multiple)
        batch = dict(collate(features))
        targets = batch.pop("labels", None)
        if targets is None:  # predict: sources only
            return batch, torch.zeros(len(indices), dtype=torch.long)
        decoder = targets.new_full(targets.shape, self.tokenizer.pad_token_id)
        decoder[:, 1:] = targets[:, :-1].masked_fill(targets[:, :-1] == IGNORE, self.tokenizer.pad_token_id)
        decoder[:, 0] = self.decoder_start
        return {**batch, "decoder_input_ids": decoder}, targets

    def set_epoch(self, epoch: int) -> None:
        """Nothing is random in a pair's tokens."""


def encode(ds, tokenizer, source: str, target: str | None, max_length: int):
    def tokenise(batch):
        enc = tokenizer(batch[source], truncation=True, max_length=max_length)
        if target is not None:
            enc["labels"] = tokenizer(text_target=batch[target], truncation=True, max_length=max_length)["input_ids"]
        return enc

    return ds.map(tokenise, batched=True, remove_columns=ds.column_names, desc="tokenising pairs")


def pair_splits(cfg: TrainConfig, tokenizer, decoder_start: int, given=None, multiple: int | None = None) -> Splits:
    """The pairs read, checked, carved and tokenised: Splits whose batches are (model inputs, target ids)."""
    splits, source_name = opened(cfg, given)
    source, target = columns(cfg)
    for name, ds in splits.items():
        check_texts(ds, source, source_name, name, label_column=target)
        check_texts(ds, target, source_name, name, flag="--label-column")
    parts = carve_rows(splits, cfg, source_name)
    rows = {
        name: PairRows(encode(ds, tokenizer, source, target, cfg.data.max_length), tokenizer, multiple, decoder_start)
        for name, ds in parts.items()
    }
    train = rows["train"]
    facts = {
        "tokenizer": f"{type(tokenizer).__name__} (the model's own)",
        "train_samples": len(train),
        "train_source_tokens": int(train.lengths.sum()),
        "train_target_tokens": int(train.targets_per_row.sum()),
        "truncated_train_targets": int((train.targets_per_row >= cfg.data.max_length).sum()),
        "data_path": "datasets.map tokenised (cached), padded per batch",
    }
    shape = DataShape(
        "tokens", vocab_size=len(tokenizer), max_length=cfg.data.max_length, pad_id=tokenizer.pad_token_id
    )
    return Splits.of(
        rows,
        shape,
        source_name,
        input_columns=[source],
        facts=facts,
        tokenizer=tokenizer,
        tokens_per_sample=float((train.lengths + train.targets_per_row).mean()),
    )


def predict_pairs(dataset: str, column: str, tokenizer, max_length: int) -> tuple[PairRows, object, str]:
    """`anytrain predict`'s sources, tokenised as in training."""
    ds, source_name = rows_to_predict(dataset)
    check_texts(ds, column, source_name, "predict")
    return PairRows(encode(ds, tokenizer, column, None, max_length), tokenizer, None, 0), ds, source_name
