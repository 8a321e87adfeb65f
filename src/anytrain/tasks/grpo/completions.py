"""grpo's completions table: what a user reads to see what the model writes and how it is scored. At each training
log line the main process appends to run_dir/completions.jsonl (one JSON object a line) the first ROWS completions
of the line's last rollout among its own (its first prompts' groups, whole where G divides ROWS; nothing is
gathered: the other processes' completions are sampled and scored alike), each row:

    {"step": optimizer steps done when it was sampled, "prompt": as given (text or a chat), "completion": its text,
     each reward function's value under its name (reward_NAME where the name is one of these columns'; null where
     it returned None), "reward": the weighted total (null: unscorable), "advantage": ..., and every log_extra
     column under its name}

and prints SHOWN of them, the best and the worst by reward: `  ...prompt tail -> completion (reward r, advantage
a)`. A fresh run starts the file again; a resumed one keeps the rows sampled before its checkpoint and appends (those
from the checkpoint's step on, which the resumed run samples again, are dropped when it first rolls out).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ...files import write_atomically
from .rewards import text_of

FILE = "completions.jsonl"
ROWS = 8  # per log window
SHOWN = 2  # printed at each log line
FIXED = ("step", "prompt", "completion", "reward", "advantage")


def columns(names: list[str]) -> list[str]:
    """The reward functions' columns: each its name, reward_NAME where that is a fixed column's."""
    return [f"reward_{n}" if n in FIXED else n for n in names]


def taken(names: list[str]) -> frozenset[str]:
    """The columns a log_extra column may not take."""
    return frozenset([*FIXED, *columns(names)])


class CompletionsTable:
    """The main process's rows of the log window's last rollout, written and shown at each log line."""

    def __init__(self) -> None:
        self.path: Path | None = None  # None: not the main process (set by start)
        self.opened = False
        self.rows: list[dict] = []

    def start(self, run_dir: Path, main: bool) -> None:
        self.path = run_dir / FILE if main else None

    def add(self, step: int, args: dict, table: torch.Tensor, names: list[str], reward, advantage, extra) -> None:
        """A rollout's first ROWS completions (`args` as the reward functions got them, `table` their values,
        `extra` the log_extra columns); the first rollout of a launch drops the rows it is about to sample again."""
        if self.path is None:
            return
        if not self.opened:
            keep_before(self.path, step)
            self.opened = True
        n = min(ROWS, len(args["completions"]))
        values, totals, advantages = table[:n].tolist(), reward[:n].tolist(), advantage[:n].tolist()
        self.rows = []
        for k in range(n):
            row = {"step": step, "prompt": args["prompts"][k], "completion": text_of(args["completions"][k])}
            row.update({name: number(v) for name, v in zip(columns(names), values[k])})
            row.update(reward=number(totals[k]), advantage=advantages[k])
            row.update({column: column_values[k] for column, column_values in extra.items()})
            self.rows.append(row)

    def flush(self) -> list[str]:
        """Appends the window's rows to the file; returns the lines to print (none when there are no rows)."""
        rows, self.rows = self.rows, []
        if self.path is None or not rows:
            return []
        with open(self.path, "a") as f:
            f.write("".join(json.dumps(row, default=plain) + "\n" for row in rows))
        scored = sorted((r for r in rows if r["reward"] is not None), key=lambda r: -r["reward"])
        shown = [scored[0], scored[-1]] if len(scored) > 1 else scored or rows[:1]
        return ["completions:", *(said(row) for row in shown[:SHOWN])]


def keep_before(path: Path, step: int) -> None:
    """Drops the rows sampled at `step` or later (a fresh run's first rollout: step 0, every row); a torn line (a
    kill mid-write) too."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("step", step) < step:
            kept.append(line)
    write_atomically(path, "".join(line + "\n" for line in kept))


def said(row: dict) -> str:
    prompt = row["prompt"] if isinstance(row["prompt"], str) else text_of(row["prompt"])
    reward = "unscorable" if row["reward"] is None else f"reward {row['reward']:.4g}"
    return f"  ...{prompt[-60:]!r} -> {row['completion'][:120]!r} ({reward}, advantage {row['advantage']:+.3f})"


def number(value: float) -> float | None:
    return None if math.isnan(value) else value


def plain(value):
    """A value json cannot write as it is (a numpy number, a tensor): its Python value, else its text."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
