"""posttrain's objectives inside verl: importing this module registers them in verl's registries.

verl (github.com/volcengine/verl) selects the policy loss by name,
``actor_rollout_ref.actor.policy_loss.loss_mode=<name>``, from ``POLICY_LOSS_REGISTRY`` in
``verl/trainer/ppo/core_algos.py``, and the advantage estimator by ``algorithm.adv_estimator=<name>``
from ``ADV_ESTIMATOR_REGISTRY``. On import this module registers:

* every posttrain policy loss as ``posttrain_<name>`` (``posttrain_dgpo``, ``posttrain_maspo``,
  ``posttrain_ppo``, ``posttrain_dapo``, ``posttrain_gspo``, ``posttrain_cispo``, ``posttrain_sapo``),
  and under its bare name when verl has none of that name (``dgpo``, ``maspo``, ``dapo``, ``ppo`` with
  verl 0.9; verl's own ``gspo``, ``sapo``, ``cispo``, ``vanilla`` are never replaced);
* ``duca_hian``: DuCA/HIAN dual-horizon advantages (arXiv 2603.01481; the fusion rule is posttrain's
  PROPOSED design, docs/advantages.md), with turns read from verl's ``response_mask`` (see
  :func:`hian_advantage_for_verl`).

How it gets imported in every verl process (driver and Ray workers): posttrain declares the entry
point ``verl.plugins: posttrain = posttrain.integrations.verl`` that ``import verl`` loads by itself
(``VERL_USE_EXTERNAL_PLUGINS``, default ``auto``); ``VERL_USE_EXTERNAL_MODULES=posttrain.integrations.verl``
does the same explicitly.

Parameters. The registered function reads verl's actor config for what verl already has a key for:
``clip_ratio_low`` / ``clip_ratio_high`` (``clip_ratio`` when unset) and ``clip_ratio_c`` for
ppo/dapo/dgpo, ``tau_pos`` / ``tau_neg`` for sapo; every other parameter keeps posttrain's default
(the authors'). Loss-specific parameters (``dgpo_n``, ``maspo_alpha``, HIAN's ``w_turn``...) come from
the JSON environment variable ``POSTTRAIN_VERL_PARAMS`` (``{"dgpo": {"dgpo_n": 2}, "duca_hian":
{"w_turn": 0.5}}``), read at import, or from :func:`register` called with ``params=``. The loss is
aggregated by verl's own ``agg_loss`` with verl's ``loss_agg_mode`` and ``global_batch_info``, so
data-parallel scaling is verl's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from posttrain.algos import get_policy_loss, hian_advantages, list_policy_losses
from posttrain.algos._common import check_param_names

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


def _core_algos() -> Any:
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
        raise ValueError(
            f"policy loss {loss.name!r} needs extra inputs {list(loss.inputs)} that verl's policy-loss "
            "signature does not pass; it cannot be registered in verl"
        )
    core_algos = _core_algos()

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
        value = core_algos.agg_loss(
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


# ------------------------------------------------------------------------------------- DuCA/HIAN
def turn_spans(response_mask: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Per row, the maximal runs of 1 in ``response_mask`` as ``(start, end)`` (end exclusive): the
    policy's turns of a multi-turn verl rollout (tool / user tokens between turns are 0)."""
    m = response_mask.bool().cpu()
    out = []
    for row in m:
        padded = torch.cat([torch.zeros(1, dtype=torch.bool), row, torch.zeros(1, dtype=torch.bool)])
        d = padded.int().diff()
        starts = (d == 1).nonzero().flatten().tolist()
        ends = (d == -1).nonzero().flatten().tolist()
        out.append(list(zip(starts, ends, strict=True)))
    return out


def hian_advantage_for_verl(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl advantage estimator ``duca_hian`` -> (advantages, returns), both (B, T).

    PROPOSED mapping of verl's inputs onto :func:`posttrain.algos.hian_advantages`: turn k of row i is
    the k-th run of 1 in ``response_mask``; its turn reward is the sum of ``token_level_rewards`` from
    the turn's first token up to the next turn's first token (a reward a tool-calling loop put on the
    turn's last token, or on the environment tokens after it); the session reward is the row's total;
    the group is verl's ``uid`` (``index``). Tokens outside every turn get advantage 0. Parameters ``w_turn``, ``w_sess``, ``turn_grouping``, ``eps``
    from ``POSTTRAIN_VERL_PARAMS["duca_hian"]``."""
    t = token_level_rewards.shape[1]
    keys = {k: i for i, k in enumerate(dict.fromkeys(list(index)))}
    groups = torch.tensor([keys[k] for k in list(index)], dtype=torch.long)
    spans = turn_spans(response_mask)
    rewards = token_level_rewards.detach().float().cpu()
    turn_rewards = []
    for i, sp in enumerate(spans):
        bounds = [s for s, _ in sp[1:]] + [t]
        turn_rewards.append(
            torch.stack([rewards[i, s:e].sum() for (s, _), e in zip(sp, bounds, strict=True)])
            if sp
            else torch.zeros(0)
        )
    params = dict(_params.get("duca_hian", {}))
    adv = hian_advantages(rewards.sum(dim=1), groups, turn_rewards, spans, t, **params)
    adv = adv.to(token_level_rewards.device, token_level_rewards.dtype) * response_mask
    return adv, adv


# ------------------------------------------------------------------------------------- register
def register(params: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, str]:
    """Register posttrain's losses and ``duca_hian`` in verl's registries (idempotent); ``params``
    (default: ``$POSTTRAIN_VERL_PARAMS``) sets loss-specific parameters per posttrain name. Returns
    ``{verl name: posttrain name}`` of what is registered."""
    core_algos = _core_algos()
    if params is None:
        raw = os.environ.get(ENV_PARAMS, "").strip()
        try:
            params = json.loads(raw) if raw else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"${ENV_PARAMS} is not valid JSON ({e}): {raw[:200]!r}") from None
    if not isinstance(params, Mapping) or not all(isinstance(v, Mapping) for v in params.values()):
        raise ValueError(
            f"{ENV_PARAMS} / params must map a loss name to a mapping of parameters, got {params!r}"
        )
    _params.clear()
    for name, p in params.items():
        if name != "duca_hian":
            loss = get_policy_loss(name)
            check_param_names("policy loss", loss.name, p, loss.defaults)
            name = loss.name
        _params[name] = dict(p)
    table = core_algos.POLICY_LOSS_REGISTRY
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
    adv = core_algos.ADV_ESTIMATOR_REGISTRY
    if adv.get("duca_hian") not in (None, hian_advantage_for_verl):
        raise ValueError("verl already has an advantage estimator named 'duca_hian' that is not posttrain's")
    adv["duca_hian"] = hian_advantage_for_verl
    added["duca_hian"] = "hian_advantages"
    registered.clear()
    registered.update(added)
    return added


register()
