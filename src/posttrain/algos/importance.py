"""Importance weights for the gap between the policy that sampled and the policy that trains:
truncated importance sampling (a fast engine's numerics, asynchronous rollout's stale policies)."""

from __future__ import annotations

import torch

from posttrain.utils.errors import InvalidValueError

TIS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def truncated_is_weights(
    trainer_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str = "token_truncate",
    cap: float = 2.0,
    floor: float | None = None,
) -> torch.Tensor:
    """Importance weights correcting for the sampler's distribution differing from the trainer's.

    A fast inference engine (vLLM kernels, bf16, different reduction order) samples from μ while the
    trainer computes π_old for the same weights; the policy gradient needs tokens drawn from π_old.
    Truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings
    You Off-Policy RL Training"; verl ``rollout_is``, TRL ``vllm_importance_sampling_correction``)
    multiplies each token's loss by

        token_truncate:     w_t = min(exp(log π_old_t − log μ_t), C)
        token_mask:         w_t = ρ_t if floor ≤ ρ_t ≤ C else 0,   ρ_t = exp(log π_old_t − log μ_t)
        sequence_truncate:  w_i = min(exp(Σ_t (log π_old_t − log μ_t)), C)   on every token of row i
        sequence_mask:      w_i = ρ_i if floor ≤ ρ_i ≤ C else 0

    with C = ``cap`` and floor = ``floor`` (masked modes only; None = no lower bound). Weights are
    detached, 1 at padding (``mask`` == 0), and computed from clamped log-ratios (±20) so they are
    always finite. ``trainer_logp`` is π_old (the trainer's log-probs at rollout time), not the
    current policy: the PPO ratio handles π_θ / π_old separately.
    """
    if mode not in TIS_MODES:
        raise InvalidValueError(f"tis_mode must be one of {', '.join(TIS_MODES)}, got {mode!r}")
    if not cap > 0:
        raise InvalidValueError(f"tis_cap must be > 0, got {cap!r}")
    if floor is not None and not 0 <= floor < cap:
        raise InvalidValueError(f"tis_min must be in [0, tis_cap={cap}), got {floor!r}")
    if trainer_logp.shape != sampler_logp.shape or mask.shape != trainer_logp.shape:
        raise InvalidValueError(
            f"truncated_is_weights: shapes differ: trainer {tuple(trainer_logp.shape)}, sampler "
            f"{tuple(sampler_logp.shape)}, mask {tuple(mask.shape)}"
        )
    valid = mask.bool()
    diff = torch.where(valid, trainer_logp.detach().float() - sampler_logp.detach().float(), 0.0)
    diff = torch.nan_to_num(diff, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True).expand_as(diff)
    rho = torch.exp(diff.clamp(-20.0, 20.0))
    if mode.endswith("truncate"):
        w = rho.clamp(max=cap)
    else:
        keep = rho <= cap
        if floor is not None:
            keep &= rho >= floor
        w = torch.where(keep, rho, torch.zeros_like(rho))
    return torch.where(valid, w, torch.ones_like(w)).to(trainer_logp.dtype)


__all__ = ["TIS_MODES", "truncated_is_weights"]
