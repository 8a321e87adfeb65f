"""dpo's own options: a section of the config (`dpo:` in YAML), flags in --help, part of the resume check.
Registered with the registry line (tasks/__init__.py); this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from ...config import POSITIVE, option

LOSSES = ("sigmoid", "ipo", "simpo", "orpo")  # tasks/dpo/losses.py
REFERENCE_FREE = ("simpo", "orpo")
REFERENCES = ("auto", "cached", "adapter", "live")


@dataclass(frozen=True)
class DPOOptions:
    dpo_loss: str = option(
        "sigmoid",
        "dpo: the preference loss: sigmoid (DPO), ipo (squared, on per-token log-ratios), simpo (no reference: "
        "per-token log-probabilities with the margin --simpo-gamma) or orpo (no reference: the chosen answer's "
        "loss plus --beta x the odds ratio)",
        choices=LOSSES,
    )
    beta: float = option(
        0.1, "dpo: beta, the strength of the preference (DPO's KL weight; SimPO's paper uses 2 to 2.5)", bounds=POSITIVE
    )
    simpo_gamma: float = option(0.5, "dpo: SimPO's target margin gamma (--dpo-loss simpo)", bounds="[0, inf)")
    reference: str = option(
        "auto",
        "dpo: the reference model's log-probabilities: cached (computed once before step 0 and saved in the run "
        "folder), adapter (with --lora-r: the model with its adapter off), live (a frozen copy in memory, for "
        "comparison); auto = adapter with --lora-r, else cached; simpo and orpo use none",
        choices=REFERENCES,
    )
