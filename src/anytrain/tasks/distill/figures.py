"""distill's own figures in each training log line (and summary.json): what a user needs to see that the student
comes closer to its teacher and where the time goes. Per micro-batch, summed over processes when a line is written:
`divergence`, the mean over the window's completion tokens of the divergence the loss trains on (the loss of a
line is the mean of its steps' per-token means), and `entropy`, the student's mean entropy at --temperature over
them (TRL's `entropy`). And the base's length, time and tool figures (causal_lm/figures.py): per step, over every
process, completion length (mean and longest, in the model's own tokens) and the share cut at --max-new-tokens;
`generating` and `time_generate` (the student's generate), `time_tools` (the tools' calls), `time_teacher` (the
teacher's passes), each a share of the line's time; with tools, what the completions did with them."""

from __future__ import annotations

import torch

from ..causal_lm.figures import RolloutFigures, mean


class Figures(RolloutFigures):
    PHASES = (*RolloutFigures.PHASES, "teacher")

    def __init__(self) -> None:
        super().__init__()
        self.step: torch.Tensor | None = None  # this process's divergence, entropy and token sums (on its device)

    def add_step(self, divergence: torch.Tensor, entropy: torch.Tensor) -> None:
        """A micro-batch's per-token divergence and entropy (no host sync)."""
        tokens = torch.tensor(float(len(divergence)), dtype=torch.float64, device=divergence.device)
        sums = torch.stack([divergence.detach().double().sum(), entropy.double().sum(), tokens])
        self.step = sums if self.step is None else self.step + sums

    def take(self, accelerator) -> dict:
        """The figures since the last line (every process calls this together), then a new window."""
        if self.step is None:
            return {}
        step = accelerator.reduce(self.step, "sum").cpu()
        out = {"divergence": mean(step[0], step[2]), "entropy": mean(step[1], step[2]), **self.length_figures(),
               **self.time_figures(), **self.tool_figures()}  # fmt: skip
        self.step = None
        self.start()
        return out
