"""Outcome-reward advantage estimators (group baselines).

Method estimators (DuCA/HIAN in the lab's DuCA recipe) register into the same registry by entry point.

Registered estimators share one call: ``get_advantage(name)(rewards, group_ids, **params) -> (B,)``.
``rewards`` (B,) are outcome scores, ``group_ids`` (B,) integer ids of the prompt each completion
answers (any values, any order, groups of any size). Everything is vectorised with
``torch.unique`` / ``index_add_`` (no Python loop over groups) and computed without gradient.

===============  ===========================================================================  ===========
name             A_i (g = group of i, n = |g|, μ_g = mean, s_g = unbiased std over g)          source
===============  ===========================================================================  ===========
``grpo``         (R_i − μ_g) / (s_g + ε);  n = 1: μ = 0, s = 1 → A = R/(1+ε)                    2402.03300
                 ``norm_std=False``: R_i − μ_g  (Dr.GRPO)
``dr_grpo``      R_i − μ_g  (n = 1: A = R)                                                     2503.20783
``rloo``         R_i − (Σ_g R − R_i)/(n − 1)  = n/(n−1)·(R_i − μ_g);  n = 1: A = R             verl rloo
``reinforce_pp`` x_i = R_i − μ_g (n = 1: x = R), then whitened over the batch's tokens:        verl
                 (x_i − mean_tok(x)) / sqrt(var_tok(x) + ε)  (verl masked_whiten)              REINFORCE++
``reinforce_plus_plus``  R_i whitened over the batch's tokens (no baseline; γ = 1)             verl
===============  ===========================================================================  ===========

We keep verl's singleton rule (a one-member group has baseline 0, so its
advantage is its raw score); drop such groups in the sampler if that is unwanted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from posttrain.algos._common import check_param_names, is_number, keyword_defaults, require
from posttrain.utils.errors import InvalidTypeError, InvalidValueError
from posttrain.utils.registry import Registry

Tensor = torch.Tensor
KIND = "advantage estimator"


class AdvantageEstimator:
    """A registered estimator: checks inputs and params, then runs the formula under no_grad."""

    def __init__(
        self,
        name: str,
        fn: Callable[..., Tensor],
        validate: Callable[[str, dict], None],
        *,
        group_baseline: bool = False,
        zero_variance: Callable[..., Tensor] | None = None,
    ):
        self.name = name
        #: True when the estimator's baseline is the prompt's own group: with groups of one
        #: completion it degenerates (no baseline), so ``rollout.group_size=1`` is refused at config time
        self.group_baseline = group_baseline
        self.fn = fn
        self._zero_variance = zero_variance
        self.defaults = keyword_defaults(fn)
        self._validate = validate
        self.__doc__ = fn.__doc__
        self.__name__ = name

    def __repr__(self) -> str:
        return f"AdvantageEstimator({self.name!r}, defaults={self.defaults})"

    def __call__(self, rewards: Tensor, group_ids: Tensor | Sequence[int], **params: Any) -> Tensor:
        check_param_names(KIND, self.name, params, self.defaults)
        p = {**self.defaults, **params}
        self._validate(self.name, p)
        r, inv, n_groups = check_rewards_groups(f"{KIND} {self.name!r}", rewards, group_ids)
        with torch.no_grad():
            return self.fn(r, inv, n_groups, **p)

    def zero_variance_groups(self, rewards: Tensor, group_ids: Tensor, **inputs: Any) -> Tensor:
        """(G,) bool per group (sorted ``group_ids``): True where nothing this estimator normalises varies
        in the group (or the group has one member), so its advantages carry no signal. The trainer logs
        the mean as ``zero_var_frac``. Default: the outcome rewards are constant in the group; an
        estimator with more inputs (DuCA's per-turn rewards) registers its own rule
        (``register_advantage(..., zero_variance=fn)``, ``fn(rewards, group_ids, **inputs)``)."""
        if self._zero_variance is not None:
            return self._zero_variance(rewards, group_ids, **inputs)
        return constant_groups(rewards, group_ids)


ADVANTAGES: Registry[AdvantageEstimator] = Registry(KIND, group="posttrain.advantages")


def _no_params(name: str, p: dict) -> None:
    return None


def _validate_eps(name: str, p: dict) -> None:
    require(is_number(p["eps"]) and p["eps"] >= 0, KIND, name, "eps", "a number >= 0", p["eps"])
    if "norm_std" in p:
        require(isinstance(p["norm_std"], bool), KIND, name, "norm_std", "true or false", p["norm_std"])


def register_advantage(
    name: str,
    *,
    aliases: tuple[str, ...] = (),
    validate=_no_params,
    group_baseline: bool = False,
    zero_variance: Callable[..., Tensor] | None = None,
):
    """Decorator: register `fn(rewards, inverse_group_index, n_groups, **params) -> (B,)`;
    ``group_baseline``: the baseline is the group's rewards (needs groups of >= 2); ``zero_variance``:
    the estimator's own rule for groups without signal (:meth:`AdvantageEstimator.zero_variance_groups`)."""

    def deco(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        ADVANTAGES.register(name, aliases=aliases)(
            AdvantageEstimator(name, fn, validate, group_baseline=group_baseline, zero_variance=zero_variance)
        )
        return fn

    return deco


def get_advantage(name: str) -> AdvantageEstimator:
    """The estimator registered under `name`; unknown names raise an error listing the known ones."""
    return ADVANTAGES.get(name)


def list_advantages(*, include_aliases: bool = False) -> list[str]:
    return ADVANTAGES.names(include_aliases=include_aliases)


def advantage_defaults(name: str) -> dict[str, Any]:
    """{param: default} of estimator `name` (the keys a typed config may set)."""
    return dict(ADVANTAGES.get(name).defaults)


# ----------------------------------------------------------------------------------------------------
# group statistics


def check_rewards_groups(where: str, rewards: Any, group_ids: Any) -> tuple[Tensor, Tensor, int]:
    if not isinstance(rewards, Tensor):
        raise InvalidTypeError(
            f"{where}: rewards must be a torch.Tensor of shape (B,), got {type(rewards).__name__}"
        )
    if rewards.dim() != 1:
        raise InvalidValueError(f"{where}: rewards must have shape (B,), got {tuple(rewards.shape)}")
    r = rewards.detach()
    if not torch.is_floating_point(r):
        r = r.to(torch.get_default_dtype())
    bad = (~torch.isfinite(r)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise InvalidValueError(f"{where}: rewards[{i}] = {float(r[i])} is not finite")
    g = group_ids if isinstance(group_ids, Tensor) else torch.as_tensor(group_ids)
    if g.dim() != 1 or g.shape[0] != r.shape[0]:
        raise InvalidValueError(
            f"{where}: group_ids must have shape ({r.shape[0]},) like rewards, got {tuple(g.shape)}"
        )
    if g.dtype.is_floating_point or g.dtype.is_complex or g.dtype == torch.bool:
        raise InvalidTypeError(f"{where}: group_ids must be an integer tensor, got {g.dtype}")
    inv, n = group_index(g.to(r.device))
    return r, inv, n


def group_index(keys: Tensor) -> tuple[Tensor, int]:
    """Dense group index 0..G−1 for each row of `keys` ((N,) ids or (N, k) composite keys)."""
    if keys.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=keys.device), 0
    uniq, inv = torch.unique(keys, return_inverse=True, dim=0 if keys.dim() > 1 else None)
    return inv, int(uniq.shape[0])


def group_stats(values: Tensor, inv: Tensor, n_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group (count, mean, unbiased std) of `values` ((N,) or (N, C)), each indexed by group.

    Groups of one member get std 0 (the Bessel denominator is clamped to 1); callers apply their
    own singleton rule.
    """
    shape = (n_groups, *values.shape[1:])
    count = torch.bincount(inv, minlength=n_groups).to(values.dtype)
    c = count.view(-1, *([1] * (values.dim() - 1)))
    total = torch.zeros(shape, dtype=values.dtype, device=values.device).index_add_(0, inv, values)
    mean = total / c.clamp(min=1)
    dev = values - mean[inv]
    sq = torch.zeros(shape, dtype=values.dtype, device=values.device).index_add_(0, inv, dev * dev)
    std = torch.sqrt(sq / (c - 1).clamp(min=1))
    return count, mean, std


# ----------------------------------------------------------------------------------------------------
# estimators


def constant_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """(G,) bool per group (sorted ``group_ids``): True where the rewards do not vary within the group
    (absolute spread < 1e-12) or the group has a single member."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    r = rewards.double()
    cnt, mean, _ = group_stats(r, inv, n_groups)
    spread = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, (r - mean[inv]).abs())
    return (spread < 1e-12) | (cnt < 2)


@register_advantage("grpo", validate=_validate_eps, group_baseline=True)
def grpo(r: Tensor, inv: Tensor, n_groups: int, *, norm_std: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO group-normalised advantage (verl ``compute_grpo_outcome_advantage``; DeepSeekMath, arXiv 2402.03300).

    Source: Shao et al. 2024, DeepSeekMath (arXiv 2402.03300).

        A_i = (R_i − mean_g(R)) / (std_g(R) + ε)        std unbiased (Bessel), ε = 1e-6
        |g| = 1: mean = 0, std = 1                       (verl: a singleton keeps its score)
        norm_std=False: A_i = R_i − mean_g(R)            (Dr.GRPO, arXiv 2503.20783)
    """
    count, mean, std = group_stats(r, inv, n_groups)
    single = count[inv] < 2
    mu = torch.where(single, torch.zeros_like(r), mean[inv])
    if not norm_std:
        return r - mu
    sd = torch.where(single, torch.ones_like(r), std[inv])
    return (r - mu) / (sd + eps)


@register_advantage("dr_grpo", group_baseline=True)
def dr_grpo(r: Tensor, inv: Tensor, n_groups: int) -> Tensor:
    """Dr.GRPO advantage: A_i = R_i − mean_g(R), no std division (Dr.GRPO, arXiv 2503.20783).

    Same as ``grpo`` with ``norm_std=False`` (verl ``norm_adv_by_std_in_grpo=False``); singleton → R.
    """
    return grpo(r, inv, n_groups, norm_std=False)


@register_advantage("rloo", group_baseline=True)
def rloo(r: Tensor, inv: Tensor, n_groups: int) -> Tensor:
    """RLOO leave-one-out baseline (Ahmadian et al. 2024, arXiv 2402.14740; verl ``rloo``).

    A_i = R_i − (Σ_{j∈g} R_j − R_i) / (n − 1)  = n/(n−1) · (R_i − mean_g(R));   n = 1: A_i = R_i
    """
    count, mean, _ = group_stats(r, inv, n_groups)
    n = count[inv]
    baseline = (mean[inv] * n - r) / (n - 1).clamp(min=1)
    return torch.where(n < 2, r, r - baseline)


def _token_whiten(x: Tensor, token_counts: Tensor | None, eps: float) -> Tensor:
    """verl ``masked_whiten`` of a per-sequence value broadcast over each sequence's tokens: mean and
    unbiased variance over TOKENS (a sequence of n tokens counts n times; Bessel's correction uses the
    token count), ``(x − mean) · rsqrt(var + ε)``. ``token_counts=None``: every sequence counts once.
    Fewer than two tokens (or sequences) in all: 0."""
    w = torch.ones_like(x) if token_counts is None else torch.as_tensor(token_counts).to(x)
    if w.shape != x.shape:
        raise InvalidValueError(f"token_counts must have shape {tuple(x.shape)}, got {tuple(w.shape)}")
    if bool((w < 0).any()):
        raise InvalidValueError("token_counts must be >= 0")
    n = w.sum()
    if float(n) < 2:
        return torch.zeros_like(x)
    mean = (w * x).sum() / n
    centred = x - mean
    var = (w * centred.square()).sum() / (n - 1)
    return centred * torch.rsqrt(var + eps)


@register_advantage("reinforce_pp", aliases=("reinforce_plus_plus_baseline",), validate=_validate_eps)
def reinforce_pp(
    r: Tensor, inv: Tensor, n_groups: int, *, eps: float = 1e-8, token_counts: Tensor | None = None
) -> Tensor:
    """REINFORCE++ with group baseline (Hu 2025, arXiv 2501.03262; verl
    ``core_algos.py::compute_reinforce_plus_plus_baseline_outcome_advantage``).

        x_i = R_i − mean_g(R)                 (singleton: mean 0, so x_i = R_i)
        A_i = (x_i − mean_tok(x)) / sqrt(var_tok(x) + ε)     ε = 1e-8

    mean and unbiased variance over the batch's TOKENS, as verl's ``masked_whiten`` (each sequence
    weighted by its ``token_counts``; Bessel's correction N_tok / (N_tok − 1)). The trainer passes the
    action-token counts; without them every sequence counts once (then the correction is B / (B − 1):
    at 8 sequences × 7 tokens that is 0.944× verl's advantage). Fewer than two tokens: A = 0.
    """
    count, mean, _ = group_stats(r, inv, n_groups)
    x = r - torch.where(count[inv] < 2, torch.zeros_like(r), mean[inv])
    if x.shape[0] == 0:
        return x
    return _token_whiten(x, token_counts, eps)


@register_advantage("reinforce_plus_plus", validate=_validate_eps)
def reinforce_plus_plus(
    r: Tensor, inv: Tensor, n_groups: int, *, eps: float = 1e-8, token_counts: Tensor | None = None
) -> Tensor:
    """REINFORCE++ without baseline (Hu 2025, arXiv 2501.03262; verl
    ``core_algos.py::compute_reinforce_plus_plus_outcome_advantage``) for outcome rewards with γ = 1:
    the return of every token is R_i, whitened over the batch's tokens (verl ``masked_whiten``):
    ``A_i = (R_i − mean_tok(R)) / sqrt(var_tok(R) + ε)``. No group baseline (groups are ignored).
    verl's γ < 1 (per-token discounted returns) is not offered: posttrain's outcome advantages are one
    value per sequence.
    """
    if r.shape[0] == 0:
        return r
    return _token_whiten(r, token_counts, eps)
