"""Text for language modelling: load it with `datasets`, build the vocabulary from the training
text, hold each split's tokens once as a compact integer array, and serve windows of it.

Every source goes through `datasets` like the tabular data: the bundled Shakespeare and `.txt`
files through its `text` builder (one row per file), parquet/json/csv/hub datasets through their
text column. A split's documents are joined with a newline. Without a validation split, the last
`--val-fraction` of the characters validate (the first 90 % train by default: nanoGPT's split).

A training sample is a window of block_size + 1 tokens starting at any position (inputs are its
first block_size tokens, targets the same shifted by one); the DataLoader draws start positions
through accelerate's seedable sampler like any other dataset, which keeps exact resume and the
1-vs-2-rank equivalences. Validation uses a fixed set of windows: every non-overlapping one, or
`--eval-windows` of them evenly spread, the same on any number of ranks.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import torch

from ..config import ConfigError, TrainConfig, first_line
from ..files import atomic_path
from ..shape import DataShape
from .bundled import SHAKESPEARE_PATH  # noqa: F401 - where the tests and the SFT peer job find the text
from .sources import check_utf8, named_splits, open_dataset
from .splits import Rows, Splits
from .tokenizer import Vocab, bpe_for_run

MAX_CHAR_VOCAB = 256  # --vocab auto: a larger training alphabet falls back to bytes
MEMMAP_TOKENS = 64 * 2**20  # a split with more tokens than this is written to a cache file and memory-mapped
CHUNK_DOCS = 1024  # documents read from Arrow at a time


class TokenWindows(Rows):
    """Windows of block_size + 1 tokens of one token array; `__getitems__` cuts a whole batch at once."""

    def __init__(self, tokens: np.ndarray, block_size: int, starts: np.ndarray | None = None):
        self.tokens, self.block_size = tokens, block_size
        self.starts = starts  # None: every position is a window start
        self._offsets = np.arange(block_size + 1)

    def __len__(self) -> int:
        return len(self.tokens) - self.block_size if self.starts is None else len(self.starts)

    def __getitem__(self, index: int):
        inputs, targets = self.__getitems__([index])
        return inputs[0], targets[0]

    def __getitems__(self, indices: list[int]):
        starts = np.asarray(indices, dtype=np.int64)
        if self.starts is not None:
            starts = self.starts[starts]
        rows = torch.from_numpy(self.tokens[starts[:, None] + self._offsets].astype(np.int64))
        return rows[:, :-1], rows[:, 1:].contiguous()

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def set_epoch(self, epoch: int) -> None:
        """Nothing random to redraw (the sampler picks the windows)."""


def text_facts(vocab, train: TokenWindows, validation: TokenWindows) -> dict:
    return {
        "vocab_kind": vocab.kind,
        "vocab_size": vocab.size,
        "train_tokens": train.num_tokens,
        "validation_tokens": validation.num_tokens,
        "validation_windows": len(validation),
        "data_path": "memory-mapped token file" if isinstance(train.tokens, np.memmap) else "in-memory token array",
    }


# --------------------------------------------------------------------------- loading


def lm_column(cfg: TrainConfig) -> str:
    """The column of text a language model learns: --text-column, 'text' when it is left empty."""
    return cfg.data.text_column or "text"


def load_text_splits(cfg: TrainConfig, given=None) -> Splits:
    """Load the text named by cfg.data.dataset (or `given`, a datasets object), build the vocabulary,
    tokenise; ConfigError on bad input."""
    if given is not None:
        splits, source = named_splits(given), f"{type(given).__name__} object"
    else:
        splits, source = _load_text_datasets(cfg)
    column = lm_column(cfg)
    pieces = {name: _split_text(ds, column, source, name) for name, ds in splits.items()}
    if "validation" not in pieces:
        ds, _, stop = pieces["train"]
        cut = int(stop * (1 - cfg.data.val_fraction))  # the first (1 - val_fraction) of the characters train
        pieces["train"], pieces["validation"] = (ds, 0, cut), (ds, cut, stop)
    vocab = choose_vocab(cfg, pieces, source)
    tokens = {name: _tokens(vocab, ds, start, stop, column) for name, (ds, start, stop) in pieces.items()}
    for name, array in tokens.items():
        if len(array) < cfg.data.block_size + 1:
            raise ConfigError(
                f"--block-size: the {name} split of {source} has {len(array)} tokens, fewer than block_size + 1 = "
                f"{cfg.data.block_size + 1}"
            )
    train = TokenWindows(tokens["train"], cfg.data.block_size)
    validation = TokenWindows(tokens["validation"], cfg.data.block_size, eval_starts(len(tokens["validation"]), cfg))
    test = (
        TokenWindows(tokens["test"], cfg.data.block_size, eval_starts(len(tokens["test"]), cfg))
        if "test" in tokens
        else None
    )
    return Splits(
        train,
        validation,
        test,
        DataShape("text", vocab_size=vocab.size, block_size=cfg.data.block_size),
        source,
        facts=text_facts(vocab, train, validation),
        metadata={"vocab": vocab.to_dict()},
        files=vocab.files(),
        tokenizer=vocab,
        tokens_per_sample=float(cfg.data.block_size),
    )


def eval_starts(num_tokens: int, cfg: TrainConfig) -> np.ndarray:
    """Start positions of the fixed evaluation windows: all non-overlapping ones, or N spread evenly."""
    last = num_tokens - cfg.data.block_size - 1  # the last start whose window fits
    if cfg.eval.eval_windows:
        return np.unique(np.linspace(0, last, cfg.eval.eval_windows).round().astype(np.int64))
    return np.arange(0, last + 1, cfg.data.block_size, dtype=np.int64)


def _load_text_datasets(cfg: TrainConfig) -> tuple[dict, str]:
    import datasets

    datasets.disable_progress_bars()
    name = cfg.data.dataset
    path = Path(name).expanduser()
    try:
        if path.is_file() and path.suffix.lower() == ".txt":
            if path.stat().st_size == 0:
                raise ConfigError(f"--dataset: {name} is empty")
            check_utf8(path, name)
            return named_splits(datasets.load_dataset("text", data_files=str(path), sample_by="document")), str(path)
        if path.is_dir() and not (path / "dataset_dict.json").exists() and not (path / "state.json").exists():
            files = sorted(str(p) for p in path.rglob("*.txt") if p.is_file())
            for file in files:
                check_utf8(Path(file), file)
            if files:  # a folder of .txt files: one document each, in name order
                return named_splits(
                    datasets.load_dataset("text", data_files={"train": files}, sample_by="document")
                ), str(path)
    except ConfigError:
        raise
    except Exception as e:  # undecodable bytes and other read errors
        raise ConfigError(f"--dataset: cannot read {name}: {first_line(e)}") from None
    if name.lower().endswith(".txt"):
        raise ConfigError(f"--dataset: file not found: {name}")
    raw, source = open_dataset(name)
    return named_splits(raw), source


def _split_text(ds, column: str, source: str, split: str):
    """Check the text column; returns (dataset, 0, number of characters of the joined text)."""
    import datasets

    if column not in ds.column_names:
        raise ConfigError(f"--text-column: column '{column}' not in {source} (columns: {', '.join(ds.column_names)})")
    feature = ds.features[column]
    if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
        raise ConfigError(f"--text-column: column '{column}' of {source} is not text ({feature})")
    lengths = pc.utf8_length(ds.with_format("arrow")[column].combine_chunks().fill_null(""))
    total = int(pc.sum(lengths).as_py() or 0) + max(len(ds) - 1, 0)  # documents joined by one newline
    if total == 0 or not any(text.strip() for text in _chunks(ds, column, 0, total)):
        raise ConfigError(f"--dataset: the {split} split of {source} holds no text (empty or whitespace only)")
    return ds, 0, total


def _chunks(ds, column: str, start: int, stop: int):
    """Characters [start, stop) of the split's documents joined by newlines, in pieces."""
    offset = 0
    for first in range(0, len(ds), CHUNK_DOCS):
        docs = ds.with_format("arrow")[first : first + CHUNK_DOCS][column].to_pylist()
        text = ("\n" if first else "") + "\n".join(d or "" for d in docs)
        lo, hi = max(start - offset, 0), min(stop - offset, len(text))
        if lo < hi:
            yield text[lo:hi]
        offset += len(text)
        if offset >= stop:
            return


