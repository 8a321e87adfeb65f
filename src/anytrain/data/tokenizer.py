"""The run's tokenizers: characters or bytes (`Vocab`) and byte-level BPE (`--tokenizer bpe`, trained with
Hugging Face `tokenizers` on the training split only), and the one way a run's tokenizer is read back
(predict, sample, a resumed run).

The BPE starts from the 256 byte symbols (GPT-2's byte-level alphabet), so every text encodes and
decodes exactly, whatever its alphabet, and learns merges until it has `--vocab-size` tokens. Its
training is deterministic (the same text gives the same tokenizer, on any number of threads), so every
rank trains the same one. It is saved in the run folder as `tokenizer.json` when the run starts; the
weights' metadata names the file and its sha256, so a changed file is refused rather than used. A
resumed run reads it back instead of training again. Characters and UTF-8 bytes are `Vocab`: every
tokenizer a run can make (LM windows, text to classify) lives here, with one interface.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ..config import ConfigError, TrainConfig

TOKENIZER_FILE = "tokenizer.json"  # in the run folder, beside model.safetensors
BYTES = 256  # the byte-level alphabet every BPE vocabulary starts from


class Vocab:
    """Characters (the training text's alphabet, sorted) or UTF-8 bytes, to integer ids and back."""

    def __init__(self, kind: str, chars: str = ""):
        self.kind, self.chars = kind, chars
        self.size = 256 if kind == "byte" else len(chars)
        self.dtype = np.uint8 if self.size <= 256 else np.uint16
        codes = np.array([ord(c) for c in chars], dtype=np.int64)
        self._codes = codes  # sorted, since chars is

    def encode(self, text: str) -> np.ndarray:
        if self.kind == "byte":
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        ids = self.ids(text)
        if (ids < 0).any():
            unknown = sorted(set(c for c, i in zip(text, ids) if i < 0))
            raise KeyError("".join(unknown))
        return ids.astype(self.dtype)

    def ids(self, text: str) -> np.ndarray:
        """int64 ids of the text's characters (bytes), -1 where a character is not in the vocabulary."""
        if self.kind == "byte":
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        ids = np.searchsorted(self._codes, codes)
        ok = ids < self.size
        ok[ok] = self._codes[ids[ok]] == codes[ok]
        return np.where(ok, ids, -1)

    def ids_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.ids(text) for text in texts]

    def files(self) -> dict:
        """Nothing beside the weights: the characters travel in their metadata."""
        return {}

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        if self.kind == "byte":
            return bytes(ids).decode("utf-8", errors="replace")
        return "".join(self.chars[i] for i in ids)

    def to_dict(self) -> dict:
        """What the weights' metadata keeps (its "vocab")."""
        return {"kind": self.kind, "chars": self.chars}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict) -> Vocab:
        return cls(data["kind"], data.get("chars", ""))

    @classmethod
    def from_json(cls, text: str) -> Vocab:
        return cls.from_dict(json.loads(text))


class BPE:
    """A trained byte-level BPE with Vocab's interface: size, dtype, encode, decode, to_json."""

    kind = "bpe"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.size = tokenizer.get_vocab_size()
        self.dtype = np.uint16 if self.size <= 2**16 else np.uint32
        self.text = tokenizer.to_str()
        self.sha256 = hashlib.sha256(self.text.encode()).hexdigest()

    def encode(self, text: str) -> np.ndarray:
        return np.array(self.tokenizer.encode(text).ids, dtype=self.dtype)

    def ids_batch(self, texts: list[str]) -> list[np.ndarray]:
        """int64 ids of each text (encoded in parallel); BPE has no unknown tokens."""
        return [np.array(e.ids, dtype=np.int64) for e in self.tokenizer.encode_batch(texts)]

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def to_dict(self) -> dict:
        """What the weights' metadata keeps (its "vocab"): the file beside them and its sha256."""
        return {"kind": "bpe", "file": TOKENIZER_FILE, "sha256": self.sha256}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def files(self) -> dict:
        """The files this tokenizer needs in the run folder."""
        return {TOKENIZER_FILE: self.text}

    @classmethod
    def read(cls, path: Path, sha256: str | None = None) -> BPE:
        from tokenizers import Tokenizer

        try:
            bpe = cls(Tokenizer.from_str(path.read_text()))
        except Exception as e:  # noqa: BLE001 - a missing, unreadable or foreign file: one line
            raise ConfigError(f"run_dir: cannot read the run's BPE tokenizer {path} ({type(e).__name__})") from None
        if sha256 is not None and bpe.sha256 != sha256:
            raise ConfigError(f"run_dir: {path} is not the tokenizer this run was trained with (its sha256 differs)")
        return bpe


def train_bpe(texts, vocab_size: int, source: str, exact: bool = True) -> BPE:
    """A byte-level BPE of vocab_size tokens learned from `texts` (an iterable of strings or lists of
    them). When the text has too few distinct pairs left to merge for that many: ConfigError if exact,
    else the smaller vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    found = tokenizer.get_vocab_size()
    if exact and found < vocab_size:
        raise ConfigError(
            f"--vocab-size {vocab_size}: the training text of {source} supports at most {found} BPE tokens "
            f"({BYTES} bytes and {found - BYTES} merges, until every word is one token); use --vocab-size {found} or "
            "less"
        )
    return BPE(tokenizer)


def bpe_for_run(cfg: TrainConfig, texts, source: str, exact: bool = True) -> BPE:
    """The run's BPE: the one in the run folder when resuming (trained when the run started), else one
    trained on `texts()`, the training split's text."""
    saved = Path(cfg.run.output_dir) / TOKENIZER_FILE
    if cfg.run.resume and saved.is_file():
        return BPE.read(saved)
    return train_bpe(texts(), cfg.data.vocab_size, source, exact)


def read_tokenizer(data: dict, folder: Path):
    """The tokenizer saved with a run's weights (`data`, the metadata's "vocab"): a text.Vocab from the metadata,
    or the BPE in `folder`/tokenizer.json (checked against the sha256 the metadata holds)."""
    if data["kind"] != "bpe":
        return Vocab.from_dict(data)
    path = Path(folder) / data["file"]
    if not path.is_file():
        raise ConfigError(f"run_dir: {path} is missing: the run's BPE tokenizer is needed beside its weights")
    return BPE.read(path, data["sha256"])
