"""The house rules that keep a new task one module: every registered task fills in the whole written
contract (tasks/base.py Task), the package has no import cycles, config.py reads no data and data/
never reaches up into tasks/, and the config is frozen once made (a settled task is a new config)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from anytrain.config import TrainConfig
from anytrain.tasks import REGISTRY, Task, make_task

SRC = Path(__file__).resolve().parents[1] / "src" / "anytrain"


def test_every_registered_task_fills_in_the_whole_contract():
    members = [name for name in Task.__dict__ if not name.startswith("_")] + list(Task.__annotations__)
    for key, cls in REGISTRY.items():
        task = make_task(TrainConfig(), key)
        assert isinstance(task, Task), key  # runtime_checkable: every member is there
        for name in members:
            assert hasattr(task, name), (key, name)
            wanted = getattr(Task, name, None)
            if not callable(wanted):
                continue
            expected = list(inspect.signature(wanted).parameters)
            got = list(inspect.signature(getattr(cls, name)).parameters)
            assert got == expected, f"{key}.{name}{tuple(got)} differs from the contract's {tuple(expected)}"
        assert task.name == key.removeprefix("hf:").split("-")[0], key


def imports(path: Path) -> list[str]:
    """The modules of this package a file imports, at the top or inside functions, as dotted names."""
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    package = parts[:-1] if path.name != "__init__.py" else parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(package if path.name != "__init__.py" else parts[:-1])
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            found.append(target)
            found += [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found += [n for n in names if n and n.split(".")[0] in ("anytrain", "datasets")]
    return found


def module_graph() -> dict[str, set[str]]:
    files = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        files[".".join(parts[:-1] if path.name == "__init__.py" else parts)] = path
    return {name: {m for m in imports(path) if m in files and m != name} for name, path in files.items()}


def test_the_package_has_no_import_cycles():
    graph, cycles = module_graph(), []

    def visit(node, trail):
        for nxt in graph[node]:
            if nxt in trail:
                cycles.append(trail[trail.index(nxt) :] + [nxt])
            elif nxt not in done:
                visit(nxt, trail + [nxt])
        done.add(node)

    done: set[str] = set()
    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    assert not cycles, " | ".join(" -> ".join(c) for c in cycles)


def test_the_layers_point_one_way():
    graph = module_graph()
    config = set(imports(SRC / "config.py"))
    assert not any(m.startswith(("anytrain.data", "datasets")) for m in config), config  # no data, no sniffing
    for name, targets in graph.items():
        if name.startswith("anytrain.data"):
            assert not any(t.startswith("anytrain.tasks") for t in targets), (name, targets)
        assert "anytrain.trainer" not in targets or name in ("anytrain.api", "anytrain.cli"), name


def test_the_config_is_frozen_and_a_settled_task_is_a_new_config():
    from anytrain.tasks.settle import settle

    cfg = TrainConfig(lr=0.01)
    with pytest.raises(AttributeError, match="frozen"):
        cfg.lr = 1.0
    with pytest.raises(AttributeError):
        cfg.optim.lr = 1.0  # noqa: B010 - the sections are frozen dataclasses too
    settled = settle(cfg)
    assert cfg.data.task == "auto" and settled.cfg.data.task == "classify" and settled.key == "classify"
    assert (
        settled.cfg.given == cfg.given | {"task", "best_metric"}
        and "lr" in settled.cfg.given
        and "seed" not in cfg.given
    )
    assert settled.reason == "auto"


def test_the_task_is_decided_in_one_place():
    """No module but tasks/settle.py chooses a task (assigns it, or applies the auto rule)."""
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        if path.name in ("settle.py", "targets.py"):  # the rule, and the labels' part of it
            continue
        assert "task_from_labels" not in text and "task_from_options" not in text, path
        assert not re.search(r"\.data\.task\s*=(?!=)", text) and "replace(task=" not in text, path


def test_the_guide_lists_every_task_with_its_module_and_lines():
    import subprocess
    import sys

    root = SRC.parents[1]
    rows = subprocess.run(
        [sys.executable, str(root / "scripts" / "task_table.py")], capture_output=True, text=True, timeout=60
    ).stdout.strip()
    assert rows.count("\n") + 1 == len(REGISTRY) and rows in (root / "docs" / "guide.md").read_text()


def test_the_guide_names_every_option_in_its_section():
    """docs/guide.md's 'Which option is in which section' table: each section's row names exactly its fields."""
    import dataclasses

    guide, cfg = (SRC.parents[1] / "docs" / "guide.md").read_text(), TrainConfig()
    for section in ("data", "model", "optim", "eval", "run"):
        row = re.search(rf"^\| `{section}` \| (.*) \|$", guide, re.M)
        assert row, f"no row for the {section} section"
        listed = {re.sub(r" \(.*\)$", "", name.strip()) for name in row.group(1).split(",")}
        fields = {f.name for f in dataclasses.fields(getattr(cfg, section))}
        assert listed == fields, (section, listed ^ fields)
