"""docs/guide.md's table of tasks: each registry line, its module, its lines, what it builds on, its data helpers.

python scripts/task_table.py     # prints the Markdown rows the guide holds
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def data_helpers(path: Path) -> list[str]:
    """The data/ modules a task module (and the task module it builds on) reads its data with, from its imports."""
    found = re.findall(r"from \.\.data\.(\w+) import", path.read_text())
    return sorted(set(found) - {"splits"})


def rows() -> list[str]:
    from anytrain.tasks import classes

    out = []
    for key, cls in classes().items():
        path = Path(inspect.getfile(cls))
        lines = len(path.read_text().splitlines())
        bases = [b.__name__ for b in cls.__bases__ if b.__module__ != "anytrain.tasks.contract"]
        helpers = ", ".join(f"`data/{h}.py`" for h in data_helpers(path))
        out.append(f"| `{key}` | `tasks/{path.name}` | {lines} | {', '.join(bases) or '—'} | {helpers or '—'} |")
    return out


HEADER = "| task (registry line) | module | lines | builds on | data helpers it calls |\n|---|---|---|---|---|\n"


def write(guide: Path = ROOT / "docs" / "guide.md") -> None:
    text = guide.read_text()
    start = text.index(HEADER) + len(HEADER)
    end = text.index("\n\n", start)
    guide.write_text(text[:start] + "\n".join(rows()) + text[end:])


if __name__ == "__main__":
    if "--write" in sys.argv:
        write()
    print("\n".join(rows()))
