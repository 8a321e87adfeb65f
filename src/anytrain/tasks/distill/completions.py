"""distill's completions table: what a user reads to see what the student writes and how far each completion is from
its teacher. At each training log line the main process appends to run_dir/completions.jsonl the first ROWS
completions of the line's last step among its own, each row:

    {"step": optimizer steps done when it was sampled, "prompt": as given (text or a chat), "completion": its text
     (with tools, each turn and the tools' answers), "divergence": the mean over its own tokens of the divergence
     trained on (null: no token of its own), "entropy": the student's mean entropy over them, "length": its own
     tokens}

and prints SHOWN of them, the farthest from the teacher and the closest: `  ...prompt tail -> completion (divergence
d, entropy e, n tokens)`. The file, a resumed run's rows and the trackers' table are the causal-LM base's
(causal_lm/completions.py, which grpo's table shares)."""

from __future__ import annotations

from ..causal_lm.completions import ROWS, RolloutTable, prompt_tail, shown


class CompletionsTable(RolloutTable):
    """The main process's rows of the log window's last step, written and shown at each log line."""

    def __init__(self) -> None:
        super().__init__("divergence", said)

    def add(self, step: int, prompts: list, completions: list, sums: list[list[float]]) -> None:
        """A step's first ROWS completions: the prompts as given, the completions (texts, or conversations as
        messages) and, per completion, its summed divergence, summed entropy and own tokens."""
        if not self.kept:
            return
        rows = []
        for k in range(min(ROWS, len(completions))):
            divergence, entropy, length = sums[k]
            row = {"step": step, "prompt": prompts[k], "completion": shown(completions[k])}
            row.update(divergence=divergence / length if length else None, entropy=entropy / length if length else None)
            rows.append({**row, "length": int(length)})
        self.keep(step, rows)


def said(row: dict) -> str:
    divergence = "no token of its own" if row["divergence"] is None else f"divergence {row['divergence']:.4g}"
    entropy = "" if row["entropy"] is None else f", entropy {row['entropy']:.3g}"
    completion = row["completion"][:120]
    return f"  ...{prompt_tail(row['prompt'])} -> {completion!r} ({divergence}{entropy}, {row['length']} tokens)"
