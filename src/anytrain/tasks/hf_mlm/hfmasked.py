"""Text for a masked language model (tasks/hf_mlm/): tokenised as for any transformers model
(data/hftext.py), then masked by transformers' standard collator, DataCollatorForLanguageModeling
(15 % of the non-special tokens chosen; of those 80 % become [MASK], 10 % a random token, 10 % stay),
with its random generator seeded per row from (seed, split, epoch, row index).

Per row, not per batch: a row's masks are then the same whichever batch, rank or accumulation step it
lands in, so 1 rank equals 2 and accumulation equals the big batch, and a resumed epoch masks exactly as
the interrupted one did; each epoch draws new masks; validation and test keep one fixed draw. The
labels are the original ids at the chosen positions and -100 elsewhere (padding included)."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import torch

from ...config import ConfigError, TrainConfig
from ...data.hftext import HFRows, load_hf_splits
from ...data.splits import Splits
from ...shape import IGNORE

MASKED_SHARE = 0.15  # BERT's, transformers' default


def row_seed(seed: int, split: str, epoch: int, index: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{split}/{epoch}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


class MaskedRows(HFRows):
    """Tokenised texts whose batches come masked: (inputs with masks, labels at the masked positions)."""

    def __init__(self, rows: HFRows, split: str, seed: int):
        from transformers import DataCollatorForLanguageModeling

        super().__init__(rows.encoded, None, rows.tokenizer, rows.multiple)
        self.split, self.seed, self.epoch = split, seed, 0
        self.collator = DataCollatorForLanguageModeling(rows.tokenizer, mlm_probability=MASKED_SHARE)
        self.specials = torch.tensor(sorted(rows.tokenizer.all_special_ids))

    def set_epoch(self, epoch: int) -> None:
        """A new draw per training epoch. Validation and test keep one draw: accelerate's loader also calls this,
        with its count of passes over the split, which starts again after a resume."""
        if self.split == "train":
            self.epoch = epoch

    def mask(self, ids: torch.Tensor, index: int, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One row's real tokens masked by the standard collator, its generator seeded for this row and epoch."""
        self.collator.generator = torch.Generator().manual_seed(row_seed(self.seed, self.split, epoch, index))
        special = torch.isin(ids, self.specials)
        inputs, labels = self.collator.torch_mask_tokens(ids[None].clone(), special[None])
        return inputs[0], labels[0]

    def __getitems__(self, indices: list[int]):
        inputs, targets = super().__getitems__(indices)
        ids = inputs["input_ids"]
        for row, index in enumerate(indices):
            real = int(self.lengths[index])  # padding is at the end
            ids[row, :real], targets[row, :real] = self.mask(ids[row, :real], index, self.epoch)
        return inputs, targets

    def masked_per_row(self, epoch: int) -> np.ndarray:
        """How many tokens of each row this epoch masks: the targets each row adds to its step's loss."""
        counts = np.zeros(len(self), dtype=np.int64)
        for index in range(len(self)):
            ids = torch.tensor(self.encoded[index]["input_ids"])
            counts[index] = int((self.mask(ids, index, epoch)[1] != IGNORE).sum())
        return counts


def masked_splits(cfg: TrainConfig, tokenizer, given=None) -> Splits:
    """The texts read, checked, split and tokenised as for any transformers model, each split masked per row."""
    if tokenizer.mask_token is None:
        raise ConfigError(f"--model {cfg.model.name}: its tokenizer has no mask token, which a masked LM needs")
    data = load_hf_splits(cfg, tokenizer, given, column=cfg.data.text_column)
    rows = {name: MaskedRows(getattr(data, name), name, cfg.run.seed) for name in ("train", "validation", "test")}
    facts = {**data.facts, "masked_share": MASKED_SHARE, "masking": "DataCollatorForLanguageModeling, seeded per row"}
    return dataclasses.replace(data, train=rows["train"], validation=rows["validation"], test=rows["test"], facts=facts)
