"""DAPO: dynamic sampling (group filtering) and the soft overlong penalty.

Source: DAPO, arXiv:2503.14476 (§3.3 dynamic sampling, Eq. 13 soft overlong punishment), and verl's
implementation (``verl/trainer/config/algorithm.py::FilterGroupsConfig``,
``verl/workers/reward_manager/dapo.py::DAPORewardManager``, ``docs/algo/dapo.md``). Clip-higher and
the token-mean loss are loss settings (``objective.params.clip_high``, ``objective.agg``), see
``recipes/dapo/dapo.yaml``. Formulas: ``docs/sampling-methods.md``.
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.hooks.base import GROUP_SHAPERS, SAMPLERS, GroupFilter, GroupRewardShaper, UniformSampler
from posttrain.hooks.filters import DynamicSamplingFilter, DynamicSamplingWarning

__all__ = [
    "DAPOOverlongShaper",
    "DAPOSampler",
    "DynamicSamplingWarning",
    "dapo_overlong_penalty",
    "validate_overlong",
]


def dapo_overlong_penalty(length: int, *, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """Soft overlong punishment (arXiv:2503.14476, Eq. 13; verl ``overlong_buffer``):
    ``min(−(L − (max_length − buffer)) / buffer · factor, 0)`` — 0 up to ``max_length − buffer``,
    then linear down to ``−factor`` at ``max_length``."""
    validate_overlong(max_length=max_length, buffer=buffer, factor=factor)
    exceed = length - (max_length - buffer)
    return min(-exceed / buffer * factor, 0.0)


def validate_overlong(*, max_length: Any, buffer: Any, factor: Any) -> None:
    if max_length is not None and not (isinstance(max_length, int) and max_length >= 1):
        raise ValueError(f"max_length must be an integer >= 1, got {max_length!r}")
    if not (isinstance(buffer, int) and buffer >= 1):
        raise ValueError(f"buffer must be an integer >= 1, got {buffer!r}")
    if max_length is not None and buffer > max_length:
        raise ValueError(f"buffer ({buffer}) must not exceed max_length ({max_length})")
    if not (isinstance(factor, int | float) and factor >= 0):
        raise ValueError(f"factor must be a number >= 0, got {factor!r}")


@GROUP_SHAPERS.register("dapo-overlong")
class DAPOOverlongShaper(GroupRewardShaper):
    """Adds :func:`dapo_overlong_penalty` to every reward. ``max_length`` is the hard generation limit
    (set it to ``rollout.max_new_tokens``); verl's values are 20480 with a 4096 buffer, factor 1."""

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

    def shape(self, rewards, group_ids, *, correct, lengths, truncated):
        pen = [
            dapo_overlong_penalty(int(n), max_length=self.max_length, buffer=self.buffer, factor=self.factor)
            for n in lengths.tolist()
        ]
        return rewards + torch.tensor(pen, dtype=rewards.dtype)


@SAMPLERS.register("dapo")
class DAPOSampler(UniformSampler):
    """DAPO dynamic sampling as one sampler (``hooks.sampler: dapo``): the uniform sampler's shuffled
    epochs plus the :class:`~posttrain.hooks.filters.DynamicSamplingFilter` (``max_rounds``,
    ``oversample``), which drops groups whose rewards are all equal and asks for more rounds. The same
    as ``hooks.sampler: uniform`` + ``hooks.filter: dynamic-sampling``; its numbers are logged as
    ``sampler/rounds``, ``sampler/rollouts_generated``, ``sampler/groups_kept``, ``sampler/cap_hit``.
    """

    def __init__(
        self, examples: list[Any], *, seed: int = 0, max_rounds: int = 10, oversample: float = 1.0
    ) -> None:
        self.validate_params({"max_rounds": max_rounds, "oversample": oversample})
        super().__init__(examples, seed=seed)
        self._filter = DynamicSamplingFilter(
            max_rounds=max_rounds, oversample=oversample, label="hooks.sampler 'dapo'"
        )
        self.max_rounds, self.oversample = max_rounds, oversample

    validate_params = staticmethod(DynamicSamplingFilter.validate_params)

    def group_filter(self) -> GroupFilter:
        return self._filter

    def metrics(self) -> dict[str, float]:
        return self._filter.metrics()
