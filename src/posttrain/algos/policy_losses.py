"""Policy-gradient surrogate losses of the GRPO family, one string-keyed registry.

Every loss is called the same way::

    loss, metrics = get_policy_loss(name)(logp, old_logp, advantages, mask, *, agg=None,
                                          is_weights=None, global_tokens=None, global_seqs=None,
                                          scale=None, **params)

Notation: r_t = exp(clamp(logp_t − old_logp_t, −20, 20)); A_t the advantage
((B,) broadcast over tokens, or (B, T)); ε_low/ε_high = ``clip_low``/``clip_high``; c = ``clip_c``;
sg = stop-gradient. The per-token gradient weight g_t is defined by

    ∂ℓ_t / ∂logp_t = −A_t · g_t          (then × is_weights_t / normaliser of the aggregation)

so g_t = r_t is the plain importance-weighted policy gradient and g_t = 0 means "no gradient".

===========  ==================================================================  ====================
loss         g_t (weight on ∇log π_t)                                             source
===========  ==================================================================  ====================
ppo          r inside; 0 if clipped (A>0 ∧ r>1+ε_high, A<0 ∧ r<1−ε_low) or        PPO 1707.06347, verl
             dual-clipped (A<0 ∧ r>c)
dapo         ppo with ε_high = 0.28 (clip-higher)                                 DAPO 2503.14476
gspo         s_i (sequence ratio) on every token; 0 if the sequence is clipped    GSPO 2507.18071
cispo        clip(r, 1−ε_low, 1+ε_high), never 0                                 CISPO 2506.13585
sapo         4·r·σ(τ(r−1))·(1−σ(τ(r−1))), τ = τ_pos if A>0 else τ_neg              SAPO 2511.20347
dgpo         r·(r/(1−ε_low))^n on LN; (1+ε_high)^{1/m}·r^{1−1/m} on HP; r else     DGPO 2603.14389
maspo        w·r with a Gaussian gate w on sg(r) in the favoured direction         MASPO 2602.17550
===========  ==================================================================  ====================

Conventions shared by all losses:

* Gradients flow through ``logp`` only. ``old_logp``, ``advantages`` and ``is_weights`` are constants
  (detached), as in every reference implementation.
* Loss VALUES are the authors' forms (so logged values match their runs); they are not comparable
  across losses. Compare ``approx_kl``, the clip fractions and ``weight_mean`` (= masked mean of g_t).
* Padding: positions with mask == 0 are replaced by neutral values (logp = old_logp = 0, A = 0) BEFORE
  any arithmetic, so finite garbage (or inf/nan) there changes neither the loss nor any gradient.
* ``is_weights`` (B, T) (off-policy / rollout-correction weights) multiply the per-token loss.
* ``agg=None`` means the loss's own default: ``seq-mean-token-mean`` for gspo and sapo (verl forces it
  there), ``token-mean`` for the others. An explicit ``agg`` is always honoured (unlike verl, which
  silently ignores it for gspo/sapo); the default is available as ``policy_loss_default_agg(name)``.
* Extra per-token inputs: a loss that needs more than (logp, old_logp, A) declares them when it is
  registered, ``register_policy_loss(name, inputs=("entropy", "rollout_logp"), ...)``, from
  ``LOSS_INPUTS``; the caller passes exactly those as ``inputs={name: (B, T) tensor}`` and the core
  reads them, zeroed at padding, from ``batch.inputs``. ``PolicyLoss.inputs`` lists them, so a
  trainer computes what a loss declares without code per loss.
* Metrics (detached 0-d tensors, masked means over valid tokens): ``clipfrac_low``, ``clipfrac_high``,
  ``clipfrac`` (their union), ``approx_kl`` (k1 of old vs new = mean(old_logp − logp), verl ``ppo_kl``),
  ``ratio_mean``, ``weight_mean``, plus loss-specific keys. Losses without a hard clip (sapo, maspo)
  report clip fractions of 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from posttrain.algos._common import (
    as_bool_mask,
    check_2d,
    check_float,
    check_param_names,
    is_number,
    keyword_defaults,
    masked_mean,
    require,
)
from posttrain.algos.aggregation import AGG_MODES, agg_loss
from posttrain.utils.errors import InvalidTypeError, InvalidValueError
from posttrain.utils.registry import Registry

Tensor = torch.Tensor

LOG_RATIO_CLAMP = 20.0  # verl: clamp(logp − old_logp, −20, 20) before exp
KIND = "policy loss"

#: Per-token inputs a loss may declare (``register_policy_loss(..., inputs=...)``), each (B, T):
LOSS_INPUTS: dict[str, str] = {
    "entropy": "entropy of the current policy's next-token distribution at τ (differentiable)",
    "ref_logp": "log-probs of the reference policy (detached; the trainer loads a reference model)",
    "rollout_logp": "sampling log-probs recorded by the rollout engine (detached)",
}


class Batch(NamedTuple):
    """Sanitised inputs handed to every loss core (all (B, T); zeros at padded positions)."""

    logp: Tensor  # requires grad (if the caller's logp does)
    old_logp: Tensor  # detached
    log_ratio: Tensor  # clamp(logp − old_logp, −20, 20), differentiable wrt logp
    adv: Tensor  # detached, broadcast to (B, T)
    valid: Tensor  # bool
    inputs: dict[str, Tensor]  # the loss's declared extra inputs (LOSS_INPUTS), 0 at padding


@dataclass
class Terms:
    """What a loss core returns: per-token loss plus the detached quantities metrics are built from."""

    loss: Tensor  # ℓ_t (B, T), authors' form
    weight: Tensor  # g_t (B, T), detached
    ratio: Tensor  # r_t (B, T), detached
    clip_low: Tensor  # bool (B, T)
    clip_high: Tensor  # bool (B, T)
    extra: dict[str, Tensor] = field(default_factory=dict)  # per-token values -> masked means


Validator = Callable[[str, dict[str, Any]], None]


class PolicyLoss:
    """A registered loss: validates inputs and params, runs the core, aggregates, builds metrics."""

    def __init__(
        self,
        name: str,
        core: Callable[..., Terms],
        default_agg: str,
        validate: Validator,
        inputs: tuple[str, ...] = (),
        ratio_mechanism: bool = False,
    ):
        self.name = name
        self.core = core
        self.default_agg = default_agg
        self.inputs = inputs
        self.ratio_mechanism = ratio_mechanism
        self.defaults = keyword_defaults(core)
        self._validate = validate
        self.__doc__ = core.__doc__
        self.__name__ = name

    def __repr__(self) -> str:
        extra = f", inputs={self.inputs}" if self.inputs else ""
        return f"PolicyLoss({self.name!r}, defaults={self.defaults}, default_agg={self.default_agg!r}{extra})"

    def __call__(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        *,
        agg: str | None = None,
        is_weights: Tensor | None = None,
        global_tokens: int | float | Tensor | None = None,
        global_seqs: int | float | Tensor | None = None,
        scale: float | Tensor | None = None,
        inputs: Mapping[str, Tensor] | None = None,
        **params: Any,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        check_param_names(KIND, self.name, params, self.defaults)
        p = {**self.defaults, **params}
        self._validate(self.name, p)
        mode = self.default_agg if agg is None else AGG_MODES.canonical(agg)
        given = dict(inputs or {})
        if set(given) != set(self.inputs):
            raise InvalidValueError(
                f"{KIND} {self.name!r} declares inputs {sorted(self.inputs)}, got {sorted(given)}"
            )
        batch, isw = _prepare(logp, old_logp, advantages, mask, is_weights, given)
        t = self.core(batch, **p)
        zero = torch.zeros((), dtype=batch.logp.dtype, device=batch.logp.device)
        per_token = t.loss if isw is None else t.loss * isw
        per_token = torch.where(batch.valid, per_token, zero)
        loss = agg_loss(
            per_token, batch.valid, mode, scale=scale, global_tokens=global_tokens, global_seqs=global_seqs
        )
        v = batch.valid
        with torch.no_grad():
            metrics = {
                "clipfrac_low": masked_mean(t.clip_low.to(zero.dtype), v),
                "clipfrac_high": masked_mean(t.clip_high.to(zero.dtype), v),
                "clipfrac": masked_mean((t.clip_low | t.clip_high).to(zero.dtype), v),
                "approx_kl": masked_mean(-batch.log_ratio.detach(), v),
                "ratio_mean": masked_mean(t.ratio, v),
                "weight_mean": masked_mean(t.weight, v),
            }
            for k, val in t.extra.items():
                metrics[k] = masked_mean(val.detach().to(zero.dtype), v)
        return loss, {k: m.detach() for k, m in metrics.items()}


POLICY_LOSSES: Registry[PolicyLoss] = Registry(KIND, group="posttrain.policy_losses")


def register_policy_loss(
    name: str,
    *,
    aliases: tuple[str, ...] = (),
    default_agg: str = "token-mean",
    validate: Validator,
    inputs: tuple[str, ...] = (),
    ratio_mechanism: bool = False,
) -> Callable[[Callable[..., Terms]], Callable[..., Terms]]:
    """Decorator: register a loss core `fn(batch, **params) -> Terms` under `name`.

    ``inputs``: extra per-token tensors the core reads from ``batch.inputs`` (names from
    ``LOSS_INPUTS``); callers must pass exactly these. ``ratio_mechanism``: what sets the objective
    apart from plain policy gradient (PPO/GRPO at r = 1) acts through the ratio r = π_θ / π_old (clip,
    clip-higher, dual clip, gates, a sequence ratio, a soft gate, a truncated IS weight), so with one
    on-policy update per rollout batch (r ≡ 1) it gives PPO/GRPO's gradient; the config warns
    (``SingleUpdateWarning``) when such an objective runs with ``minibatches=1`` and ``ppo_epochs=1``."""
    AGG_MODES.canonical(default_agg)
    unknown = [k for k in inputs if k not in LOSS_INPUTS]
    if unknown:
        raise InvalidValueError(
            f"{KIND} {name!r}: unknown input(s) {unknown}; known inputs: {', '.join(sorted(LOSS_INPUTS))}"
        )

    def deco(core: Callable[..., Terms]) -> Callable[..., Terms]:
        loss = PolicyLoss(name, core, default_agg, validate, tuple(inputs), ratio_mechanism)
        POLICY_LOSSES.register(name, aliases=aliases)(loss)
        return core

    return deco


def get_policy_loss(name: str) -> PolicyLoss:
    """The loss registered under `name` (or an alias); unknown names raise an error listing the known."""
    return POLICY_LOSSES.get(name)


def list_policy_losses(*, include_aliases: bool = False) -> list[str]:
    """Registered loss names (sorted)."""
    return POLICY_LOSSES.names(include_aliases=include_aliases)


def policy_loss_defaults(name: str) -> dict[str, Any]:
    """{param: default} of loss `name` — the keys a typed config may set for it."""
    return dict(POLICY_LOSSES.get(name).defaults)


def policy_loss_default_agg(name: str) -> str:
    """The aggregation mode the loss uses when the caller passes ``agg=None``."""
    return POLICY_LOSSES.get(name).default_agg


# ----------------------------------------------------------------------------------------------------
# input preparation


def _prepare(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    is_weights: Tensor | None,
    inputs: dict[str, Tensor],
) -> tuple[Batch, Tensor | None]:
    check_2d("logp", logp)
    check_float("logp", logp)
    check_2d("old_logp", old_logp, logp.shape)
    check_2d("mask", mask, logp.shape)
    if not isinstance(advantages, Tensor):
        raise InvalidTypeError(f"advantages: expected a torch.Tensor, got {type(advantages).__name__}")
    b = logp.shape[0]
    if advantages.shape == (b,):
        adv = advantages.unsqueeze(-1).expand_as(logp)
    elif advantages.shape == logp.shape:
        adv = advantages
    else:
        raise InvalidValueError(
            f"advantages: expected shape ({b},) or {tuple(logp.shape)} for logp of shape "
            f"{tuple(logp.shape)}, got {tuple(advantages.shape)}"
        )
    dtype = logp.dtype
    valid = as_bool_mask(mask)
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    lp = torch.where(valid, logp, zero)
    old = torch.where(valid, old_logp.detach().to(dtype), zero)
    a = torch.where(valid, adv.detach().to(dtype), zero)
    isw = None
    if is_weights is not None:
        check_2d("is_weights", is_weights, logp.shape)
        isw = torch.where(valid, is_weights.detach().to(dtype), zero)
    extra = {}
    for k, v in inputs.items():
        check_2d(f"inputs[{k!r}]", v, logp.shape)
        extra[k] = torch.where(valid, v.to(dtype), zero)
    log_ratio = torch.clamp(lp - old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return Batch(lp, old, log_ratio, a, valid, extra), isw


# ----------------------------------------------------------------------------------------------------
# parameter validation


def _check_clip(name: str, p: dict[str, Any], *, low_below_one: bool = False) -> None:
    for key in ("clip_low", "clip_high"):
        v = p[key]
        require(is_number(v) and v >= 0, KIND, name, key, "a number >= 0", v)
    if low_below_one:
        v = p["clip_low"]
        require(v < 1, KIND, name, "clip_low", "< 1 (the LN boundary 1 − clip_low must be > 0)", v)


def _check_dual(name: str, p: dict[str, Any]) -> None:
    """ppo/dapo: ``clip_c`` None (off) or > 1.  dgpo/maspo: ``dual_clip`` bool and ``clip_c`` > 1."""
    c = p["clip_c"]
    if "dual_clip" in p:
        require(isinstance(p["dual_clip"], bool), KIND, name, "dual_clip", "true or false", p["dual_clip"])
    elif c is None:
        return
    require(is_number(c) and c > 1, KIND, name, "clip_c", "a number > 1 (dual-clip bound c)", c)


def _validate_ppo(name: str, p: dict[str, Any]) -> None:
    _check_clip(name, p)
    _check_dual(name, p)


def _validate_clip_only(name: str, p: dict[str, Any]) -> None:
    _check_clip(name, p)


def _validate_sapo(name: str, p: dict[str, Any]) -> None:
    for key in ("tau_pos", "tau_neg"):
        require(is_number(p[key]) and p[key] > 0, KIND, name, key, "a number > 0", p[key])


def _validate_dgpo(name: str, p: dict[str, Any]) -> None:
    _check_clip(name, p, low_below_one=True)
    require(is_number(p["dgpo_n"]) and p["dgpo_n"] >= 0, KIND, name, "dgpo_n", "a number >= 0", p["dgpo_n"])
    require(is_number(p["dgpo_m"]) and p["dgpo_m"] > 0, KIND, name, "dgpo_m", "a number > 0", p["dgpo_m"])
    _check_dual(name, p)


def _validate_maspo(name: str, p: dict[str, Any]) -> None:
    for key in ("maspo_sigma_base", "maspo_sigma_high", "maspo_adv_low", "maspo_adv_high"):
        require(is_number(p[key]) and p[key] > 0, KIND, name, key, "a number > 0", p[key])
    for key in ("maspo_alpha", "maspo_beta_pos", "maspo_beta_neg"):
        require(is_number(p[key]) and p[key] >= 0, KIND, name, key, "a number >= 0", p[key])
    require(
        p["maspo_sigma_high"] >= p["maspo_sigma_base"],
        KIND,
        name,
        "maspo_sigma_high",
        f">= maspo_sigma_base ({p['maspo_sigma_base']})",
        p["maspo_sigma_high"],
    )
    require(
        p["maspo_adv_high"] >= p["maspo_adv_low"],
        KIND,
        name,
        "maspo_adv_high",
        f">= maspo_adv_low ({p['maspo_adv_low']})",
        p["maspo_adv_high"],
    )
    _check_dual(name, p)


# ----------------------------------------------------------------------------------------------------
# losses


def _with_value(log_ratio: Tensor, log_value: Tensor) -> Tensor:
    """exp(log_value) in value, with ∂/∂logp = exp(log_value) (straight-through in log space).

    ``exp(lr − sg(lr) + sg(log_value))`` — the authors' "ratio replacement" trick (FlyTune/DGPO-RL ``core_algos.py``): the
    value is the desired g_t and its derivative wrt logp is the same g_t (inside the ±20 clamp).
    """
    return torch.exp(log_ratio - log_ratio.detach() + log_value.detach())


def _dual_clip(adv: Tensor, loss: Tensor, weight: Tensor, c: float | None) -> tuple[Tensor, Tensor, Tensor]:
    """verl dual clip: for A < 0, ℓ = min(−A·c, ℓ), and g = 0 on the dual-clipped tokens (A < 0 ∧ −A·c < ℓ).

    Returns (ℓ, g, bool mask of dual-clipped tokens); ``c=None`` leaves ℓ and g as they are.
    """
    if c is None:
        return loss, weight, torch.zeros_like(adv, dtype=torch.bool)
    l3 = -adv * c
    dual = (adv < 0) & (l3 < loss)
    loss = torch.where(adv < 0, torch.minimum(l3, loss), loss)
    return loss, torch.where(dual, torch.zeros_like(weight), weight), dual


@register_policy_loss("ppo", aliases=("grpo", "vanilla"), validate=_validate_ppo)
def ppo(b: Batch, *, clip_low: float = 0.2, clip_high: float = 0.2, clip_c: float | None = 3.0) -> Terms:
    """PPO/GRPO clipped surrogate with asymmetric clip and dual clip (verl ``compute_policy_loss_vanilla``; arXiv 1707.06347, dual clip 1912.09729).

    Source: Schulman et al. 2017 (PPO, arXiv 1707.06347); dual clip: Ye et al. 2020 (arXiv 1912.09729);
    code: verl ``compute_policy_loss_vanilla``.

        L1 = −A·r;  L2 = −A·clamp(r, 1−ε_low, 1+ε_high);  ℓ = max(L1, L2)
        if A < 0 and clip_c is not None:  ℓ = min(−A·c, ℓ)

    g_t = r inside the trust region and in the unclipped regions (A>0 ∧ r<1−ε_low, A<0 ∧ 1+ε_high<r≤c);
    g_t = 0 if clipped (A>0 ∧ r>1+ε_high, A<0 ∧ r<1−ε_low) or dual-clipped (A<0 ∧ r>c).
    Defaults ε_low = ε_high = 0.2, c = 3.0 (verl actor.yaml); ``clip_c=None`` disables the dual clip.
    Metrics: ``clipfrac_high`` (A>0 side), ``clipfrac_low`` (A<0 side), ``dualclip_frac``.
    """
    adv, r = b.adv, torch.exp(b.log_ratio)
    l1 = -adv * r
    l2 = -adv * torch.clamp(r, 1.0 - clip_low, 1.0 + clip_high)
    clipped = l2 > l1
    rd = r.detach()
    weight = torch.where(clipped, torch.zeros_like(rd), rd)
    loss, weight, dual = _dual_clip(adv, torch.maximum(l1, l2), weight, clip_c)
    return Terms(
        loss, weight, rd, clipped & (adv < 0), clipped & (adv > 0), {"dualclip_frac": dual.to(rd.dtype)}
    )


@register_policy_loss("dapo", ratio_mechanism=True, validate=_validate_ppo)
def dapo(b: Batch, *, clip_low: float = 0.2, clip_high: float = 0.28, clip_c: float | None = 10.0) -> Terms:
    """DAPO clip-higher: the ``ppo`` loss with ε_low = 0.2, ε_high = 0.28, dual clip c = 10 (DAPO, arXiv 2503.14476).

    Source: Yu et al. 2025, DAPO (arXiv 2503.14476); code: verl ``docs/algo/dapo.md`` recipe
    (``clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0``, token-mean aggregation, vanilla
    loss incl. dual clip; ``ppo``'s default c is verl's actor default 3.0).
    g_t exactly as for ``ppo``. DAPO's other parts (dynamic sampling, overlong shaping) live in the
    sampler and reward layers.
    """
    return ppo(b, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c)


@register_policy_loss(
    "gspo", ratio_mechanism=True, default_agg="seq-mean-token-mean", validate=_validate_clip_only
)
def gspo(b: Batch, *, clip_low: float = 3e-4, clip_high: float = 4e-4) -> Terms:
    """GSPO: sequence-level ratio with per-token gradient (verl ``compute_policy_loss_gspo``; arXiv 2507.18071).

    Source: Zheng et al. 2025, Group Sequence Policy Optimization (arXiv 2507.18071).

        s_i     = exp( Σ_t m·(logp − old_logp) / |y_i| )                     (geometric-mean ratio)
        log s_it = sg(log s_i) + logp_t − sg(logp_t),  clamp(max=10);  s_it = exp(log s_it)
        ℓ_t     = max(−A·s_it, −A·clamp(s_it, 1−ε_low, 1+ε_high))            (no dual clip)

    g_t = s_i on every token of sequence i; 0 for the whole sequence if clipped (A>0 ∧ s_i>1+ε_high,
    A<0 ∧ s_i<1−ε_low) or if log s_i > 10. With the default ``seq-mean-token-mean`` aggregation the
    gradient is s_i·∇log s_i, GSPO's sequence-level gradient. Defaults ε = 3e-4 / 4e-4 (verl docs).
    Extra metric: ``seq_ratio_mean`` (mean over valid tokens of s_i).
    """
    valid = b.valid
    n = valid.sum(dim=-1).clamp(min=1).to(b.logp.dtype)
    # verl sums the UNclamped per-token log-ratios (only log s_it is clamped, at 10); padded positions
    # of logp/old_logp are already 0
    seq_log_ratio = (b.logp.detach() - b.old_logp).sum(dim=-1) / n
    log_s_raw = seq_log_ratio.unsqueeze(-1) + b.logp - b.logp.detach()
    log_s = torch.clamp(log_s_raw, max=10.0)
    s = torch.exp(log_s)
    adv = b.adv
    l1 = -adv * s
    l2 = -adv * torch.clamp(s, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(l1, l2)
    clipped = l2 > l1
    sd = s.detach()
    weight = torch.where(clipped | (log_s_raw.detach() > 10.0), torch.zeros_like(sd), sd)
    return Terms(
        loss,
        weight,
        torch.exp(b.log_ratio.detach()),
        clipped & (adv < 0),
        clipped & (adv > 0),
        {"seq_ratio_mean": sd},
    )


@register_policy_loss("cispo", ratio_mechanism=True, validate=_validate_clip_only)
def cispo(b: Batch, *, clip_low: float = 10.0, clip_high: float = 0.2) -> Terms:
    """CISPO: clipped importance-sampling weight on a REINFORCE term (verl ``compute_policy_loss_cispo``; MiniMax-M1, arXiv 2506.13585).

    Source: MiniMax-M1 (arXiv 2506.13585); code: verl ``compute_policy_loss_cispo``.

        ℓ_t = −sg(clamp(r, 1−ε_low, 1+ε_high)) · A · logp_t

    g_t = clamp(r, 1−ε_low, 1+ε_high) — never 0, the token always keeps a gradient. Defaults follow
    verl's ``examples/cispo_trainer`` script and the paper's "no lower bound": ε_low = 10 (inactive),
    ε_high = 0.2. ``clipfrac_high``/``clipfrac_low`` = fraction with r above/below the bounds (any A).
    """
    r = torch.exp(b.log_ratio)
    rd = r.detach()
    w = torch.clamp(rd, 1.0 - clip_low, 1.0 + clip_high)
    loss = -b.adv * w * b.logp
    return Terms(loss, w, rd, rd < 1.0 - clip_low, rd > 1.0 + clip_high)


@register_policy_loss(
    "sapo", ratio_mechanism=True, default_agg="seq-mean-token-mean", validate=_validate_sapo
)
def sapo(b: Batch, *, tau_pos: float = 1.0, tau_neg: float = 1.05) -> Terms:
    """SAPO: smooth sigmoid gate instead of a hard clip (verl ``compute_policy_loss_sapo``; arXiv 2511.20347).

    Source: Soft Adaptive Policy Optimization (Qwen team, arXiv 2511.20347); code: verl.

        τ = τ_pos if A > 0 else τ_neg;   f(r) = σ(τ·(r−1)) · 4/τ;   ℓ_t = −A·f(r)

    g_t = r·f'(r) = 4·r·σ(τ(r−1))·(1−σ(τ(r−1))); at r = 1, g = 1 (on-policy PG) and f(1) = 2/τ.
    Defaults τ_pos = 1.0, τ_neg = 1.05 (verl actor.yaml). No clipping: clip fractions are 0.
    Extra metric ``gate_mean`` = mean of g/r = 4σ(1−σ) (1 on-policy, → 0 far off-policy).
    """
    adv = b.adv
    r = torch.exp(b.log_ratio)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    sig = torch.sigmoid(tau * (r - 1.0))
    loss = -adv * sig * (4.0 / tau)
    rd, sd = r.detach(), sig.detach()
    gate = 4.0 * sd * (1.0 - sd)
    none = torch.zeros_like(b.valid)
    return Terms(loss, rd * gate, rd, none, none, {"gate_mean": gate})


@register_policy_loss("dgpo", ratio_mechanism=True, validate=_validate_dgpo)
def dgpo(
    b: Batch,
    *,
    dgpo_n: float = 1,
    dgpo_m: float = 2,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: bool = False,
    clip_c: float = 3.0,
) -> Terms:
    """DGPO: decoupled, decaying gradient in the clipped regions instead of zero (arXiv 2603.14389).

    Source: Decoupled Gradient Policy Optimization, arXiv 2603.14389 (ACL 2026); code:
    FlyTune/DGPO-RL ``compute_policy_loss`` (``ratio_mode == "dgpo"``). Authors' form, with
    the ratio replaced before ℓ_t = −A·ratio':

        LN (A<0 ∧ r<1−ε_low):  ratio' = exp(logp + n·sg(logp) − (n+1)·old_logp) / (1−ε_low)^n
        HP (A>0 ∧ r>1+ε_high): ratio' = exp(logp + log(1+ε_high)/m − old_logp·(m−1)/m − sg(logp)/m)
        elsewhere:             ratio' = r   (raw ratio: no clip, and no dual clip by default)

    The value of ratio' equals its own derivative wrt logp, so ℓ_t = −A·g_t with
        g_t = r·(r/(1−ε_low))^n on LN;  (1+ε_high)^{1/m}·r^{1−1/m} on HP;  r elsewhere.
    On ∇π this is W = C_left·π^n (LN) and C_right·π^{−1/m} (HP): bounded, decaying as π → 0.
    Here ratio' is computed in log space from the clamped log-ratio (same value and gradient).
    Defaults n = 1, m = 2, ε = 0.2/0.2 (authors' actor.yaml). ``dual_clip=True`` applies verl's dual
    clip with bound ``clip_c`` (off by default, as the authors). ``clipfrac_low``/``clipfrac_high`` =
    fraction of tokens in LN/HP.
    """
    adv, lr = b.adv, b.log_ratio
    lrd = lr.detach()
    rd = torch.exp(lrd)
    ln = (adv < 0) & (rd < 1.0 - clip_low)
    hp = (adv > 0) & (rd > 1.0 + clip_high)
    log_ln = (dgpo_n + 1) * lrd - dgpo_n * math.log(1.0 - clip_low)
    log_hp = math.log1p(clip_high) / dgpo_m + (1.0 - 1.0 / dgpo_m) * lrd
    log_value = torch.where(ln, log_ln, torch.where(hp, log_hp, lrd))
    ratio = _with_value(lr, log_value)
    loss, weight, dual = _dual_clip(adv, -adv * ratio, torch.exp(log_value), clip_c if dual_clip else None)
    return Terms(loss, weight, rd, ln, hp, {"dualclip_frac": dual.to(weight.dtype)})


@register_policy_loss("maspo", ratio_mechanism=True, validate=_validate_maspo)
def maspo(
    b: Batch,
    *,
    maspo_sigma_base: float = 1.0,
    maspo_alpha: float = 0.3,
    maspo_sigma_high: float = 10.0,
    maspo_beta_pos: float = 0.03,
    maspo_beta_neg: float = 0.03,
    maspo_adv_low: float = 0.1,
    maspo_adv_high: float = 10.0,
    dual_clip: bool = False,
    clip_c: float = 3.0,
) -> Terms:
    """MASPO: mass-adaptive unilateral Gaussian gate on the detached ratio (arXiv 2602.17550; FlyTune/MASPO-RL ``core_algos.py``).

    Source: Mass-Adaptive Soft Policy Optimization, arXiv 2602.17550; code: FlyTune/MASPO-RL
    ``compute_policy_loss`` (``"maspo" in ratio_mode``). With r̄ = sg(r), π_old = exp(old_logp):

        mass  = clamp(σ_base / π_old^α, σ_base, σ_high)
        σ_pos = mass · clamp(1 + β_pos·A, a_low, a_high)           (A > 0: wider gate)
        σ_neg = mass · clamp(1 / (1 − β_neg·A), a_low, a_high)     (A < 0: narrower gate)
        w     = exp(−(r̄−1)² / (2σ²)) if (A>0 ∧ r>1) or (A<0 ∧ r<1), else 1
        ℓ_t   = −A·w·r                                            (no hard clip, no dual clip)

    g_t = w·r (w is detached). σ_neg is only evaluated where A < 0 (1 − β_neg·A would hit 0 at
    A = 1/β_neg for positive A). Defaults σ_base 1, α 0.3, σ_high 10, β 0.03/0.03, a 0.1/10 (authors'
    actor.yaml). ``dual_clip=True`` adds verl's dual clip (bound ``clip_c``; off by default).
    Extra metrics: ``gate_mean`` (mean w, ungated tokens count as 1), ``gated_frac``, ``sigma_mean``.
    """
    adv = b.adv
    r = torch.exp(b.log_ratio)
    rd = r.detach()
    mass = torch.clamp(
        maspo_sigma_base * torch.exp(-maspo_alpha * b.old_logp), maspo_sigma_base, maspo_sigma_high
    )
    a_pos = torch.where(adv > 0, adv, torch.zeros_like(adv))
    a_neg = torch.where(adv < 0, adv, torch.zeros_like(adv))
    sigma_pos = mass * torch.clamp(1.0 + maspo_beta_pos * a_pos, maspo_adv_low, maspo_adv_high)
    sigma_neg = mass * torch.clamp(1.0 / (1.0 - maspo_beta_neg * a_neg), maspo_adv_low, maspo_adv_high)
    sigma = torch.where(adv > 0, sigma_pos, sigma_neg)
    gated = ((adv > 0) & (rd > 1.0)) | ((adv < 0) & (rd < 1.0))
    w = torch.where(gated, torch.exp(-((rd - 1.0) ** 2) / (2.0 * sigma**2)), torch.ones_like(rd))
    loss, weight, dual = _dual_clip(adv, -adv * (w * r), w * rd, clip_c if dual_clip else None)
    none = torch.zeros_like(gated)
    extra = {"gate_mean": w, "gated_frac": gated, "sigma_mean": sigma, "dualclip_frac": dual}
    return Terms(loss, weight, rd, none, none, extra)
