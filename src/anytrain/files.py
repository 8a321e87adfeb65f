"""Whole-or-absent files: everything anytrain writes is written beside its place, then renamed into it.

A reader (or a kill mid-write) then sees the previous file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary name beside `path` to write to; renamed over `path` when the block ends without error."""
    path = Path(path)
    tmp = path.with_name(
        f".{path.name}.tmp-{os.getpid()}"
    )  # one per process: ranks writing the same file must not race
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomically(path: Path, data: str | bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data) if isinstance(data, bytes) else tmp.write_text(data)
