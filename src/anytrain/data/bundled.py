"""The registry of the datasets that ship with anytrain: each name's loader and what it holds, their files' paths,
and the names the messages list. A leaf module: every other data module may read it; it imports none of them,
each loader being named "module:function" and imported only when its dataset is opened."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

DIGITS_PATH = Path(__file__).with_name("digits.parquet")  # UCI handwritten digits (DIGITS_SOURCE.md)
SHAKESPEARE_PATH = Path(__file__).with_name("tinyshakespeare.txt")  # Tiny Shakespeare (SHAKESPEARE_SOURCE.md)


@dataclass(frozen=True)
class Bundled:
    """A bundled dataset: `loader`, "module:function" of anytrain.data, returns it (Dataset or DatasetDict); `about`
    says what it holds, its {FIELDS} the loader module's constants (ROWS: generated rows)."""

    loader: str
    about: str
    columns: tuple[str, str] | None = None  # a labelled text set's (text, label) columns, which it names itself
    text: bool = False  # plain text to model (--task lm), not rows

    def open(self, name: str):
        """(the dataset, its name for messages: "NAME (about)")."""
        module_name, function = self.loader.split(":")
        module = importlib.import_module(f"{__package__}.{module_name}")
        return getattr(module, function)(), f"{name} ({self.about.format_map(vars(module))})"


BUNDLED = {  # --dataset NAME: its loader and what it holds (docs/guide.md says more of each)
    "digits": Bundled("bundled:load_digits", "bundled UCI handwritten digits"),
    "shakespeare": Bundled("bundled:load_shakespeare", "bundled Tiny Shakespeare", text=True),
    "shakespeare-speakers": Bundled(
        "speakers:load_speakers", "bundled Tiny Shakespeare: who speaks, {NUM_SPEAKERS} speakers", ("text", "speaker")
    ),
    "instructions": Bundled("instructions:load_instructions", "bundled: {ROWS} generated chats with checkable answers"),
    "questions": Bundled(
        "instructions:load_questions", "bundled: {ROWS} generated questions, each with its checkable answer"
    ),
    "preferences": Bundled(
        "preferences:load_preferences", "bundled: {ROWS} generated preference pairs, the chosen answers checkable"
    ),
    "tool-sums": Bundled("sums:load_tool_sums", "bundled: {ROWS} generated chats that add with a tool"),
    "sum-questions": Bundled("sums:load_sum_questions", "bundled: {ROWS} generated sums, each with its answer"),
}
NAMES = tuple(BUNDLED)
LABELLED_TEXT = {name: found.columns for name, found in BUNDLED.items() if found.columns}  # text-classification sets


def listed() -> str:
    """The bundled names in the registry's order, as the messages list them: "digits, shakespeare, ..." (--help's list
    in config/sections.py is checked against NAMES by tests/test_data.py)."""
    return ", ".join(NAMES)


def load_digits():
    """The 1,797 UCI handwritten digits: 64 pixel columns (0-16) and the label, in the file's order."""
    import datasets

    return datasets.Dataset.from_parquet(str(DIGITS_PATH))


def load_shakespeare():
    """Tiny Shakespeare as one document, its only split train (the text loader carves validation and test)."""
    import datasets

    return datasets.load_dataset("text", data_files=str(SHAKESPEARE_PATH), sample_by="document")
