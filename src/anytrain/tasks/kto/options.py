"""kto's own options: a section of the config (`kto:` in YAML), flags in --help, part of the resume check.
Registered with the registry line (tasks/__init__.py); this module imports no torch. --beta and --reference are
also dpo's: one flag sets both sections, each keeps its own default, help and bounds (config/schema.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config import POSITIVE, option

LOSSES = ("kto", "apo_zero_unpaired")  # tasks/kto/losses.py
WITH_KL = ("kto",)  # the losses that estimate the KL term (TRL's calculate_KL)
REFERENCES = ("auto", "cached", "adapter", "live")
KL_PAIRS = ("cycle", "trl")  # tasks/kto/rows.py: partners


@dataclass(frozen=True)
class KTOOptions:
    kto_loss: str = option(
        "kto",
        "kto: the loss (TRL's loss_type): kto (KTO's value function of the reward against the KL estimate, Eq. 7 of "
        "the paper) or apo_zero_unpaired (APO-zero unpaired: desirable rewards pushed up, undesirable down, no KL)",
        choices=LOSSES,
        aliases=("loss_type",),
    )
    beta: float = option(
        0.1, "kto: beta, the strength of the pull towards the reference (higher: closer to it)", bounds=POSITIVE
    )
    desirable_weight: float = option(
        1.0, "kto: the weight of the desirable rows' losses (to counter unequal class counts)", bounds=POSITIVE
    )
    undesirable_weight: float = option(
        1.0, "kto: the weight of the undesirable rows' losses (to counter unequal class counts)", bounds=POSITIVE
    )
    reference: str = option(
        "auto",
        "kto: the reference model's log-probabilities of the completions and of their KL pairs: cached (computed "
        "once before step 0 and saved in the run folder), adapter (with --lora-r: the model with its adapter off), "
        "live (a frozen copy in memory, for comparison); auto = adapter with --lora-r, else cached",
        choices=REFERENCES,
    )
    kl_pairs: str = option(
        "cycle",
        "kto: each row's KL pair, its prompt with another row's completion: cycle (the next row's in a cycle through "
        "its split drawn from --seed; the rows shuffled each epoch: the same pairs whatever the batch, ranks or "
        "accumulation) or trl (TRL's: the rows read in order, unshuffled, each --batch-size rows' completions "
        "rotated by one, row i getting row i - 1's; the pairs then depend on --batch-size)",
        choices=KL_PAIRS,
    )
