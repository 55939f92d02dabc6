"""Preference-optimization losses (DPO family and KTO), one string-keyed registry.

Every loss is called the same way::

    loss, metrics = get_preference_loss(name)(inputs, *, global_pairs=None, global_tokens=None, **params)

``inputs`` is a :class:`PreferenceInputs` of SEQUENCE-level quantities (the trainer sums token
log-probs over each completion; nothing here sees a model):

    l_w, l_l   chosen_logps / rejected_logps: Σ_t log π_θ(y_t | x, y_<t) over the completion (differentiable)
    n_w, n_l   chosen_tokens / rejected_tokens: completion lengths |y| (> 0)
    r_w, r_l   ref_chosen_logps / ref_rejected_logps: the same sums under π_ref (None for reference-free losses)
    kl, ref_kl kl_logps / ref_kl_logps: KTO's mismatched (x_i, y_j) completions under π_θ and π_ref (detached)

===========  ======================================================================  ======================
loss         per-pair (per-example for kto) loss                                     source
===========  ======================================================================  ======================
dpo          −(1−ε)·log σ(βΔ) − ε·log σ(−βΔ),  Δ = (l_w − r_w) − (l_l − r_l)           DPO 2305.18290 Eq. 7;
                                                                                     cDPO (ε > 0)
ipo          ((l_w − r_w)/n_w − (l_l − r_l)/n_l − 1/(2β))²                           IPO 2310.12036 Eq. 17
simpo        −log σ(β·l_w/n_w − β·l_l/n_l − γ)               (no reference)           SimPO 2405.14734 Eq. 6
orpo         NLL(y_w) − λ·log σ(log odds(ā_w) − log odds(ā_l)), ā = l/n (no ref.)     ORPO 2403.07691 Eq. 6–7
kto          λ_D(1 − σ(β(l_w − r_w − z0))) | λ_U(1 − σ(β(z0 − l_l + r_l)))          KTO 2402.01306 Eq. 8
             z0 = max(0, mean(kl − ref_kl)), detached
===========  ======================================================================  ======================

Conventions shared by all losses:

* Gradients flow through ``chosen_logps`` / ``rejected_logps`` only; reference and KL log-probs and
  the lengths are constants (detached).
* Aggregation: the mean over pairs (kto: over the desirable and undesirable examples together), as
  TRL's ``DPOTrainer``/``KTOTrainer``. ``global_pairs`` (the number of pairs, kto: examples, of the
  WHOLE batch) and ``global_tokens`` (orpo: chosen tokens of the whole batch) replace the local
  counts, so summing the losses of micro-batches gives the whole batch's loss (micro-batch invariance;
  kto's z0 must then come from the whole batch's ``kl_logps``).
* Metrics (detached 0-d, means over this call's rows), the keys TRL users read: ``rewards/chosen``,
  ``rewards/rejected`` (each loss's implicit reward: β·(l − r) for dpo/ipo/kto, β·l/n for
  simpo/orpo, as TRL logs them), ``rewards/margins``, ``rewards/accuracies`` (fraction of pairs with
  reward_w > reward_l; paired inputs only), ``logps/chosen``, ``logps/rejected`` (mean l), plus
  loss-specific keys (``kl`` for kto, ``nll_loss`` and ``log_odds_ratio`` for orpo).
* A loss declares whether it needs reference log-probs (``needs_reference``) and KL completions
  (``needs_kl``) when it is registered; a trainer reads these and computes nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from posttrain.algos._common import check_param_names, is_number, keyword_defaults, require
from posttrain.utils.errors import InvalidTypeError, InvalidValueError
from posttrain.utils.registry import Registry

Tensor = torch.Tensor

KIND = "preference loss"


class PreferenceInputs(NamedTuple):
    """Sequence-level inputs of a preference loss (module docstring). Chosen and rejected have the
    same length B for the paired losses; kto takes any numbers of desirable and undesirable rows."""

    chosen_logps: Tensor
    rejected_logps: Tensor
    chosen_tokens: Tensor
    rejected_tokens: Tensor
    ref_chosen_logps: Tensor | None = None
    ref_rejected_logps: Tensor | None = None
    kl_logps: Tensor | None = None
    ref_kl_logps: Tensor | None = None


class Sides(NamedTuple):
    """What a loss core ``fn(inputs, n_tok, **params)`` returns (``n_tok``: the chosen-token count of
    the whole batch): the SUMMED per-row loss, the count it is a mean over by default (pairs, or kto's
    examples), the implicit rewards per row (detached), extra 0-d metrics, and ``plus``, a term
    already normalised (orpo's token-mean NLL) that is added after the division."""

    loss_sum: Tensor
    count: int
    reward_chosen: Tensor
    reward_rejected: Tensor
    extra: dict[str, Tensor]
    plus: Tensor | float = 0.0


Validator = Callable[[str, dict[str, Any]], None]


class PreferenceLoss:
    """A registered preference loss: validates inputs and params, runs the core, aggregates, builds
    the metrics."""

    def __init__(
        self,
        name: str,
        core: Callable[..., Sides],
        validate: Validator,
        *,
        needs_reference: bool,
        needs_kl: bool,
        paired: bool,
    ):
        self.name = name
        self.core = core
        self.defaults = keyword_defaults(core)
        self.needs_reference = needs_reference
        self.needs_kl = needs_kl
        self.paired = paired
        self._validate = validate
        self.__doc__ = core.__doc__
        self.__name__ = name

    def __repr__(self) -> str:
        return (
            f"PreferenceLoss({self.name!r}, defaults={self.defaults}, needs_reference={self.needs_reference}, "
            f"needs_kl={self.needs_kl})"
        )

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Names and values of ``params`` (config time); returns them merged over the defaults."""
        check_param_names(KIND, self.name, params, self.defaults)
        p = {**self.defaults, **params}
        self._validate(self.name, p)
        return p

    def __call__(
        self,
        inputs: PreferenceInputs,
        *,
        global_pairs: int | float | None = None,
        global_tokens: int | float | Tensor | None = None,
        **params: Any,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        p = self.check_params(params)
        x = _prepare(self, inputs)
        n_tok = (
            x.chosen_tokens.sum()
            if global_tokens is None
            else torch.as_tensor(global_tokens, dtype=x.chosen_logps.dtype)
        )
        s = self.core(x, n_tok, **p)
        denom = s.count if global_pairs is None else global_pairs
        if not (is_number(denom) and denom > 0):
            raise InvalidValueError(f"{KIND} {self.name!r}: global_pairs must be a number > 0, got {denom!r}")
        loss = s.loss_sum / denom + s.plus
        with torch.no_grad():
            rc, rr = s.reward_chosen.detach(), s.reward_rejected.detach()
            metrics = {
                "rewards/chosen": _mean(rc),
                "rewards/rejected": _mean(rr),
                "logps/chosen": _mean(x.chosen_logps.detach()),
                "logps/rejected": _mean(x.rejected_logps.detach()),
            }
            if rc.shape == rr.shape:
                metrics["rewards/margins"] = _mean(rc - rr)
                metrics["rewards/accuracies"] = _mean((rc > rr).to(rc.dtype))
            for k, v in s.extra.items():
                metrics[k] = v.detach()
        return loss, metrics


def _mean(t: Tensor) -> Tensor:
    return t.mean() if t.numel() else torch.zeros((), dtype=t.dtype, device=t.device)


PREFERENCE_LOSSES: Registry[PreferenceLoss] = Registry(KIND, group="posttrain.preference_losses")


def register_preference_loss(
    name: str,
    *,
    aliases: tuple[str, ...] = (),
    validate: Validator,
    needs_reference: bool,
    needs_kl: bool = False,
    paired: bool = True,
) -> Callable[[Callable[..., Sides]], Callable[..., Sides]]:
    """Decorator: register a core ``fn(inputs, n_tok, **params) -> Sides`` under ``name``.

    ``needs_reference``: the core reads ``ref_chosen_logps``/``ref_rejected_logps`` (a trainer
    computes them; reference-free losses get None). ``needs_kl``: it reads ``kl_logps``/``ref_kl_logps``.
    ``paired``: chosen and rejected rows must pair up one to one."""

    def deco(core: Callable[..., Sides]) -> Callable[..., Sides]:
        loss = PreferenceLoss(
            name, core, validate, needs_reference=needs_reference, needs_kl=needs_kl, paired=paired
        )
        PREFERENCE_LOSSES.register(name, aliases=aliases)(loss)
        return core

    return deco


def get_preference_loss(name: str) -> PreferenceLoss:
    """The loss registered under ``name`` (or an alias); unknown names raise an error listing the known."""
    return PREFERENCE_LOSSES.get(name)


def list_preference_losses(*, include_aliases: bool = False) -> list[str]:
    """Registered preference-loss names (sorted)."""
    return PREFERENCE_LOSSES.names(include_aliases=include_aliases)


def preference_loss_defaults(name: str) -> dict[str, Any]:
    """{param: default} of loss ``name`` — the keys ``PreferenceConfig.loss.params`` may set."""
    return dict(PREFERENCE_LOSSES.get(name).defaults)


# ----------------------------------------------------------------------------------------------------
# input checks


def _vector(loss: str, key: str, t: Any, n: int | None = None) -> Tensor:
    if not isinstance(t, Tensor):
        raise InvalidTypeError(
            f"{KIND} {loss!r}: {key}: expected a torch.Tensor of shape (B,), got {type(t).__name__}"
        )
    if t.dim() != 1 or (n is not None and t.shape[0] != n):
        want = "(B,)" if n is None else f"({n},)"
        raise InvalidValueError(f"{KIND} {loss!r}: {key}: expected shape {want}, got {tuple(t.shape)}")
    return t


def _prepare(loss: PreferenceLoss, x: PreferenceInputs) -> PreferenceInputs:
    name = loss.name
    lw = _vector(name, "chosen_logps", x.chosen_logps)
    if not torch.is_floating_point(lw):
        raise InvalidTypeError(
            f"{KIND} {name!r}: chosen_logps: expected a floating-point tensor, got {lw.dtype}"
        )
    ll = _vector(name, "rejected_logps", x.rejected_logps, lw.shape[0] if loss.paired else None)
    nw = _vector(name, "chosen_tokens", x.chosen_tokens, lw.shape[0]).detach().to(lw.dtype)
    nl = _vector(name, "rejected_tokens", x.rejected_tokens, ll.shape[0]).detach().to(lw.dtype)
    for key, n in (("chosen_tokens", nw), ("rejected_tokens", nl)):
        if n.numel() and bool((n <= 0).any()):
            raise InvalidValueError(f"{KIND} {name!r}: {key}: every completion needs at least one token")
    refs: list[Tensor | None] = [None, None]
    if loss.needs_reference:
        for i, (key, t, like) in enumerate(
            (("ref_chosen_logps", x.ref_chosen_logps, lw), ("ref_rejected_logps", x.ref_rejected_logps, ll))
        ):
            if t is None:
                raise InvalidValueError(f"{KIND} {name!r} needs reference log-probs: {key} is None")
            refs[i] = _vector(name, key, t, like.shape[0]).detach().to(lw.dtype)
    kls: list[Tensor | None] = [None, None]
    if loss.needs_kl:
        if x.kl_logps is None or x.ref_kl_logps is None:
            raise InvalidValueError(
                f"{KIND} {name!r} needs the KL completions' log-probs: kl_logps and ref_kl_logps (mismatched "
                "prompt/completion pairs under the policy and the reference)"
            )
        k = _vector(name, "kl_logps", x.kl_logps).detach().to(lw.dtype)
        kls = [k, _vector(name, "ref_kl_logps", x.ref_kl_logps, k.shape[0]).detach().to(lw.dtype)]
    return PreferenceInputs(lw, ll, nw, nl, refs[0], refs[1], kls[0], kls[1])


# ----------------------------------------------------------------------------------------------------
# parameter validation


def _positive(name: str, p: dict[str, Any], *keys: str) -> None:
    for key in keys:
        require(is_number(p[key]) and p[key] > 0, KIND, name, key, "a number > 0", p[key])


def _validate_dpo(name: str, p: dict[str, Any]) -> None:
    _positive(name, p, "beta")
    eps = p["label_smoothing"]
    require(is_number(eps) and 0 <= eps < 0.5, KIND, name, "label_smoothing", "a number in [0, 0.5)", eps)


def _validate_beta(name: str, p: dict[str, Any]) -> None:
    _positive(name, p, "beta")


def _validate_simpo(name: str, p: dict[str, Any]) -> None:
    _positive(name, p, "beta")
    require(is_number(p["gamma"]) and p["gamma"] >= 0, KIND, name, "gamma", "a number >= 0", p["gamma"])


def _validate_kto(name: str, p: dict[str, Any]) -> None:
    _positive(name, p, "beta", "desirable_weight", "undesirable_weight")


# ----------------------------------------------------------------------------------------------------
# losses


def _log1mexp(a: Tensor) -> Tensor:
    """log(1 − exp(a)) for a < 0, stable at both ends (Mächler 2012: log(−expm1(a)) near 0,
    log1p(−exp(a)) below −log 2)."""
    near = a > -0.6931471805599453
    # each branch on inputs safe for it, so the unused branch's gradient is 0, not inf·0 = nan
    hi = torch.where(near, a, torch.full_like(a, -1.0))
    lo = torch.where(near, torch.full_like(a, -1.0), a)
    return torch.where(near, torch.log(-torch.expm1(hi)), torch.log1p(-torch.exp(lo)))


@register_preference_loss("dpo", aliases=("sigmoid",), validate=_validate_dpo, needs_reference=True)
def dpo(x: PreferenceInputs, n_tok: Tensor, *, beta: float = 0.1, label_smoothing: float = 0.0) -> Sides:
    """DPO, sigmoid loss, with conservative DPO's label smoothing (arXiv 2305.18290 Eq. 7; cDPO).

    Source: Rafailov et al. 2023, Direct Preference Optimization (arXiv 2305.18290), Eq. 7; cDPO:
    Mitchell 2023, "A note on DPO with noisy preferences" (labels flipped with probability ε).

        Δ = (l_w − r_w) − (l_l − r_l);   ℓ = −(1−ε)·log σ(βΔ) − ε·log σ(−βΔ)

    ∂ℓ/∂l_w = −∂ℓ/∂l_l = β·(−(1−ε)·σ(−βΔ) + ε·σ(βΔ)). Defaults β = 0.1, ε = 0 (TRL ``DPOConfig``;
    with ε = 0 this is TRL's ``loss_type="sigmoid"``). Rewards β·(l − r).
    """
    rw, rl = x.chosen_logps - x.ref_chosen_logps, x.rejected_logps - x.ref_rejected_logps
    z = beta * (rw - rl)
    per = -(1.0 - label_smoothing) * F.logsigmoid(z)
    if label_smoothing:
        per = per - label_smoothing * F.logsigmoid(-z)
    return Sides(per.sum(), len(z), beta * rw.detach(), beta * rl.detach(), {})


@register_preference_loss("ipo", validate=_validate_beta, needs_reference=True)
def ipo(x: PreferenceInputs, n_tok: Tensor, *, beta: float = 0.1) -> Sides:
    """IPO: squared loss on the length-normalised log-ratio margin (arXiv 2310.12036 Eq. 17).

    Source: Azar et al. 2023, A General Theoretical Paradigm to Understand Learning from Human
    Preferences (arXiv 2310.12036), Eq. 17 with τ = β; per-token normalisation as in TRL's
    ``loss_type="ipo"`` (confirmed with the IPO authors, per TRL's comment):

        h = (l_w − r_w)/n_w − (l_l − r_l)/n_l;   ℓ = (h − 1/(2β))²

    ∂ℓ/∂l_w = 2(h − 1/(2β))/n_w,  ∂ℓ/∂l_l = −2(h − 1/(2β))/n_l. Default β = 0.1 (TRL).
    Rewards β·(l − r) (TRL logs the same).
    """
    rw, rl = x.chosen_logps - x.ref_chosen_logps, x.rejected_logps - x.ref_rejected_logps
    h = rw / x.chosen_tokens - rl / x.rejected_tokens
    per = (h - 1.0 / (2.0 * beta)) ** 2
    return Sides(per.sum(), len(h), beta * rw.detach(), beta * rl.detach(), {})


@register_preference_loss("simpo", validate=_validate_simpo, needs_reference=False)
def simpo(x: PreferenceInputs, n_tok: Tensor, *, beta: float = 2.0, gamma: float = 1.0) -> Sides:
    """SimPO: reference-free, length-normalised reward with a target margin γ (arXiv 2405.14734 Eq. 6).

    Source: Meng, Xia, Chen 2024, SimPO: Simple Preference Optimization with a Reference-Free Reward
    (arXiv 2405.14734), Eq. 6:

        ℓ = −log σ(β·l_w/n_w − β·l_l/n_l − γ)

    ∂ℓ/∂l_w = −σ(−z)·β/n_w, ∂ℓ/∂l_l = σ(−z)·β/n_l with z the argument. Defaults β = 2.0, γ = 1.0
    (γ/β = 0.5), inside the ranges the paper tunes over (β 2.0–2.5, γ/β 0.3–0.8 for its base models).
    TRL's ``CPOTrainer(loss_type="simpo")`` is the same loss with ``simpo_gamma`` = γ. Rewards β·l/n.
    """
    aw, al = x.chosen_logps / x.chosen_tokens, x.rejected_logps / x.rejected_tokens
    z = beta * (aw - al) - gamma
    per = -F.logsigmoid(z)
    return Sides(per.sum(), len(z), beta * aw.detach(), beta * al.detach(), {})


@register_preference_loss("orpo", validate=_validate_beta, needs_reference=False)
def orpo(x: PreferenceInputs, n_tok: Tensor, *, beta: float = 0.1) -> Sides:
    """ORPO: NLL on the chosen completion plus a log-odds-ratio penalty (arXiv 2403.07691 Eqs. 6–7).

    Source: Hong, Lee, Thorne 2024, ORPO: Monolithic Preference Optimization without Reference Model
    (arXiv 2403.07691): L = L_SFT + λ·L_OR with L_OR = −log σ(log odds(y_w) − log odds(y_l)),
    odds(y) = P/(1 − P) on the length-averaged log-likelihood ā = l/n (Eq. 4), as TRL's
    ``ORPOTrainer``:

        log-odds ratio L = (ā_w − ā_l) − (log(1 − e^{ā_w}) − log(1 − e^{ā_l}))
        ℓ = −Σ l_w / N_tokens(chosen)  −  λ·mean log σ(L)

    The NLL term is the token-mean over all chosen tokens of the batch (``global_tokens`` under
    micro-batching). ∂L/∂ā_w = 1/(1 − e^{ā_w}), ∂L/∂ā_l = −1/(1 − e^{ā_l}). Default λ = β = 0.1
    (paper and TRL ``ORPOConfig``). Rewards β·ā (TRL). Extra metrics ``nll_loss``, ``log_odds_ratio``.
    """
    aw, al = x.chosen_logps / x.chosen_tokens, x.rejected_logps / x.rejected_tokens
    log_odds = (aw - al) - (_log1mexp(aw) - _log1mexp(al))
    ratio = F.logsigmoid(log_odds)
    nll = -x.chosen_logps.sum() / n_tok  # token-mean NLL of the chosen completions (this part of it)
    extra = {"nll_loss": nll.detach(), "log_odds_ratio": _mean(log_odds.detach())}
    return Sides(-beta * ratio.sum(), len(aw), beta * aw.detach(), beta * al.detach(), extra, plus=nll)


@register_preference_loss("kto", validate=_validate_kto, needs_reference=True, needs_kl=True, paired=False)
def kto(
    x: PreferenceInputs,
    n_tok: Tensor,
    *,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> Sides:
    """KTO: prospect-theoretic loss on unpaired desirable / undesirable completions (arXiv 2402.01306 Eq. 8).

    Source: Ethayarajh et al. 2024, KTO: Model Alignment as Prospect Theoretic Optimization (arXiv
    2402.01306), Eq. 8, with the reference point estimated from mismatched pairs (x_i, y_j) of the batch
    as in the paper (Sec. 4.1) and TRL's ``KTOTrainer``:

        z0 = max(0, mean_j (kl_j − ref_kl_j))                  (detached)
        desirable:   ℓ = λ_D·(1 − σ(β·(l_w − r_w − z0)))
        undesirable: ℓ = λ_U·(1 − σ(β·(z0 − (l_l − r_l))))
        loss = mean over all desirable and undesirable examples

    Defaults β = 0.1, λ_D = λ_U = 1 (TRL ``KTOConfig``). Rewards β·(l − r); extra metric ``kl`` = z0.
    """
    z0 = (
        torch.clamp((x.kl_logps - x.ref_kl_logps).mean(), min=0.0)
        if len(x.kl_logps)
        else x.kl_logps.new_zeros(())
    )
    rw, rl = x.chosen_logps - x.ref_chosen_logps, x.rejected_logps - x.ref_rejected_logps
    lw = desirable_weight * (1.0 - torch.sigmoid(beta * (rw - z0)))
    ll = undesirable_weight * (1.0 - torch.sigmoid(beta * (z0 - rl)))
    return Sides(lw.sum() + ll.sum(), len(lw) + len(ll), beta * rw.detach(), beta * rl.detach(), {"kl": z0})
