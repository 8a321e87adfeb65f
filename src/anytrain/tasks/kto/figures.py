"""kto's own figures in each training log line (and summary.json's first and last), since the last line, over every
process (TRL's training logs): each class's mean reward β (π - ref) and log-probability π over its rows
(`chosen_reward`, `chosen_logps`: the desirable rows; `rejected_...`: the undesirable ones; None where the line saw
none), their margin, and the mean KL estimate z of its optimizer steps (`kl`, --kto-loss kto)."""

from __future__ import annotations

import torch

COLUMNS = ("chosen", "chosen_reward", "chosen_logps", "rejected", "rejected_reward", "rejected_logps")


class Figures:
    def __init__(self, with_kl: bool = True):
        self.with_kl = with_kl
        self.sums = torch.zeros(len(COLUMNS), dtype=torch.float64)  # this process's, over its rows since the line
        self.kl = torch.zeros(2, dtype=torch.float64)  # the steps' z summed, the steps (the same on every process)

    def add(self, reward: torch.Tensor, logps: torch.Tensor, desirable: torch.Tensor) -> None:
        """A micro-batch's rows."""
        good, bad = desirable.double(), (~desirable).double()
        reward, logps = reward.double(), logps.double()
        rows = torch.stack([good.sum(), (reward * good).sum(), (logps * good).sum(),
                            bad.sum(), (reward * bad).sum(), (logps * bad).sum()])  # fmt: skip
        self.sums += rows.cpu()

    def add_kl(self, z: torch.Tensor) -> None:
        """An optimizer step's KL estimate."""
        self.kl += torch.tensor([float(z), 1.0], dtype=torch.float64)

    def take(self, accelerator) -> dict[str, float | None]:
        """The figures since the last line (every process calls this together: one all-reduce), then a new window."""
        sums = self.sums.to(accelerator.device)
        if accelerator.num_processes > 1:
            sums = accelerator.reduce(sums, "sum")
        s = dict(zip(COLUMNS, sums.cpu().tolist()))
        out: dict[str, float | None] = {}
        for name in ("chosen", "rejected"):
            n = s[name]
            out[f"{name}_reward"] = s[f"{name}_reward"] / n if n else None
            out[f"{name}_logps"] = s[f"{name}_logps"] / n if n else None
        chosen, rejected = out["chosen_reward"], out["rejected_reward"]
        out["reward_margin"] = chosen - rejected if chosen is not None and rejected is not None else None
        if self.with_kl:
            out["kl"] = float(self.kl[0] / self.kl[1]) if self.kl[1] else None
        self.sums, self.kl = torch.zeros_like(self.sums), torch.zeros_like(self.kl)
        return out

    def state(self) -> dict[str, torch.Tensor]:
        return {"figures": self.sums.clone(), "figures_kl": self.kl.clone()}

    def load(self, tensors: dict[str, torch.Tensor]) -> None:
        if "figures" in tensors:
            self.sums, self.kl = tensors["figures"].cpu().double(), tensors["figures_kl"].cpu().double()
