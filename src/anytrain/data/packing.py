"""Packing (--packing) for a transformers causal LM: the tokenised texts of a split concatenated into rows
of exactly --max-length tokens, with no attention across texts and nothing truncated.

A text goes whole into the current row when it fits in the room left, else it starts the next row (the
rest of the row is padding); a text longer than --max-length is cut into pieces of --max-length tokens,
each its own sequence. In a row, the position ids restart at 0 for each sequence and the row carries no
attention mask: transformers then builds a causal mask per sequence from the position ids (for its SDPA
and eager attention; flash-attention is not needed), so a token attends to the tokens of its own text
only. The first token of each sequence is no target (label -100), as in a text of its own, so the
token-weighted loss of a packed batch equals that of the same texts padded one a row (tests/test_llm.py).
Chats (--task sft) come with their own labels (-100 outside the answers), which the rows keep.
"""

from __future__ import annotations

import numpy as np
import torch

from ..shape import IGNORE
from .splits import Rows


def pieces(lengths: np.ndarray, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(text index, start) of every piece of at most max_length tokens the texts are cut into."""
    counts = np.maximum(1, -(-lengths // max_length))
    texts = np.repeat(np.arange(len(lengths)), counts)
    firsts = np.cumsum(counts) - counts
    starts = (np.arange(counts.sum()) - np.repeat(firsts, counts)) * max_length
    return texts, starts


def row_layout(sizes: np.ndarray, max_length: int) -> np.ndarray:
    """The row of each sequence (next fit: a sequence that does not fit in the room left starts a new row)."""
    rows, row, used = np.empty(len(sizes), dtype=np.int64), 0, 0
    for k, size in enumerate(sizes.tolist()):
        if used + size > max_length:
            row, used = row + 1, 0
        rows[k], used = row, used + size
    return rows


class PackedRows(Rows):
    """Rows of max_length tokens: inputs {input_ids, position_ids} (no attention mask, unless the model needs the
    block-diagonal one: `mask`, set by the task from packed.keep_apart), targets the ids with -100 at each
    sequence's first token and on padding (and where `label_lists`, when given, say -100)."""

    mask = ""  # "", "mask" or "additive mask": packed.keep_apart's verdict on the model

    def __init__(self, token_lists: list[list[int]], max_length: int, pad_id: int, label_lists=None):
        lengths = np.array([len(ids) for ids in token_lists], dtype=np.int64)
        texts, starts = pieces(lengths, max_length)
        sizes = np.minimum(lengths[texts] - starts, max_length)
        keep = sizes > 0  # an empty text has nothing to pack
        texts, starts, sizes = texts[keep], starts[keep], sizes[keep]
        rows = row_layout(sizes, max_length)
        count = int(rows[-1]) + 1 if len(rows) else 0
        self.input_ids = torch.full((count, max_length), pad_id, dtype=torch.long)
        self.position_ids = torch.arange(max_length).repeat(count, 1)  # padding: a sequence of its own
        self.targets = torch.full((count, max_length), IGNORE, dtype=torch.long)
        used = np.zeros(count, dtype=np.int64)
        for text, start, size, row in zip(texts.tolist(), starts.tolist(), sizes.tolist(), rows.tolist()):
            at = int(used[row])
            ids = torch.tensor(token_lists[text][start : start + size], dtype=torch.long)
            self.input_ids[row, at : at + size] = ids
            self.position_ids[row, at : at + size] = torch.arange(size)
            labels = ids if label_lists is None else torch.tensor(label_lists[text][start : start + size])
            self.targets[row, at + 1 : at + size] = labels[1:]
            used[row] += size
        if count:
            tail = torch.arange(max_length) >= torch.as_tensor(used)[:, None]  # each row's padding
            self.position_ids[tail] = (torch.arange(max_length) - torch.as_tensor(used)[:, None])[tail]
        self.lengths = used  # real tokens per row
        self.sequences = len(sizes)

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitems__(self, indices: list[int]):
        index = torch.as_tensor(indices)
        inputs = {"input_ids": self.input_ids[index], "position_ids": self.position_ids[index]}
        return with_mask(inputs, self.mask), self.targets[index]

    def set_epoch(self, epoch: int) -> None:
        """Nothing is random in packed rows (the loop tells every dataset its epoch)."""

    @property
    def targets_per_row(self) -> np.ndarray:
        return (self.targets != IGNORE).sum(1).numpy()


def block_mask(position_ids: torch.Tensor, additive: bool, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, T, T): a token may attend to the tokens of its own text (a text starts where its position id is
    0) up to itself; True / 0.0 where it may, False / the dtype's lowest value where it may not."""
    text = (position_ids == 0).cumsum(1)
    length = position_ids.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    allowed = (text[:, :, None] == text[:, None, :]) & causal
    if not additive:
        return allowed[:, None]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=position_ids.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def with_mask(inputs: dict, mask: str) -> dict:
    """A packed batch's inputs, with the block-diagonal attention mask of its position ids where the model needs
    it ("mask": boolean, "additive mask": 0 or float32's lowest), else as they are."""
    if mask not in ("mask", "additive mask"):
        return inputs
    return {**inputs, "attention_mask": block_mask(inputs["position_ids"], mask == "additive mask", torch.float32)}
