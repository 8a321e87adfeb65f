"""Optimizer and learning-rate schedule, both counted in optimizer steps."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import OptimConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices and embeddings (2-D and up) only: decaying biases and norm gains
    towards zero only hurts (the GPT-2 / nanoGPT recipe, and the usual practice elsewhere)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(optim: OptimConfig, model: nn.Module, device_type: str = "cpu") -> torch.optim.Optimizer:
    groups = param_groups(model, optim.weight_decay)
    if optim.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=optim.lr, momentum=optim.momentum)
    # One fused kernel for all parameters where torch has one (CUDA, and the CPU since torch 2.4):
    # on the CPU the GPT recipe's AdamW step takes 2.2 ms instead of 5.7 ms (docs/benchmarks.md).
    fused = {"fused": True} if device_type in fused_devices() else {}
    return torch.optim.AdamW(groups, lr=optim.lr, betas=(optim.adam_beta1, optim.adam_beta2), **fused)


def fused_devices() -> tuple[str, ...]:
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return tuple(_get_fused_kernels_supported_devices())
    except ImportError:  # an older torch: only CUDA has it
        return ("cuda",)


def lr_factor(step: int, optim: OptimConfig, total_steps: float) -> float:
    """Multiplier of optim.lr for the update made at optimizer step `step` (0-based)."""
    if step < optim.warmup_steps:
        return (step + 1) / optim.warmup_steps
    after = step - optim.warmup_steps
    if optim.schedule == "step":
        return optim.gamma ** (after // optim.step_size)
    if optim.schedule == "cosine":
        progress = min(1.0, after / max(1, total_steps - optim.warmup_steps))
        floor = optim.min_lr / optim.lr  # cosine from lr down to min_lr at the last step
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def build_scheduler(
    optim: OptimConfig, optimizer: torch.optim.Optimizer, total_steps: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """Stepped once per real optimizer step by the loop. It is deliberately not passed to
    accelerator.prepare(): the prepared scheduler steps num_processes times per optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, optim, total_steps))
