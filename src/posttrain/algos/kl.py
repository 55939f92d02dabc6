"""Per-token KL estimators between the policy and a reference policy.

Source: verl ``core_algos.kl_penalty`` / ``kl_penalty_forward``; the k1/k2/k3
names follow J. Schulman, "Approximating KL divergence" (2020). With d = logp − ref_logp (per token;
samples come from the policy π):

=====================  ==========================================================  ====================
kind (aliases)         value                                                       ∂/∂logp
=====================  ==========================================================  ====================
``k1`` (``kl``)        d                                                           1
``abs``                |d|                                                         sign(d)
``k2`` (``mse``)       ½·d²                                                        d
``k3`` (``low_var_kl``)  kl = clamp(−d, −20, 20);  clamp(exp(kl) − kl − 1, −10, 10)    1 − π_ref/π (inside clamps)
``<kind>+``            straight-through: value of <kind>, gradient of k2:          d
                       ½d² − sg(½d²) + sg(<kind>)
=====================  ==========================================================  ====================

The clamps of k3 zero its gradient once kld > 10 (or |d| > 20); `kl_clamped` returns where that
happens so a trainer can log the fraction. Use `agg_loss` to reduce the (B, T) result, e.g. the actor
loss ``pg_loss + kl_coef · agg_loss(kl_penalty(logp, ref, "low_var_kl"), mask)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from posttrain.utils.errors import InvalidTypeError, InvalidValueError
from posttrain.utils.registry import Registry

Tensor = torch.Tensor

KL_ESTIMATORS: Registry[Callable[[Tensor, Tensor], Tensor]] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1", aliases=("kl",))
def _k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = logp − ref (unbiased, high variance, can be negative)."""
    return logp - ref_logp


@KL_ESTIMATORS.register("abs")
def _abs(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """|logp − ref|."""
    return (logp - ref_logp).abs()


@KL_ESTIMATORS.register("k2", aliases=("mse",))
def _k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = ½(logp − ref)²."""
    return 0.5 * (logp - ref_logp).square()


@KL_ESTIMATORS.register("k3", aliases=("low_var_kl",))
def _k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = exp(kl) − kl − 1 with kl = ref − logp, clamped as verl: kl ∈ [−20, 20], k3 ∈ [−10, 10]."""
    kl = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.clamp(torch.exp(kl) - kl - 1.0, -10.0, 10.0)


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "low_var_kl") -> Tensor:
    """Per-token KL estimate (same shape as `logp`); see the module table for each `kind`.

    ``kind`` is one of `list_kl_estimators()` (or an alias), optionally with a ``+`` suffix for the
    straight-through variant (forward value of ``kind``, gradient of k2), e.g. ``"k3+"``.
    The reference log-probs are treated as constants (detached).
    """
    if not isinstance(logp, Tensor) or not isinstance(ref_logp, Tensor):
        raise InvalidTypeError("kl_penalty: logp and ref_logp must be torch tensors")
    if logp.shape != ref_logp.shape:
        raise InvalidValueError(
            f"kl_penalty: ref_logp shape {tuple(ref_logp.shape)} does not match logp {tuple(logp.shape)}"
        )
    if not isinstance(kind, str):
        raise InvalidTypeError(f"kl_penalty: kind must be a string, got {type(kind).__name__}")
    straight_through = kind.endswith("+") and len(kind) > 1
    base = KL_ESTIMATORS.get(kind[:-1] if straight_through else kind)
    ref = ref_logp.detach().to(logp.dtype)
    value = base(logp, ref)
    if not straight_through:
        return value
    k2 = _k2(logp, ref)
    return k2 - k2.detach() + value.detach()


def kl_clamped(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Bool mask of tokens where a k3 clamp is active (|logp − ref| > 20 or k3 > 10): zero gradient."""
    kl = ref_logp.detach() - logp.detach()
    inner = torch.clamp(kl, -20.0, 20.0)
    return (kl.abs() > 20.0) | (torch.exp(inner) - inner - 1.0 > 10.0)


def list_kl_estimators(*, include_aliases: bool = False) -> list[str]:
    """Names of the KL estimators (each also accepts a ``+`` suffix)."""
    return KL_ESTIMATORS.names(include_aliases=include_aliases)
