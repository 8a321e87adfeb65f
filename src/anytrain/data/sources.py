"""Where data comes from: a name or path opened with `datasets` (or a datasets object passed in), its
splits named train/validation/test, missing ones carved from train, and what a path looks like before
it is read (text, images, the bundled sets). Every loader in data/ and `anytrain predict` open data here;
within a run's `shared_openings` (tasks/settle.load) each dataset is opened once, whoever asks first.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..config import ConfigError, TrainConfig, first_line
from .bundled import BUNDLED, DIGITS_PATH, LABELLED_TEXT, SHAKESPEARE_PATH, listed  # noqa: F401 - public here too

FILE_BUILDERS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json"}
VALIDATION_NAMES = ("validation", "valid", "val", "dev")
TEXT_SUFFIXES = (".txt",)


# --------------------------------------------------------------------------- what a path looks like


def is_text_dataset(dataset: str, text_column: str) -> bool:
    """Plain text to model: the bundled Shakespeare, a .txt file, a folder holding .txt files and no
    images (a folder that holds images is an image folder, its stray notes.txt skipped), or a named
    text column."""
    if (dataset in BUNDLED and BUNDLED[dataset].text) or text_column or dataset.lower().endswith(TEXT_SUFFIXES):
        return True
    path = Path(dataset).expanduser()
    if not path.is_dir():
        return False
    suffixes = {p.suffix.lower() for p in visible_files(path)}
    return bool(suffixes.intersection(TEXT_SUFFIXES)) and not suffixes & image_suffixes()


def visible_files(folder: Path) -> list[Path]:
    """A folder's files, subfolders included, as datasets reads a folder: hidden files and folders
    (.name) and __name folders are left out. Sorted, so what is reported is stable."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        found += [Path(root, f) for f in sorted(files) if not f.startswith(".")]
    return found


# Every split keyword of datasets' default data-file patterns (train, training, validation, valid, val, dev, test,
# testing, eval, evaluation) holds one of these; its other patterns need a data/ folder or these file names.
SPLIT_WORDS = ("train", "val", "dev", "test")
SPECIAL_NAMES = ("data", "task.toml", "instruction.md")


def unsplit_files(folder: Path) -> dict[str, str] | None:
    """{'train': '**'}, datasets' own answer for a folder in which no file or folder is named for a split, found in
    one walk; None (datasets infers the splits) where a name might hold a split. datasets globs the whole tree once
    per pattern it tries, 66 times before it settles on '**': 1.9 s for the 1,797 digits, 26 s for 20,000 files,
    every run and every rank."""
    for root, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            if any(word in name.lower() for word in SPLIT_WORDS) or name in SPECIAL_NAMES:
                return None
    return {"train": "**"}


@functools.cache
def image_suffixes() -> frozenset[str]:
    """The file suffixes datasets' imagefolder reads as images (.png, .jpg, ...), lower case."""
    from datasets.packaged_modules.imagefolder.imagefolder import IMAGE_EXTENSIONS

    return frozenset(IMAGE_EXTENSIONS)


METADATA_NAMES = ("metadata.csv", "metadata.jsonl", "metadata.parquet")  # imagefolder's extra columns
TABLE_SUFFIXES = (".parquet", ".csv", ".json", ".jsonl", ".arrow")  # a folder holding these is a table folder
SHOWN_SKIPPED = 5  # skipped files named in the start-up line; the summary lists them all


@dataclass
class ImageFolder:
    """A folder that holds images and no tables (besides imagefolder's metadata files), read with
    datasets' imagefolder: one subfolder per class. Its other files are skipped, and counted."""

    path: Path
    classes: list[str]  # the folders the images lie in, by name: datasets' class labels
    depths: int  # how many different folder depths the images lie at (labels need one)
    skipped: list[str]  # files that are neither images nor metadata, relative to path
    metadata: bool  # a metadata.csv/jsonl/parquet gives the columns (and labels) instead of the folders

    @classmethod
    def scan(cls, dataset: str) -> ImageFolder | None:
        """The folder's facts, or None when `dataset` is not a folder of images."""
        path = Path(dataset).expanduser()
        if not path.is_dir() or (path / "dataset_dict.json").exists() or (path / "state.json").exists():
            return None
        files = [p.relative_to(path) for p in visible_files(path)]
        images = [p for p in files if p.suffix.lower() in image_suffixes()]
        metadata = [p for p in files if p.name in METADATA_NAMES]
        tables = [p for p in files if p.suffix.lower() in TABLE_SUFFIXES and p.name not in METADATA_NAMES]
        if not images or tables:
            return None
        kept = {*images, *metadata, *(p for p in files if p.suffix.lower() == ".zip")}  # datasets opens zips
        skipped = sorted(p.as_posix() for p in files if p not in kept)
        classes = sorted({p.parent.name for p in images if p.parent != Path(".")})
        return cls(path, classes, len({len(p.parts) for p in images}), skipped, bool(metadata))

    def check_classes(self) -> None:
        """A classifier needs at least two class folders, every image in one of them."""
        if self.metadata or (len(self.classes) >= 2 and self.depths == 1):
            return
        needs = "a classifier needs at least 2, one subfolder of images per class"
        if len(self.classes) >= 2:
            raise ConfigError(
                f"--dataset: the images of {self.path} lie at different folder depths, so they have no class "
                f"folders; {needs} ({self.path}/CLASS/IMAGE)"
            )
        if self.classes:
            raise ConfigError(f"--dataset: {self.path} holds one class folder ({self.classes[0]}); {needs}")
        raise ConfigError(f"--dataset: {self.path} holds images but no class folders; {needs}")

    def note(self) -> str | None:
        """The start-up line about the skipped files (None when there are none)."""
        if not self.skipped:
            return None
        count = len(self.skipped)
        more = f" and {count - SHOWN_SKIPPED} more" if count > SHOWN_SKIPPED else ""
        shown = ", ".join(self.skipped[:SHOWN_SKIPPED]) + more
        files = "1 file that is not an image" if count == 1 else f"{count} files that are not images"
        return f"skipped {files} in {self.path}: {shown}"