def choose_vocab(cfg: TrainConfig, pieces: dict, source: str):
    """--tokenizer: a BPE trained on the training text; else its characters, unless the alphabet is large
    or misses validation/test characters (then bytes)."""
    if cfg.data.tokenizer == "bpe":
        ds, start, stop = pieces["train"]
        return bpe_for_run(cfg, lambda: _chunks(ds, lm_column(cfg), start, stop), source)
    if cfg.data.tokenizer == "byte":
        return Vocab("byte")
    train_chars = set().union(*(set(t) for t in _chunks(pieces["train"][0], lm_column(cfg), *pieces["train"][1:])))
    other = {
        name: set().union(*(set(t) for t in _chunks(ds, lm_column(cfg), a, b)))
        for name, (ds, a, b) in pieces.items()
        if name != "train"
    }
    unknown = sorted(set().union(*other.values()) - train_chars)
    if cfg.data.tokenizer == "char":
        if unknown:
            raise ConfigError(
                f"--tokenizer char: the training text lacks characters the other splits use "
                f"({''.join(unknown)[:40]!r}); use --tokenizer byte or bpe"
            )
        if len(train_chars) > 65535:
            raise ConfigError(
                f"--tokenizer char: {source} has {len(train_chars)} distinct characters, too many; use --tokenizer "
                "byte or bpe"
            )
    elif unknown or len(train_chars) > MAX_CHAR_VOCAB:
        return Vocab("byte")
    return Vocab("char", "".join(sorted(train_chars)))


def _tokens(vocab: Vocab, ds, start: int, stop: int, column: str) -> np.ndarray:
    """The piece's tokens as one compact array: in memory, or memory-mapped from a cache file when large."""
    estimate = stop - start if vocab.kind == "char" else None
    if estimate is not None and estimate <= MEMMAP_TOKENS:
        return np.concatenate([vocab.encode(t) for t in _chunks(ds, column, start, stop)] or [np.zeros(0, vocab.dtype)])
    key = hashlib.sha256(f"{ds._fingerprint}|{column}|{start}|{stop}|{vocab.to_json()}".encode()).hexdigest()[:24]
    path = token_cache_dir() / f"{key}.{np.dtype(vocab.dtype).name}"
    if not path.exists():
        with atomic_path(path) as tmp, open(tmp, "wb") as f:  # whole or absent: another rank (or run) may read it next
            f.writelines(vocab.encode(text).tobytes() for text in _chunks(ds, column, start, stop))
    if path.stat().st_size == 0:  # an empty piece cannot be mapped; the length check then names it
        return np.zeros(0, vocab.dtype)
    tokens = np.memmap(path, dtype=vocab.dtype, mode="r")
    if estimate is None and len(tokens) <= MEMMAP_TOKENS:
        return np.array(tokens)  # small after all (bytes): hold it in memory
    return tokens


def token_cache_dir() -> Path:
    import datasets

    folder = Path(datasets.config.HF_DATASETS_CACHE) / "anytrain_tokens"
    folder.mkdir(parents=True, exist_ok=True)
    return folder
