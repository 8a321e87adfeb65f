"""docs/guide.md's table of tasks: each registry line, its module or folder, its lines, what it builds on, the shared
data/ modules it reads with.

python scripts/task_table.py     # prints the Markdown rows the guide holds
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def data_helpers(paths: list[Path]) -> list[str]:
    """The shared data/ modules a task's files read their data with, from their imports."""
    found = {h for path in paths for h in re.findall(r"from \.+data\.(\w+) import", path.read_text())}
    return sorted(found - {"splits"})


def rows() -> list[str]:
    from anytrain.tasks import classes

    out = []
    for key, cls in classes().items():
        path = Path(inspect.getfile(cls))
        home = path if path.parent.name == "tasks" else path.parent  # a task's module, or its folder
        files = sorted(home.glob("*.py")) if home.is_dir() else [home]
        lines = sum(len(f.read_text().splitlines()) for f in files)
        name = f"tasks/{home.name}/" if home.is_dir() else f"tasks/{home.name}"
        bases = [b.__name__ for b in cls.__bases__ if b.__module__ != "anytrain.tasks.contract"]
        helpers = ", ".join(f"`data/{h}.py`" for h in data_helpers(files))
        out.append(f"| `{key}` | `{name}` | {lines} | {', '.join(bases) or '—'} | {helpers or '—'} |")
    return out


HEADER = (
    "| task (registry line) | module or folder | lines | builds on | shared data/ modules it reads with |\n"
    "|---|---|---|---|---|\n"
)


def write(guide: Path = ROOT / "docs" / "guide.md") -> None:
    text = guide.read_text()
    start = text.index(HEADER) + len(HEADER)
    end = text.index("\n\n", start)
    guide.write_text(text[:start] + "\n".join(rows()) + text[end:])


if __name__ == "__main__":
    if "--write" in sys.argv:
        write()
    print("\n".join(rows()))
