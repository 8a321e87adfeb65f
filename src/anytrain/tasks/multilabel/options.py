"""multilabel's own options: a section of the config (`multilabel:` in YAML), flags in --help, part of the
resume check. Registered with the registry line (tasks/__init__.py); this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from ...config import UNIT, option


@dataclass(frozen=True)
class MultiLabelOptions:
    threshold: float = option(
        0.5, "a class is predicted when its probability is above this (saved with the weights)", bounds=UNIT
    )
