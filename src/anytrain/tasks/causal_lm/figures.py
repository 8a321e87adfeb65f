"""The figures of the causal-LM tasks that sample their own completions (grpo, distill) that both put in a training
log line: where the time goes (`generating`: the share of the time since the last line spent on rollouts;
`time_PHASE`: each phase's share of it: `time_generate` the model's generate, `time_tools` the tools' calls, then the
task's own phases), the completions' length over every process (`completion_length`, the mean in the model's own
tokens, `completion_length_max`, the longest, `truncated`, the share cut at --max-new-tokens) and, with tools, what
the completions did with them, summed over every process (per completion: tool calls, model turns, the share that
called; failed calls per call, TRL's failure_frequency; malformed turns per turn). Each task's own figures subclass
`RolloutFigures` (grpo/figures.py, distill/figures.py)."""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod

import torch

TOOLS = ("tool_calls", "tool_failures", "turns", "called_tools", "malformed_turns")
LENGTHS = ("completion_length", "completion_length_max", "truncated")


class RolloutFigures(ABC):
    """A log window's time, length and tool figures (module docstring); PHASES: the phases, time_PHASE each (a task
    adds its own after the two every rollout has)."""

    PHASES: tuple[str, ...] = ("generate", "tools")

    def __init__(self) -> None:
        self.generating, self.since = 0.0, time.perf_counter()
        self.phases = dict.fromkeys(self.PHASES, 0.0)  # seconds since the last line
        self.tools: torch.Tensor | None = None  # with tools: calls, failures, turns, callers, malformed, completions
        self.lengths = torch.zeros(3, dtype=torch.float64)  # every process's completion tokens, cut ones, completions
        self.longest = 0.0

    @abstractmethod
    def take(self, accelerator) -> dict:
        """The figures since the last line (every process calls this together), then a new window."""

    def start(self) -> None:
        """A new window, its clock started now."""
        self.generating, self.since = 0.0, time.perf_counter()
        self.phases = dict.fromkeys(self.PHASES, 0.0)

    @contextlib.contextmanager
    def timed(self, phase: str):
        """The time of the block, added to the phase's."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phases[phase] += time.perf_counter() - started

    def add_lengths(self, accelerator, done) -> None:
        """A rollout's completions (generation.Completions) on every process: one all-reduce, one gather for the
        longest."""
        lengths = done.completion.sum(1).double()
        local = torch.stack([lengths.sum(), done.truncated.double().sum(), torch.tensor(float(len(lengths)),
                             dtype=torch.float64, device=lengths.device)])  # fmt: skip
        self.lengths += accelerator.reduce(local, "sum").cpu()
        self.longest = max(self.longest, accelerator.gather(lengths.max().view(1)).max().item())

    def length_figures(self) -> dict:
        """The completions' mean length, the longest and the share cut since the last line."""
        tokens, cut, completions = self.lengths
        out = dict(zip(LENGTHS, (mean(tokens, completions), self.longest, mean(cut, completions))))
        self.lengths, self.longest = torch.zeros(3, dtype=torch.float64), 0.0
        return out

    def add_tools(self, accelerator, sums: torch.Tensor, completions: int) -> None:
        """A rollout's tool figures (causal_lm/turns.py: counts), summed over every process."""
        local = torch.cat([sums, torch.tensor([float(completions)], dtype=torch.float64)]).to(accelerator.device)
        summed = accelerator.reduce(local, "sum").cpu()
        self.tools = summed if self.tools is None else self.tools + summed

    def tool_figures(self) -> dict:
        """Per completion: calls, model turns, the share that called; failed calls per call (TRL's
        failure_frequency), malformed turns per turn."""
        if self.tools is None:
            return {}
        calls, failed, turns, callers, malformed, completions = self.tools.tolist()
        self.tools = None
        return {"tool_calls": calls / completions, "tool_failures": failed / calls if calls else 0.0,
                "turns": turns / completions, "called_tools": callers / completions,
                "malformed_turns": malformed / turns if turns else 0.0}  # fmt: skip

    def time_figures(self) -> dict:
        """`generating` and each phase's share of the window's time."""
        elapsed = time.perf_counter() - self.since
        out = {"generating": self.generating / elapsed if elapsed > 0 else None}
        out.update({f"time_{p}": seconds / elapsed if elapsed > 0 else None for p, seconds in self.phases.items()})
        return out


def mean(total: torch.Tensor, count: torch.Tensor) -> float | None:
    return (total / count).item() if count > 0 else None


def std(total: torch.Tensor, squares: torch.Tensor, count: torch.Tensor) -> float | None:
    return ((squares / count - (total / count) ** 2).clamp(min=0) ** 0.5).item() if count > 0 else None
