"""Loss aggregation: per-token loss matrix (B, T) -> scalar.

Source: verl `verl/trainer/ppo/core_algos.py::agg_loss`. With m the mask,
ℓ the per-token values, n_i = Σ_t m_it the valid tokens of sequence i:

=============================  ============================================================  =====================
mode                           value                                                          normaliser default
=============================  ============================================================  =====================
``token-mean`` (default)       Σ_{i,t} m·ℓ / N                                               N = Σ m (local)
``token-sum``                  Σ_{i,t} m·ℓ                                                   —
``seq-mean-token-mean``        Σ_{i: n_i>0} [Σ_t m·ℓ / n_i] / S                              S = #{i: n_i > 0}
``seq-mean-token-sum``         Σ_i Σ_t m·ℓ / S                                               S = #{i: n_i > 0}
``seq-mean-token-sum-norm``    Σ_{i,t} m·ℓ / scale                     (Dr.GRPO)             scale = T
``token-mean-micro``           (Σ_{i,t} m·ℓ / N_micro) · B_micro / S   (DGPO/MASPO authors)  S = B_micro
=============================  ============================================================  =====================

``token-mean-micro`` is the aggregation of the DGPO and MASPO authors' code (FlyTune/DGPO-RL,
FlyTune/MASPO-RL, verl ``dp_actor.update_policy``): a token mean INSIDE each micro-batch, scaled by
the micro-batch's share of the minibatch (``loss / gradient_accumulation``). It is not micro-batch
invariant: a micro-batch of short answers weighs its tokens more. posttrain's default ``token-mean``
normalises by the minibatch's global token count (every token weighs the same, whatever the
micro-batch split); use ``token-mean-micro`` (with the authors' ``micro_batch_size``) only to
reproduce their numbers exactly.

Micro-batch invariance: pass ``global_tokens`` = N and ``global_seqs`` = S of the WHOLE (mini-)batch,
and a fixed ``scale``; then every mode is a sum of per-row terms over a fixed normaliser, so the sum of
the micro-batch losses (and of their gradients) equals the loss (gradient) of the full batch. For
data-parallel training use the counts of all ranks and SUM the gradients (verl instead multiplies by
dp_size and averages; same result).

Dr.GRPO constant (arXiv 2503.20783). We use the CURRENT verl semantics: Σ m·ℓ / scale, no division by
the number of sequences, ``scale`` defaulting to the padded length T = mask.shape[-1]. Because the
default depends on padding, set ``scale`` to a fixed L_max (max response length) in real runs, as
Dr.GRPO does. The older verl vendored in FlyTune/DGPO-RL divides by B·L instead; reproduce it with
``scale = B·L`` (e.g. ``scale = global_seqs · L_max``), which also makes the loss magnitude independent
of the batch size.

Masked positions are removed with ``torch.where`` (never multiplied), so inf/nan under mask == 0
cannot reach the value or the gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from posttrain.algos._common import as_bool_mask
from posttrain.utils.errors import InvalidTypeError, InvalidValueError
from posttrain.utils.registry import Registry

Tensor = torch.Tensor
Count = int | float | Tensor | None

AGG_MODES: Registry[Callable[..., Tensor]] = Registry("aggregation mode")


def _positive(name: str, value: Count) -> None:
    if value is None or isinstance(value, Tensor):
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidValueError(f"agg_loss: {name} must be a positive number, got {value!r}")


def _masked_rows(values: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """(Σ_t m·ℓ per row, n_i per row)."""
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    row_sum = torch.where(valid, values, zero).sum(dim=-1)
    row_cnt = valid.sum(dim=-1).to(values.dtype)
    return row_sum, row_cnt


def _as_denominator(value: Count, fallback: Tensor) -> Tensor:
    if value is None:
        return fallback
    if isinstance(value, Tensor):
        return value.to(dtype=fallback.dtype, device=fallback.device)
    return torch.tensor(float(value), dtype=fallback.dtype, device=fallback.device)


@AGG_MODES.register("token-mean")
def _token_mean(values, valid, scale, global_tokens, global_seqs):
    """Σ m·ℓ / N with N = global_tokens (default: valid tokens here, at least 1). DAPO token-level loss."""
    row_sum, row_cnt = _masked_rows(values, valid)
    return row_sum.sum() / _as_denominator(global_tokens, row_cnt.sum().clamp(min=1))


@AGG_MODES.register("token-sum")
def _token_sum(values, valid, scale, global_tokens, global_seqs):
    """Σ m·ℓ (no normaliser)."""
    row_sum, _ = _masked_rows(values, valid)
    return row_sum.sum()


@AGG_MODES.register("seq-mean-token-mean")
def _seq_mean_token_mean(values, valid, scale, global_tokens, global_seqs):
    """Σ_{i: n_i>0} (Σ_t m·ℓ / n_i) / S. Original GRPO per-sample length normalisation; GSPO/SAPO."""
    row_sum, row_cnt = _masked_rows(values, valid)
    per_seq = row_sum / row_cnt.clamp(min=1)  # empty rows: 0 / 1 = 0
    nonempty = (row_cnt > 0).to(values.dtype).sum().clamp(min=1)
    return per_seq.sum() / _as_denominator(global_seqs, nonempty)


@AGG_MODES.register("seq-mean-token-sum")
def _seq_mean_token_sum(values, valid, scale, global_tokens, global_seqs):
    """Σ_i Σ_t m·ℓ / S."""
    row_sum, row_cnt = _masked_rows(values, valid)
    nonempty = (row_cnt > 0).to(values.dtype).sum().clamp(min=1)
    return row_sum.sum() / _as_denominator(global_seqs, nonempty)


@AGG_MODES.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(values, valid, scale, global_tokens, global_seqs):
    """Σ m·ℓ / scale, scale default T (current verl; Dr.GRPO, arXiv 2503.20783)."""
    row_sum, _ = _masked_rows(values, valid)
    t = torch.tensor(float(values.shape[-1]), dtype=values.dtype, device=values.device)
    return row_sum.sum() / _as_denominator(scale, t)


@AGG_MODES.register("token-mean-micro")
def _token_mean_micro(values, valid, scale, global_tokens, global_seqs):
    """(Σ m·ℓ / N_micro) · B_micro / S: the DGPO/MASPO authors' per-micro-batch token mean, rescaled by
    the micro-batch's share of the S sequences of the minibatch (default S = B_micro: a plain
    token mean of this micro-batch)."""
    row_sum, row_cnt = _masked_rows(values, valid)
    b = torch.tensor(float(values.shape[0]), dtype=values.dtype, device=values.device)
    return row_sum.sum() / row_cnt.sum().clamp(min=1) * b / _as_denominator(global_seqs, b)


def agg_loss(
    values: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    scale: Count = None,
    global_tokens: Count = None,
    global_seqs: Count = None,
) -> Tensor:
    """Aggregate per-token `values` (B, T) under `mask` (B, T; nonzero = valid) into a scalar.

    See the module docstring for the formula of each mode (verl `agg_loss`).
    `global_tokens` is used by ``token-mean``; `global_seqs` by ``seq-mean-token-mean`` and
    ``seq-mean-token-sum``; `scale` by ``seq-mean-token-sum-norm``; other arguments are ignored by
    a mode. Counts may be Python numbers or 0-d tensors.
    """
    fn = AGG_MODES.get(mode)
    if not isinstance(values, Tensor) or not isinstance(mask, Tensor):
        raise InvalidTypeError("agg_loss: values and mask must be torch tensors")
    if values.dim() != 2:
        raise InvalidValueError(f"agg_loss: values must have shape (B, T), got {tuple(values.shape)}")
    if mask.shape != values.shape:
        raise InvalidValueError(
            f"agg_loss: mask shape {tuple(mask.shape)} does not match values shape {tuple(values.shape)}"
        )
    if not torch.is_floating_point(values):
        raise InvalidTypeError(f"agg_loss: values must be a floating-point tensor, got {values.dtype}")
    _positive("scale", scale)
    _positive("global_tokens", global_tokens)
    _positive("global_seqs", global_seqs)
    return fn(values, as_bool_mask(mask), scale, global_tokens, global_seqs)


def list_agg_modes() -> list[str]:
    """Names of the aggregation modes."""
    return AGG_MODES.names()
