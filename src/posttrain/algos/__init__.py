"""`posttrain.algos` — the tensor math of a GRPO-style trainer: losses, aggregation, advantages, KL.

Pure functions, tensors in and tensors out; no I/O, no models, no state beyond the registries.
Formulas and references in ``docs/objectives.md`` and ``docs/advantages.md``.

Policy losses (`policy_losses.py`), ``get_policy_loss(name)(logp, old_logp, advantages, mask, *,
agg=None, is_weights=None, global_tokens=None, global_seqs=None, scale=None, **params) -> (loss,
metrics)``. With r = exp(clamp(logp − old_logp, ±20)) and ∂ℓ_t/∂logp_t = −A_t·g_t:

    ppo/grpo/vanilla  g = r inside [1−ε_low, 1+ε_high]; 0 where clipped or dual-clipped (A<0 ∧ r>c)   PPO arXiv 1707.06347
    dapo              ppo with ε_high = 0.28                                                          DAPO arXiv 2503.14476
    gspo              g = s_i = exp(mean_t log r) per sequence; 0 if the sequence is clipped           GSPO arXiv 2507.18071
    cispo             g = clamp(r, 1−ε_low, 1+ε_high)                                                 MiniMax-M1 arXiv 2506.13585
    sapo              g = 4·r·σ(τ(r−1))(1−σ(τ(r−1)))                                                  SAPO arXiv 2511.20347
    dgpo              g = r·(r/(1−ε_low))^n (A<0, r<1−ε_low); (1+ε_high)^{1/m} r^{1−1/m} (A>0, r>1+ε_high)   arXiv 2603.14389
    maspo             g = w·r, w = exp(−(sg(r)−1)²/2σ²) in the favoured direction, σ mass-adaptive     arXiv 2602.17550

Aggregation (`aggregation.py`): ``agg_loss(values, mask, mode, *, scale, global_tokens, global_seqs)``
with token-mean, token-sum, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm (verl
``agg_loss``).

Advantages (`advantages.py`): ``get_advantage(name)(rewards, group_ids, **params) -> (B,)`` for grpo
(arXiv 2402.03300), dr_grpo (arXiv 2503.20783), rloo (arXiv 2402.14740), reinforce_pp (arXiv
2501.03262), reinforce_plus_plus; method estimators (DuCA/HIAN) register into the same registry from
the lab by entry point.

Preference losses (`preference.py`): ``get_preference_loss(name)(PreferenceInputs(...), *,
global_pairs=None, global_tokens=None, **params) -> (loss, metrics)`` for dpo (sigmoid, cDPO label
smoothing; arXiv 2305.18290), ipo (arXiv 2310.12036), simpo (arXiv 2405.14734), orpo (arXiv
2403.07691) and kto (arXiv 2402.01306), on sequence-level log-probs.

KL (`kl.py`): ``kl_penalty(logp, ref_logp, kind)`` for k1/kl, abs, k2/mse, k3/low_var_kl and the
straight-through ``<kind>+`` (verl ``kl_penalty``).

Both registries accept plug-ins by import path (``objective.name: my_lab.losses:my_loss``): the
module is imported and ``my_loss`` must be a function registered with :func:`register_policy_loss`
(or the :class:`PolicyLoss` it created); likewise :func:`register_advantage` for advantages.
"""

from typing import Any

from posttrain.algos._common import check_param_names, masked_mean
from posttrain.algos.advantages import (
    ADVANTAGES,
    AdvantageEstimator,
    advantage_defaults,
    constant_groups,
    get_advantage,
    group_stats,
    list_advantages,
    register_advantage,
)
from posttrain.algos.aggregation import AGG_MODES, agg_loss, list_agg_modes
from posttrain.algos.kl import KL_ESTIMATORS, kl_clamped, kl_penalty, list_kl_estimators
from posttrain.algos.policy_losses import (
    LOG_RATIO_CLAMP,
    POLICY_LOSSES,
    Batch,
    PolicyLoss,
    Terms,
    get_policy_loss,
    list_policy_losses,
    policy_loss_default_agg,
    policy_loss_defaults,
    register_policy_loss,
)
from posttrain.algos.preference import (
    PREFERENCE_LOSSES,
    PreferenceInputs,
    PreferenceLoss,
    Sides,
    get_preference_loss,
    list_preference_losses,
    preference_loss_defaults,
    register_preference_loss,
)
from posttrain.utils.errors import InvalidValueError


def _registered(registry: Any, wrapper: type, attr: str):
    """Plug-in adapter: the wrapper object itself, or the wrapper whose ``attr`` is the imported
    function (the decorators return the bare function, so ``module:fn`` names a registered one)."""

    def adapt(obj: Any) -> Any:
        if isinstance(obj, wrapper):
            return obj
        for entry in registry.entries():
            if getattr(entry, attr, None) is obj:
                return entry
        return None

    return adapt


POLICY_LOSSES.accept(
    _registered(POLICY_LOSSES, PolicyLoss, "core"),
    "a loss function decorated with @register_policy_loss (or its PolicyLoss)",
)
PREFERENCE_LOSSES.accept(
    _registered(PREFERENCE_LOSSES, PreferenceLoss, "core"),
    "a loss function decorated with @register_preference_loss (or its PreferenceLoss)",
)
ADVANTAGES.accept(
    _registered(ADVANTAGES, AdvantageEstimator, "fn"),
    "an estimator function decorated with @register_advantage (or its AdvantageEstimator)",
)


def check_advantage_params(name: str, params: dict[str, Any]) -> None:
    """Config-time check of ``advantage.params`` (names and values) for estimator ``name``; raises
    ValueError naming the bad key and the accepted ones."""
    est = get_advantage(name)
    try:
        check_param_names("advantage estimator", est.name, params, est.defaults)
    except TypeError as e:
        raise InvalidValueError(str(e)) from None
    est._validate(est.name, {**est.defaults, **params})


__all__ = [
    "ADVANTAGES",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "LOG_RATIO_CLAMP",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "AdvantageEstimator",
    "Batch",
    "PolicyLoss",
    "PreferenceInputs",
    "PreferenceLoss",
    "Sides",
    "Terms",
    "advantage_defaults",
    "agg_loss",
    "check_advantage_params",
    "constant_groups",
    "get_advantage",
    "get_policy_loss",
    "get_preference_loss",
    "group_stats",
    "kl_clamped",
    "kl_penalty",
    "list_advantages",
    "list_agg_modes",
    "list_kl_estimators",
    "list_policy_losses",
    "list_preference_losses",
    "masked_mean",
    "policy_loss_default_agg",
    "policy_loss_defaults",
    "preference_loss_defaults",
    "register_advantage",
    "register_policy_loss",
    "register_preference_loss",
]
