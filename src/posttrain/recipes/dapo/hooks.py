"""DAPO: dynamic sampling (group filtering) and the soft overlong penalty.

Source: DAPO, arXiv:2503.14476 (§3.3 dynamic sampling, Eq. 13 soft overlong punishment), and verl's
implementation (``verl/trainer/config/algorithm.py::FilterGroupsConfig``,
``verl/workers/reward_manager/dapo.py::DAPORewardManager``, ``docs/algo/dapo.md``). Clip-higher and
the token-mean loss are loss settings (``objective.params.clip_high``, ``objective.agg``), see
``recipes/dapo/dapo.yaml``. Formulas: ``docs/sampling-methods.md``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from posttrain.hooks.base import (
    GROUP_SHAPERS,
    SAMPLERS,
    GroupOutcome,
    GroupRewardShaper,
    PromptPlan,
    UniformSampler,
)


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


class DynamicSamplingWarning(RuntimeWarning):
    """DAPO dynamic sampling hit its round cap before collecting the requested groups."""


@SAMPLERS.register("dapo")
class DAPOSampler(UniformSampler):
    """DAPO dynamic sampling (arXiv:2503.14476, §3.3; verl ``filter_groups``, metric ``acc``/score).

    Each round draws ``ceil(remaining · oversample)`` prompts from the uniform sampler's shuffled
    epochs; groups whose rewards are all equal are dropped; rounds continue until the step holds
    ``rollout.prompts_per_step`` groups (extra kept groups beyond that are dropped, as verl truncates to
    ``train_batch_size``) or ``max_rounds`` rounds were drawn (verl ``max_num_gen_batches`` = 10). On
    hitting the cap the step trains on what it kept and a :class:`DynamicSamplingWarning` says so
    (a ``[proposed]`` choice: verl raises when unlimited is off). Rollouts spent are reported as
    ``sampler/rollouts_generated``.
    """

    filters_groups = True

    def __init__(
        self, examples: list[Any], *, seed: int = 0, max_rounds: int = 10, oversample: float = 1.0
    ) -> None:
        self.validate_params({"max_rounds": max_rounds, "oversample": oversample})
        super().__init__(examples, seed=seed)
        self.max_rounds = max_rounds
        self.oversample = oversample
        self._step = -1
        self._need = 0
        self._stats = {"rounds": 0.0, "rollouts_generated": 0.0, "groups_kept": 0.0, "cap_hit": 0.0}

    @staticmethod
    def validate_params(params: dict[str, Any]) -> None:
        r, o = params.get("max_rounds", 10), params.get("oversample", 1.0)
        if not (isinstance(r, int) and r >= 1):
            raise ValueError(f"max_rounds must be an integer >= 1, got {r!r}")
        if not (isinstance(o, int | float) and o >= 1):
            raise ValueError(f"oversample must be a number >= 1, got {o!r}")

    def plan(self, step: int, num_prompts: int, group_size: int) -> PromptPlan:
        if step != self._step:  # first round of a new step
            self._step = step
            self._requested = num_prompts
            self._stats = {"rounds": 0.0, "rollouts_generated": 0.0, "groups_kept": 0.0, "cap_hit": 0.0}
        self._need = num_prompts
        plan = super().plan(step, math.ceil(num_prompts * self.oversample), group_size)
        self._stats["rounds"] += 1
        self._stats["rollouts_generated"] += sum(plan.n_per_prompt)
        return plan

    def keep_groups(self, outcomes: list[GroupOutcome]) -> list[bool]:
        keep, n = [], 0
        for o in outcomes:
            k = not o.zero_variance and n < self._need
            n += k
            keep.append(k)
        self._stats["groups_kept"] += n
        if n < self._need and self._stats["rounds"] >= self.max_rounds:
            self._stats["cap_hit"] = 1.0
            warnings.warn(
                f"hooks.sampler 'dapo': after max_rounds={self.max_rounds} rounds only "
                f"{int(self._stats['groups_kept'])} of {self._requested} groups have non-constant rewards; "
                "training on those (raise max_rounds or oversample, or the task is too easy/hard)",
                DynamicSamplingWarning,
                stacklevel=2,
            )
        return keep

    def metrics(self) -> dict[str, float]:
        return dict(self._stats)
