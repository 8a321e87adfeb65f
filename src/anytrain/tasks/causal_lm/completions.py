"""The completions table of the causal-LM tasks that sample their own completions (grpo, distill): what a user reads
to see what the model writes. At each training log line the main process appends to run_dir/completions.jsonl (one
JSON object a line) the rows the task kept of the line's last rollout (its first ROWS completions among the main
process's own; nothing is gathered: the other processes' completions are sampled alike), each a dict whose first
columns are "step" (optimizer steps done when it was sampled), "prompt" (as given: text or a chat) and "completion"
(its text, `shown`), then the task's own (grpo: each reward, the reward, the advantage; distill: the divergence, the
student's entropy, the length), and prints SHOWN of them: the highest and the lowest by the task's score column, as
the task says them. A fresh run starts the file again; a resumed one keeps the rows sampled before its checkpoint and
appends (those from the checkpoint's step on, which the resumed run samples again, are dropped when it first rolls
out).

The same rows, at the step in their "step" column, go to the run's trackers that take tables (--report-to): those
with accelerate's log_table (wandb, clearml) get table TAG, its columns and rows as the file holds them (a chat
prompt, or any list or dict, as its JSON text); tensorboard, which has no table type, gets them as a markdown table
in text summary TAG (its Text tab renders it). mlflow and trackio get none: accelerate gives them no table call (its
mlflow tracker logs numbers only; trackio would take a trackio.Table through log, untested here without trackio).
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Callable
from pathlib import Path

from ...files import write_atomically

FILE = "completions.jsonl"
ROWS = 8  # per log window
SHOWN = 2  # printed at each log line
TAG = "completions"  # the trackers' table and text summary
MARKDOWN = re.compile(r"[\\`*_{}\[\]()#+\-.!|]")  # what a backslash escapes in (Python-)Markdown with tables
NEWLINE = re.compile(r"\r\n?|\n")  # each ends a markdown line
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")  # what a renderer drops, or shows as ?, or takes for its own


def text_of(completion) -> str:
    """A completion's text: itself, or a chat's last message's content (none: "", a turn of tool calls alone)."""
    return completion if isinstance(completion, str) else str(completion[-1].get("content") or "")


def shown(completion) -> str:
    """A completion as the table shows it: its text; a conversation with tools, each turn: the model's text and
    calls (`[call name {arguments}]`), the tools' answers (`[name -> answer]`)."""
    if isinstance(completion, str) or len(completion) == 1 and not completion[0].get("tool_calls"):
        return text_of(completion)
    parts = []
    for message in completion:
        if message.get("role") == "tool":
            parts.append(f"[{message.get('name')} -> {message.get('content')}]")
            continue
        parts += [str(message["content"])] if message.get("content") else []
        for call in message.get("tool_calls") or []:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            parts.append(f"[call {function.get('name')} {json.dumps(function.get('arguments'), default=str)}]")
    return " ".join(parts)


class RolloutTable:
    """The main process's rows of the log window's last rollout, written and shown at each log line (module
    docstring). `score`: the column the printed rows are the highest and lowest of; `said(row)`: a printed line."""

    def __init__(self, score: str, said: Callable[[dict], str]) -> None:
        self.score, self.said = score, said
        self.path: Path | None = None  # None: not the main process (set by start)
        self.opened = False
        self.first: int | None = None  # the launch's first rollout's step (its rows from there on: sampled again)
        self.rows: list[dict] = []

    @property
    def kept(self) -> bool:
        """Whether this process writes the table (the main process, once started)."""
        return self.path is not None

    def start(self, run_dir: Path, main: bool) -> None:
        self.path = run_dir / FILE if main else None

    def forget(self) -> None:
        """Drop the rows not yet written and the step they began at (the start-up check's rollout)."""
        self.rows, self.first = [], None

    def keep(self, step: int, rows: list[dict]) -> None:
        """A rollout's rows (the main process's; the last rollout's replace those before it), kept for the next
        flush."""
        if self.path is None:
            return
        self.first = step if self.first is None else self.first
        self.rows = rows

    def flush(self, trackers=()) -> list[str]:
        """Appends the window's rows to the file and hands them to `trackers` (accelerator.trackers) that take
        tables; returns the lines to print (none when there are no rows)."""
        rows, self.rows = self.rows, []
        if self.path is None or not rows:
            return []
        if not self.opened:  # a launch's first write: what the file holds from its first rollout on is sampled again
            keep_before(self.path, rows[0]["step"] if self.first is None else self.first)
            self.opened = True
        lines = [json.dumps(row, default=plain) for row in rows]
        with open(self.path, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        hand_over(trackers, [json.loads(line) for line in lines])
        scored = sorted((r for r in rows if r[self.score] is not None), key=lambda r: -r[self.score])
        picked = [scored[0], scored[-1]] if len(scored) > 1 else scored or rows[:1]
        return ["completions:", *(self.said(row) for row in picked[:SHOWN])]


def hand_over(trackers, rows: list[dict]) -> None:
    """The rows (as the file holds them) to each tracker that takes a table, at their step; the others get none."""
    columns = list(dict.fromkeys(column for row in rows for column in row))
    data = [[flat(row.get(column)) for column in columns] for row in rows]
    step = rows[0]["step"]
    for tracker in trackers:
        if tracker.name == "tensorboard":  # its .tracker: the SummaryWriter
            tracker.tracker.add_text(TAG, markdown(columns, data), global_step=step)
            tracker.tracker.flush()
        elif callable(getattr(tracker, "log_table", None)):  # wandb, clearml
            tracker.log_table(TAG, columns=columns, data=data, step=step)


def flat(value):
    """A table cell: a list or dict (a chat prompt) as its JSON text, other values as they are."""
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def markdown(columns: list[str], data: list[list]) -> str:
    """A markdown table of the rows."""
    lines = [[cell(c) for c in columns], ["---"] * len(columns), *([cell(v) for v in values] for values in data)]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def cell(value) -> str:
    """A value as a markdown table cell shows it: text as it is, other values as JSON (null, 0.5); markdown's
    characters escaped (2*3*4 is not in italics), HTML's too (a completion's <think> is not taken for a tag), newlines
    as <br>, a tab a space, other control characters \ufffd."""
    text = html.escape(value if isinstance(value, str) else json.dumps(value), quote=False)
    text = CONTROL.sub("\ufffd", text.replace("\t", " "))
    return NEWLINE.sub("<br>", MARKDOWN.sub(r"\\\g<0>", text))


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


def prompt_tail(prompt) -> str:
    """A prompt's last 60 characters as a printed line shows them (a chat's: its last message's)."""
    return repr((prompt if isinstance(prompt, str) else text_of(prompt))[-60:])


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
