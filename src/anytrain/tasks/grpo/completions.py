"""grpo's completions table: what a user reads to see what the model writes and how it is scored. At each training
log line the main process appends to run_dir/completions.jsonl (one JSON object a line) the first ROWS completions
of the line's last rollout among its own (its first prompts' groups, whole where G divides ROWS; nothing is
gathered: the other processes' completions are sampled and scored alike), each row:

    {"step": optimizer steps done when it was sampled, "prompt": as given (text or a chat), "completion": its text,
     each reward function's value under its name (reward_NAME where the name is one of these columns'; null where
     it returned None), "reward": the weighted total (null: unscorable), "advantage": ..., and every log_extra
     column under its name}

and prints SHOWN of them, the best and the worst by reward: `  ...prompt tail -> completion (reward r, advantage
a)`. The file, a resumed run's rows and the trackers' table TAG are the causal-LM base's (causal_lm/completions.py,
which distill's table shares).
"""

from __future__ import annotations

import torch

from ..causal_lm.completions import ROWS, SHOWN, TAG, RolloutTable, number, prompt_tail, shown

__all__ = ["ROWS", "SHOWN", "TAG", "CompletionsTable", "columns", "taken"]
FIXED = ("step", "prompt", "completion", "reward", "advantage")


def columns(names: list[str]) -> list[str]:
    """The reward functions' columns: each its name, reward_NAME where that is a fixed column's."""
    return [f"reward_{n}" if n in FIXED else n for n in names]


def taken(names: list[str]) -> frozenset[str]:
    """The columns a log_extra column may not take."""
    return frozenset([*FIXED, *columns(names)])


class CompletionsTable(RolloutTable):
    """The main process's rows of the log window's last rollout, written and shown at each log line."""

    def __init__(self) -> None:
        super().__init__("reward", said)

    def add(self, step: int, args: dict, table: torch.Tensor, names: list[str], reward, advantage, extra) -> None:
        """A rollout's first ROWS completions (`args` as the reward functions got them, `table` their values,
        `extra` the log_extra columns), kept for the next flush."""
        if not self.kept:
            return
        n = min(ROWS, len(args["completions"]))
        values, totals, advantages = table[:n].tolist(), reward[:n].tolist(), advantage[:n].tolist()
        rows = []
        for k in range(n):
            row = {"step": step, "prompt": args["prompts"][k], "completion": shown(args["completions"][k])}
            row.update({name: number(v) for name, v in zip(columns(names), values[k])})
            row.update(reward=number(totals[k]), advantage=advantages[k])
            row.update({column: column_values[k] for column, column_values in extra.items()})
            rows.append(row)
        self.keep(step, rows)


def said(row: dict) -> str:
    reward = "unscorable" if row["reward"] is None else f"reward {row['reward']:.4g}"
    completion, advantage = row["completion"][:120], row["advantage"]
    return f"  ...{prompt_tail(row['prompt'])} -> {completion!r} ({reward}, advantage {advantage:+.3f})"
