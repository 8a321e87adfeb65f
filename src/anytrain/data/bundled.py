"""The data that ships with anytrain: its files' paths and the bundled labelled text set's columns.
A leaf module: every other data module may read it, it reads none of them."""

from __future__ import annotations

from pathlib import Path

DIGITS_PATH = Path(__file__).with_name("digits.parquet")  # UCI handwritten digits (DIGITS_SOURCE.md)
SHAKESPEARE_PATH = Path(__file__).with_name("tinyshakespeare.txt")  # Tiny Shakespeare (SHAKESPEARE_SOURCE.md)
LABELLED_TEXT = {"shakespeare-speakers": ("text", "speaker")}  # bundled text-classification sets: (text, label)
NAMES = ("digits", "shakespeare-speakers", "instructions", "questions", "preferences", "tool-sums", "sum-questions")
