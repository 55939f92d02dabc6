"""DuCA/HIAN in verl: the ``duca_hian`` advantage estimator (arXiv 2603.01481; the fusion rule is
posttrain's PROPOSED design). The lab declares this module as a ``verl.plugins`` entry point, so
``import verl`` registers it in every verl process; parameters (``w_turn``, ``w_sess``,
``turn_grouping``, ``eps``) come from ``POSTTRAIN_VERL_PARAMS["duca_hian"]``
(:func:`posttrain.integrations.verl.plugin_params`).
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.integrations import verl as integ
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.recipes.duca.advantages import hian_advantages


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

    PROPOSED mapping of verl's inputs onto :func:`posttrain_lab.recipes.duca.advantages.hian_advantages`: turn k of row i is
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
    params = integ.plugin_params("duca_hian")
    adv = hian_advantages(rewards.sum(dim=1), groups, turn_rewards, spans, t, **params)
    adv = adv.to(token_level_rewards.device, token_level_rewards.dtype) * response_mask
    return adv, adv


def register() -> None:
    """Add ``duca_hian`` to verl's advantage registry (idempotent); never replaces another estimator."""
    adv = integ.core_algos().ADV_ESTIMATOR_REGISTRY
    if adv.get("duca_hian") not in (None, hian_advantage_for_verl):
        raise InvalidValueError(
            "verl already has an advantage estimator named 'duca_hian' that is not posttrain's"
        )
    adv["duca_hian"] = hian_advantage_for_verl


register()
