"""posttrain's objectives inside verl: importing this module registers them in verl's registries.

verl (github.com/volcengine/verl) selects the policy loss by name,
``actor_rollout_ref.actor.policy_loss.loss_mode=<name>``, from ``POLICY_LOSS_REGISTRY`` in
``verl/trainer/ppo/core_algos.py``, and the advantage estimator by ``algorithm.adv_estimator=<name>``
from ``ADV_ESTIMATOR_REGISTRY``. On import this module registers:

* every posttrain policy loss as ``posttrain_<name>`` (``posttrain_dgpo``, ``posttrain_maspo``,
  ``posttrain_ppo``, ``posttrain_dapo``, ``posttrain_gspo``, ``posttrain_cispo``, ``posttrain_sapo``),
  and under its bare name when verl has none of that name (``dgpo``, ``maspo``, ``dapo``, ``ppo`` with
  verl 0.9; verl's own ``gspo``, ``sapo``, ``cispo``, ``vanilla`` are never replaced);
* method plug-ins add their own names through the same entry point group (the lab's DuCA recipe
  registers the ``duca_hian`` advantage estimator); they read their parameters with :func:`plugin_params`.

How it gets imported in every verl process (driver and Ray workers): posttrain declares the entry
point ``verl.plugins: posttrain = posttrain.integrations.verl`` that ``import verl`` loads by itself
(``VERL_USE_EXTERNAL_PLUGINS``, default ``auto``); ``VERL_USE_EXTERNAL_MODULES=posttrain.integrations.verl``
does the same explicitly.

Parameters. The registered function reads verl's actor config for what verl already has a key for:
``clip_ratio_low`` / ``clip_ratio_high`` (``clip_ratio`` when unset) and ``clip_ratio_c`` for
ppo/dapo/dgpo, ``tau_pos`` / ``tau_neg`` for sapo; every other parameter keeps posttrain's default
(the authors'). Loss-specific parameters (``dgpo_n``, ``maspo_alpha``, a plug-in's ``w_turn``...) come
from the JSON environment variable ``POSTTRAIN_VERL_PARAMS`` (``{"dgpo": {"dgpo_n": 2}, "duca_hian":
{"w_turn": 0.5}}``), read at import, or from :func:`register` called with ``params=``; a key that is not
a posttrain policy loss is kept for the plug-in of that name (:func:`plugin_params`). The loss is
aggregated by verl's own ``agg_loss`` with verl's ``loss_agg_mode`` and ``global_batch_info``, so
data-parallel scaling is verl's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from posttrain.algos import POLICY_LOSSES, get_policy_loss, list_policy_losses
from posttrain.algos._common import check_param_names
from posttrain.utils.errors import InvalidValueError

ENV_PARAMS = "POSTTRAIN_VERL_PARAMS"
PREFIX = "posttrain_"
#: verl actor-config keys read per posttrain loss (posttrain param -> verl key(s), first set wins)
CONFIG_KEYS: dict[str, dict[str, tuple[str, ...]]] = {
    "ppo": {
        "clip_low": ("clip_ratio_low", "clip_ratio"),
        "clip_high": ("clip_ratio_high", "clip_ratio"),
        "clip_c": ("clip_ratio_c",),
    },
    "dapo": {
        "clip_low": ("clip_ratio_low", "clip_ratio"),
        "clip_high": ("clip_ratio_high", "clip_ratio"),
        "clip_c": ("clip_ratio_c",),
    },
    "dgpo": {"clip_low": ("clip_ratio_low", "clip_ratio"), "clip_high": ("clip_ratio_high", "clip_ratio")},
    "sapo": {"tau_pos": ("tau_pos",), "tau_neg": ("tau_neg",)},
}

_params: dict[str, dict[str, Any]] = {}
registered: dict[str, str] = {}  # verl name -> posttrain name (what the last register() added)


def plugin_params(name: str) -> dict[str, Any]:
    """The parameters ``POSTTRAIN_VERL_PARAMS`` (or :func:`register`'s ``params``) gives plug-in ``name``."""
    return dict(_params.get(name, {}))


def core_algos() -> Any:
    """verl's ``core_algos`` module (its registries), or an ImportError naming the extra."""
    try:
        from verl.trainer.ppo import core_algos
    except ImportError as e:
        raise ImportError(
            f'posttrain.integrations.verl needs verl ({e}); install the verl extra: pip install -e ".[verl]"'
        ) from e
    return core_algos


def _config_get(config: Any, key: str) -> Any:
    if config is None:
        return None
    getter = getattr(config, "get", None)
    if callable(getter):
        return getter(key, None)
    return getattr(config, key, None)


def loss_params(name: str, config: Any = None) -> dict[str, Any]:
    """The parameters the verl-registered loss ``name`` runs with: posttrain's defaults, then verl's
    actor-config keys of :data:`CONFIG_KEYS`, then the user's (``POSTTRAIN_VERL_PARAMS`` / ``register``)."""
    loss = get_policy_loss(name)
    p = dict(loss.defaults)
    for param, keys in CONFIG_KEYS.get(loss.name, {}).items():
        for k in keys:
            v = _config_get(config, k)
            if v is not None:
                p[param] = float(v)
                break
    user = _params.get(loss.name, {})
    check_param_names("policy loss", loss.name, user, loss.defaults)
    p.update(user)
    loss._validate(loss.name, p)
    return p


def verl_policy_loss(name: str) -> Callable[..., tuple[torch.Tensor, dict[str, Any]]]:
    """posttrain loss ``name`` with verl's ``PolicyLossFn`` signature::

        fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
           rollout_is_weights=None) -> (loss, {"actor/pg_clipfrac", "actor/ppo_kl", ...: float})

    The per-token loss is posttrain's (authors' forms, padding neutralised, ``rollout_is_weights``
    multiplied in); the scalar is verl's ``agg_loss(..., **config.global_batch_info)``."""
    from posttrain.algos.policy_losses import _prepare

    loss = get_policy_loss(name)
    if loss.inputs:
        raise InvalidValueError(
            f"policy loss {loss.name!r} needs extra inputs {list(loss.inputs)} that verl's policy-loss "
            "signature does not pass; it cannot be registered in verl"
        )
    algos = core_algos()

    def fn(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        p = loss_params(loss.name, config)
        batch, isw = _prepare(log_prob, old_log_prob, advantages, response_mask, rollout_is_weights, {})
        t = loss.core(batch, **p)
        zero = torch.zeros((), dtype=batch.logp.dtype, device=batch.logp.device)
        per_token = torch.where(batch.valid, t.loss if isw is None else t.loss * isw, zero)
        info = dict(_config_get(config, "global_batch_info") or {})
        value = algos.agg_loss(
            loss_mat=per_token, loss_mask=batch.valid.to(per_token.dtype), loss_agg_mode=loss_agg_mode, **info
        )
        v = batch.valid
        n = v.sum().clamp(min=1)

        def mean(x: torch.Tensor) -> float:
            return float((x.detach().to(zero.dtype) * v).sum() / n)

        metrics = {
            "actor/pg_clipfrac": mean(t.clip_low | t.clip_high),
            "actor/pg_clipfrac_lower": mean(t.clip_low),
            "actor/ppo_kl": mean(-batch.log_ratio),
            f"actor/{PREFIX}ratio_mean": mean(t.ratio),
            f"actor/{PREFIX}weight_mean": mean(t.weight),
        }
        for k, x in t.extra.items():
            metrics[f"actor/{PREFIX}{k}"] = mean(x)
        return value, metrics

    fn.__name__ = f"{PREFIX}{loss.name}"
    fn.__doc__ = f"posttrain policy loss {loss.name!r} (verl signature).\n\n{loss.__doc__ or ''}"
    return fn


# ------------------------------------------------------------------------------------- register
def register(params: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, str]:
    """Register posttrain's losses in verl's registries (idempotent); ``params``
    (default: ``$POSTTRAIN_VERL_PARAMS``) sets loss-specific parameters per posttrain name. Returns
    ``{verl name: posttrain name}`` of what is registered."""
    algos = core_algos()
    if params is None:
        raw = os.environ.get(ENV_PARAMS, "").strip()
        try:
            params = json.loads(raw) if raw else {}
        except json.JSONDecodeError as e:
            raise InvalidValueError(f"${ENV_PARAMS} is not valid JSON ({e}): {raw[:200]!r}") from None
    if not isinstance(params, Mapping) or not all(isinstance(v, Mapping) for v in params.values()):
        raise InvalidValueError(
            f"{ENV_PARAMS} / params must map a loss name to a mapping of parameters, got {params!r}"
        )
    _params.clear()
    for name, p in params.items():
        if name in POLICY_LOSSES:  # other keys belong to plug-ins (plugin_params)
            loss = get_policy_loss(name)
            check_param_names("policy loss", loss.name, p, loss.defaults)
            name = loss.name
        _params[name] = dict(p)
    table = algos.POLICY_LOSS_REGISTRY
    added: dict[str, str] = {}
    for name in list_policy_losses():
        if get_policy_loss(name).inputs:
            continue
        fn = verl_policy_loss(name)
        for verl_name in (f"{PREFIX}{name}", name):
            current = table.get(verl_name)
            if current is None or getattr(current, "__module__", None) == __name__:  # never replace verl's
                table[verl_name] = fn
                added[verl_name] = name
    registered.clear()
    registered.update(added)
    return added


register()
