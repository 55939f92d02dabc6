"""DAPO: the soft overlong penalty (a group reward shaper).

Source: DAPO, arXiv:2503.14476 (Eq. 13 soft overlong punishment), and verl's implementation
(``verl/workers/reward_manager/dapo.py::DAPORewardManager``, ``docs/algo/dapo.md``). DAPO's other
parts are settings of the library: dynamic sampling (§3.3) is the group filter
``hooks.filter: {name: dynamic-sampling}`` (:class:`posttrain.hooks.DynamicSamplingFilter`, verl's
``FilterGroupsConfig``), clip-higher and the token-mean loss are the ``dapo`` loss
(``objective.params.clip_high``, ``objective.agg``); ``dapo.yaml`` beside this file puts them
together. Formulas: ``docs/sampling-methods.md``.
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.hooks.base import GROUP_SHAPERS, GroupRewardShaper
from posttrain.utils.errors import InvalidValueError

__all__ = ["DAPOOverlongShaper", "dapo_overlong_penalty", "validate_overlong"]


def dapo_overlong_penalty(length: int, *, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """Soft overlong punishment (arXiv:2503.14476, Eq. 13; verl ``overlong_buffer``):
    ``min(−(L − (max_length − buffer)) / buffer · factor, 0)`` — 0 up to ``max_length − buffer``,
    then linear down to ``−factor`` at ``max_length``."""
    validate_overlong(max_length=max_length, buffer=buffer, factor=factor)
    exceed = length - (max_length - buffer)
    return min(-exceed / buffer * factor, 0.0)


def validate_overlong(*, max_length: Any, buffer: Any, factor: Any) -> None:
    if max_length is not None and not (isinstance(max_length, int) and max_length >= 1):
        raise InvalidValueError(f"max_length must be an integer >= 1, got {max_length!r}")
    if not (isinstance(buffer, int) and buffer >= 1):
        raise InvalidValueError(f"buffer must be an integer >= 1, got {buffer!r}")
    if max_length is not None and buffer > max_length:
        raise InvalidValueError(f"buffer ({buffer}) must not exceed max_length ({max_length})")
    if not (isinstance(factor, int | float) and factor >= 0):
        raise InvalidValueError(f"factor must be a number >= 0, got {factor!r}")


@GROUP_SHAPERS.register("dapo-overlong")
class DAPOOverlongShaper(GroupRewardShaper):
    """Adds :func:`dapo_overlong_penalty` to every reward. ``max_length`` is the hard generation limit
    (it must equal ``rollout.max_new_tokens``, checked when the config loads: :meth:`validate_config`);
    verl's values are 20480 with a 4096 buffer, factor 1."""

    def __init__(self, *, max_length: int, buffer: int = 4096, factor: float = 1.0) -> None:
        self.validate_params({"max_length": max_length, "buffer": buffer, "factor": factor})
        self.max_length, self.buffer, self.factor = max_length, buffer, factor

    @staticmethod
    def validate_params(params: dict[str, Any]) -> None:
        validate_overlong(
            max_length=params.get("max_length"),
            buffer=params.get("buffer", 4096),
            factor=params.get("factor", 1.0),
        )

    @classmethod
    def validate_config(cls, params: dict[str, Any], config: Any) -> None:
        """The penalty ramps down to ``max_length``, the hard generation limit (arXiv:2503.14476,
        Eq. 13): any value but ``rollout.max_new_tokens`` shifts or truncates the ramp."""
        limit, got = config.rollout.max_new_tokens, params.get("max_length")
        if got != limit:
            raise InvalidValueError(
                f"max_length: the dapo-overlong penalty needs max_length == rollout.max_new_tokens ({limit}), "
                f"got {got!r}"
            )

    def shape(self, rewards, group_ids, *, correct, lengths, truncated):
        pen = [
            dapo_overlong_penalty(int(n), max_length=self.max_length, buffer=self.buffer, factor=self.factor)
            for n in lengths.tolist()
        ]
        return rewards + torch.tensor(pen, dtype=rewards.dtype)
