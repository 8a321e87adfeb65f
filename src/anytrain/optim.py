"""Optimizer and learning-rate schedule, both counted in optimizer steps."""

from __future__ import annotations

import math

import torch

from .config import TrainConfig


def build_optimizer(cfg: TrainConfig, params) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def lr_factor(step: int, cfg: TrainConfig, total_steps: int) -> float:
    """Multiplier of cfg.lr for the update made at optimizer step `step` (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    after = step - cfg.warmup_steps
    if cfg.schedule == "step":
        return cfg.gamma ** (after // cfg.step_size)
    if cfg.schedule == "cosine":
        progress = min(1.0, after / max(1, total_steps - cfg.warmup_steps))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def build_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Stepped once per real optimizer step by the loop. It is deliberately not passed to
    accelerator.prepare(): the prepared scheduler steps num_processes times per optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg, total_steps))