# --------------------------------------------------------------------------- opening

# {(name, streaming): (dataset, its name)} of the datasets opened so far in a run's shared_openings; None outside
OPENINGS: ContextVar[dict | None] = ContextVar("anytrain_openings", default=None)


@contextmanager
def shared_openings() -> Iterator[dict]:
    """Within it, open_dataset opens each (name, streaming) once and gives the same dataset to whoever asks
    again: a run's dataset is opened once, when --task auto looks at it (data/describe.Source) and when the
    task loads its data (tasks/settle.load)."""
    openings: dict = {}
    token = OPENINGS.set(openings)
    try:
        yield openings
    finally:
        OPENINGS.reset(token)


def open_dataset(name: str, streaming: bool = False, folder=None):
    """(Dataset or DatasetDict, its name for messages) for a name or path (read_dataset), the one already
    opened within shared_openings."""
    openings = OPENINGS.get()
    if openings is None:
        return read_dataset(name, streaming, folder)
    if (name, streaming) not in openings:
        openings[name, streaming] = read_dataset(name, streaming, folder)
    return openings[name, streaming]


def bundled(name: str):
    """(Dataset or DatasetDict, its name for messages) of a bundled dataset's name (bundled.BUNDLED), else None."""
    found = BUNDLED.get(name)
    return None if found is None else found.open(name)


def read_dataset(name: str, streaming: bool = False, folder=None):
    """(Dataset or DatasetDict, its name for messages) for a name or path; with streaming, IterableDataset(Dict)
    where datasets can stream it. A folder of images (ImageFolder, `folder` when already scanned) is
    read with datasets' imagefolder. ConfigError naming --dataset when it cannot be read."""
    import datasets

    datasets.disable_progress_bars()  # one tqdm bar per run is enough
    found = bundled(name)
    if found is not None:
        return found
    path = Path(name).expanduser()
    try:
        if path.is_dir():
            return read_folder(path, streaming, folder), str(path)
        if path.is_file():
            builder = FILE_BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise ConfigError(
                    f"--dataset: {name}: unsupported file type '{path.suffix}' (use {', '.join(FILE_BUILDERS)} or a "
                    "save_to_disk folder)"
                )
            if path.stat().st_size == 0:
                raise ConfigError(f"--dataset: {name} is empty")
            if builder in ("csv", "json"):
                check_utf8(path, name)
            return datasets.load_dataset(builder, data_files=str(path), streaming=streaming), str(path)
    except ConfigError:
        raise
    except Exception as e:  # datasets/pyarrow raise many kinds for unreadable files
        if "corresponds to no data" in str(e):
            raise ConfigError(f"--dataset: {name} has no rows") from None
        raise ConfigError(f"--dataset: cannot read {name}: {first_line(e)}") from None
    if path.suffix.lower() in FILE_BUILDERS or name.startswith((".", "/", "~")):
        raise ConfigError(f"--dataset: file not found: {name}")
    try:
        return datasets.load_dataset(name, streaming=streaming), f"hub:{name}"
    except Exception as e:
        raise ConfigError(
            f"--dataset: '{name}' is not a bundled dataset ({listed()}), a local file or folder, and loading it from "
            f"the hub failed: {first_line(e)}"
        ) from None


def read_folder(path: Path, streaming: bool, folder=None):
    """A folder: saved with save_to_disk, of images (by its images, not by its most common suffix: a stray notes.txt
    does not make it text), or of data files datasets reads."""
    import datasets

    if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
        return datasets.load_from_disk(str(path))
    if folder or ImageFolder.scan(str(path)):
        return datasets.load_dataset(
            "imagefolder", data_dir=str(path), data_files=unsplit_files(path), streaming=streaming
        )
    return datasets.load_dataset(str(path), streaming=streaming)


