"""The unpaired preference losses of TRL 1.16's KTOTrainer (`_compute_loss`), each one small function of a batch's
per-row log-ratios r = π - ref (the completion's summed log-probability under the model, less the reference's), its
labels (desirable or not) and the KL estimate z (detached, clamped at 0; tasks/kto/task.py makes it):

    kto                desirable:   1 - σ(β (r - z))      undesirable: 1 - σ(β (z - r))      KTO, Eq. 7
    apo_zero_unpaired  desirable:   1 - σ(β r)            undesirable: σ(β r)                 APO-zero, unpaired

Each row's loss is weighted by --desirable-weight or --undesirable-weight; its reward is β r. The loss the loop trains
on is the mean of the weighted losses over the optimizer step's rows (TRL: `losses.nanmean()` over the batch).
"""

from __future__ import annotations

import torch


def kto(r: torch.Tensor, desirable: torch.Tensor, z: torch.Tensor, beta: float) -> torch.Tensor:
    return torch.where(desirable, 1 - torch.sigmoid(beta * (r - z)), 1 - torch.sigmoid(beta * (z - r)))


def apo_zero_unpaired(r: torch.Tensor, desirable: torch.Tensor, z: torch.Tensor, beta: float) -> torch.Tensor:
    return torch.where(desirable, 1 - torch.sigmoid(beta * r), torch.sigmoid(beta * r))


LOSSES = {"kto": kto, "apo_zero_unpaired": apo_zero_unpaired}  # the names tasks/kto/options.py offers


def weighted(
    name: str, r: torch.Tensor, desirable: torch.Tensor, z: torch.Tensor, beta: float, weights: tuple[float, float]
) -> torch.Tensor:
    """Each row's loss times its class's weight (desirable, undesirable)."""
    scale = torch.where(desirable, weights[0], weights[1]).to(r.dtype)
    return LOSSES[name](r, desirable, z, beta) * scale
