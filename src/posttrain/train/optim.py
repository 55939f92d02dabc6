"""Optimizer, learning-rate schedule and the clipped update step, shared by the RL and SFT trainers
(both configure them with ``posttrain.train.config.OptimizerConfig``).

The schedule is a pure function of the step, so its checkpoint state is the step number:

    warmup (s < W):  lr_s = lr · (s + 1) / W
    constant:        lr_s = lr
    cosine:          lr_s = lr · [ρ + (1 − ρ) · ½ (1 + cos(π · p))],  p = (s − W) / max(1, S − W)

with W = warmup_steps, S = total steps, ρ = min_lr_ratio (Loshchilov & Hutter 2017, SGDR).
"""

from __future__ import annotations

import math

import torch

from posttrain.utils.errors import InvalidValueError


def lr_at(
    step: int, *, lr: float, total_steps: int, schedule: str, warmup_steps: int, min_lr_ratio: float
) -> float:
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    if schedule == "cosine":
        p = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))
    raise InvalidValueError(f"optimizer.schedule: unknown value {schedule!r}; accepted: constant, cosine")


def build_adamw(model: torch.nn.Module, cfg) -> torch.optim.AdamW:
    """AdamW over trainable parameters; ``foreach`` kernels (one launch per op, not per tensor)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=True
    )


def set_lr(optimizer: torch.optim.Optimizer, value: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = value


def scheduled_lr(cfg, step: int, total_steps: int) -> float:
    """:func:`lr_at` with the schedule of an ``OptimizerConfig`` (used by RL and SFT alike)."""
    return lr_at(
        step,
        lr=cfg.lr,
        total_steps=max(1, total_steps),
        schedule=cfg.schedule,
        warmup_steps=cfg.warmup_steps,
        min_lr_ratio=cfg.min_lr_ratio,
    )


def clip_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    """Clip the global gradient norm to ``grad_clip`` (0 = no clipping), take the optimizer step,
    and return the norm before clipping."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf, foreach=True)
    optimizer.step()
    return float(norm)