def check_utf8(path: Path, name: str, chunk: int = 2**20) -> None:
    """A text file (csv, json, txt) must be UTF-8: else one line naming the file, the line and the byte
    (datasets would fail later, or not at all, with a traceback)."""
    import codecs

    decoder, line, done = codecs.getincrementaldecoder("utf-8")(), 1, 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as e:
                where = block[: e.start]
                at_line, column = line + where.count(b"\n"), e.start - where.rfind(b"\n")
                raise ConfigError(
                    f"--dataset: {name} is not UTF-8 text: byte 0x{block[e.start]:02x} at line {at_line}, column "
                    f"{column} (save it as UTF-8)"
                ) from None
            line, done = line + block.count(b"\n"), done + len(block)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise ConfigError(
                f"--dataset: {name} is not UTF-8 text: it ends inside a character (save it as UTF-8)"
            ) from None


def opened(cfg: TrainConfig, given=None) -> tuple[dict, str]:
    """({split: dataset}, source) of the run's dataset, or of `given` (a datasets object)."""
    if given is not None:
        return named_splits(given), f"{type(given).__name__} object"
    raw, source = open_dataset(cfg.data.dataset)
    return named_splits(raw), source


def named_splits(raw) -> dict:
    """Map a Dataset or DatasetDict onto train/validation/test; absent ones are carved from train later."""
    import datasets

    if isinstance(raw, (datasets.Dataset, datasets.IterableDataset)):
        return {"train": raw}
    if not isinstance(raw, (datasets.DatasetDict, datasets.IterableDatasetDict, dict)):
        raise ConfigError(f"dataset: expected a datasets.Dataset or DatasetDict, got {type(raw).__name__}")
    names = {k.lower(): k for k in raw}
    if "train" not in names:
        if len(raw) != 1:
            raise ConfigError(f"--dataset: no 'train' split among {', '.join(raw.keys())}")
        return {"train": next(iter(raw.values()))}
    out = {"train": raw[names["train"]]}
    for alias in VALIDATION_NAMES:
        if alias in names:
            out["validation"] = raw[names[alias]]
            break
    if "test" in names:
        out["test"] = raw[names["test"]]
    return out


def rows_to_predict(dataset: str):
    """(the split `anytrain predict` reads: test when the file has several, else its only one; its name)."""
    raw, source = open_dataset(dataset)
    splits = named_splits(raw)
    return (splits.get("test", splits["train"]) if len(splits) > 1 else splits["train"]), source


def as_stream(ds):
    import datasets

    return ds.to_iterable_dataset() if isinstance(ds, datasets.Dataset) else ds


# --------------------------------------------------------------------------- splitting and reading


def carve(parts: dict, cfg: TrainConfig, source: str, take=lambda x, idx: x[idx]) -> dict:
    """Carve the missing validation/test splits from train with a seeded permutation; parts maps
    split -> (inputs, labels tensor), and take(inputs, idx) selects rows of the inputs."""
    x, y = parts["train"]
    fractions = {
        name: getattr(cfg.data, f"{'val' if name == 'validation' else 'test'}_fraction")
        for name in ("validation", "test")
        if name not in parts
    }
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(cfg.run.seed))
    start = 0
    for name, fraction in fractions.items():
        count = math.floor(len(y) * fraction)
        if count == 0:
            raise ConfigError(
                f"--dataset: {source} has no {name} split and {name} fraction {fraction} of {len(y)} rows leaves it "
                "empty"
            )
        idx = order[start : start + count]
        parts[name] = (take(x, idx), y[idx])
        start += count
    if start:
        idx = order[start:].sort().values  # keep the remaining training rows in their original order
        parts["train"] = (take(x, idx), y[idx])
    for name, (_, labels) in parts.items():
        if len(labels) == 0:
            raise ConfigError(f"--dataset: the {name} split of {source} is empty")
    return parts


def carve_rows(splits: dict, cfg: TrainConfig, source: str) -> dict:
    """{split: dataset} with the missing splits carved from train (datasets rows selected, no labels)."""
    rows = {name: (ds, torch.zeros(len(ds))) for name, ds in splits.items()}
    return {k: ds for k, (ds, _) in carve(rows, cfg, source, lambda d, i: d.select(i.tolist())).items()}


def numeric_rows(column: pa.ChunkedArray) -> np.ndarray:
    """A numeric column, scalar or (nested) fixed-length lists, as float32 rows x values."""
    rows, values = len(column), column.combine_chunks()
    while (
        pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or pa.types.is_fixed_size_list(values.type)
    ):
        lengths = pc.list_value_length(values)
        if values.null_count or (len(lengths) and pc.min_max(lengths)["min"] != pc.min_max(lengths)["max"]):
            raise ValueError("missing or ragged lists")
        values = values.flatten()
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_boolean(values.type)):
        raise TypeError(f"{values.type} is not numeric")
    return values.to_numpy(zero_copy_only=False).astype(np.float32).reshape(rows, -1)
