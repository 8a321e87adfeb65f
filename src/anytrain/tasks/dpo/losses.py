"""The preference losses, each one small function of a batch's per-pair log-probabilities, returning each pair's
loss and its chosen and rejected rewards (the reward margin and accuracy follow from those):

    sigmoid  DPO:   -log σ(β ((π_c - ref_c) - (π_r - ref_r)))             rewards β (π - ref)
    ipo      IPO:   ((π̄_c - ref̄_c) - (π̄_r - ref̄_r) - 1 / 2β)²           rewards β (π̄ - ref̄)
    simpo    SimPO: -log σ(β (π̄_c - π̄_r) - γ)                            rewards β π̄
    orpo     ORPO:  -π̄_c - β log σ(log odds(π̄_c) - log odds(π̄_r))        rewards β π̄

π is a sequence's summed log-probability of its completion under the model, ref the reference's; π̄ and ref̄ are
per completion token (divided by its length), as TRL computes IPO, SimPO and ORPO; odds(p) = p / (1 - p). ORPO's
first term is the chosen answer's mean token loss (its SFT loss), per pair. The loss the loop trains on is the
mean of these over the pairs of the optimizer step (tasks/dpo/task.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass
class Pairs:
    """A batch's log-probabilities, one value per pair: policy (π) and reference (ref) of the chosen (c) and the
    rejected (r) completion, and each completion's number of tokens."""

    pi_c: torch.Tensor
    pi_r: torch.Tensor
    ref_c: torch.Tensor
    ref_r: torch.Tensor
    len_c: torch.Tensor
    len_r: torch.Tensor


def sigmoid(p: Pairs, beta: float, gamma: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    chosen, rejected = beta * (p.pi_c - p.ref_c), beta * (p.pi_r - p.ref_r)
    return -F.logsigmoid(chosen - rejected), chosen.detach(), rejected.detach()


def ipo(p: Pairs, beta: float, gamma: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    chosen, rejected = (p.pi_c - p.ref_c) / p.len_c, (p.pi_r - p.ref_r) / p.len_r
    return (chosen - rejected - 1 / (2 * beta)) ** 2, beta * chosen.detach(), beta * rejected.detach()


def simpo(p: Pairs, beta: float, gamma: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    chosen, rejected = beta * p.pi_c / p.len_c, beta * p.pi_r / p.len_r
    return -F.logsigmoid(chosen - rejected - gamma), chosen.detach(), rejected.detach()


def orpo(p: Pairs, beta: float, gamma: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mean_c, mean_r = p.pi_c / p.len_c, p.pi_r / p.len_r
    log_odds = (mean_c - mean_r) - (log1mexp(mean_c) - log1mexp(mean_r))
    return -mean_c - beta * F.logsigmoid(log_odds), beta * mean_c.detach(), beta * mean_r.detach()


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, accurate near 0 (a completion the model is sure of)."""
    return torch.log(-torch.expm1(x.clamp(max=-1e-12)))


LOSSES = {"sigmoid": sigmoid, "ipo": ipo, "simpo": simpo, "orpo": orpo}  # the names tasks/dpo/options.py offers
