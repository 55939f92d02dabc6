"""Group filters: keep or drop whole groups once their rewards are known.

* ``dynamic-sampling`` (alias ``dapo``): DAPO dynamic sampling (arXiv:2503.14476, §3.3; verl
  ``filter_groups``, metric ``acc``/score): groups whose rewards are all equal carry no gradient and
  are dropped; the loop samples further rounds of ``ceil(missing · oversample)`` prompts until the
  step holds ``rollout.prompts_per_step`` groups (kept groups beyond that are dropped, as verl
  truncates to ``train_batch_size``) or ``max_rounds`` rounds were drawn (verl
  ``max_num_gen_batches`` = 10). On hitting the cap the step trains on what it kept and a
  :class:`DynamicSamplingWarning` says so (a ``[proposed]`` choice: verl raises when unlimited is off).

Under asynchronous rollout (``rollout.max_staleness`` > 0, :mod:`posttrain.train.async_rollout`) the
filter decides on the groups a step consumes, at most the missing number at a time: a "round" is one
such batch of generated groups (``rounds``, ``max_rounds``), ``rollouts_generated`` counts their
completions, a dropped group is not generated again (the workers generate new prompts), and no group
is dropped as ``surplus`` (groups beyond the step's need stay queued for the next step).

It lives in the core because more than one method uses it: DAPO's dynamic sampling is this filter
(``hooks.filter: {name: dynamic-sampling}``, beside the ``dapo`` loss) and so is APARL's inner loop
(beside its curriculum sampler); any sampler combines with it through ``hooks.filter``, the one place
a group filter is chosen.
"""

from __future__ import annotations

import warnings
from typing import Any

from posttrain.hooks.base import GROUP_FILTERS, GroupDecision, GroupFilter, GroupOutcome, PromptPlan
from posttrain.utils.errors import InvalidValueError, PosttrainWarning


class DynamicSamplingWarning(PosttrainWarning, RuntimeWarning):
    """DAPO dynamic sampling hit its round cap before collecting the requested groups."""


@GROUP_FILTERS.register("dynamic-sampling", aliases=("dapo",))
class DynamicSamplingFilter(GroupFilter):
    """Drops zero-variance groups (all rewards equal) and surplus groups; ``max_rounds`` (>= 1) caps
    the rounds of a step, ``oversample`` (>= 1) scales the prompts a round asks for. Logs
    ``rounds``, ``rollouts_generated``, ``groups_kept``, ``cap_hit``, ``dropped_zero_variance`` and
    ``dropped_surplus``. ``label`` names the hook in the cap warning."""

    def __init__(self, *, max_rounds: int = 10, oversample: float = 1.0, label: str = "") -> None:
        self.validate_params({"max_rounds": max_rounds, "oversample": oversample})
        self.max_rounds = max_rounds
        self.oversample = oversample
        self.label = label or "hooks.filter 'dynamic-sampling'"
        self._requested = 0
        self._stats = self._fresh()

    @staticmethod
    def _fresh() -> dict[str, float]:
        return {
            "rounds": 0.0,
            "rollouts_generated": 0.0,
            "groups_kept": 0.0,
            "cap_hit": 0.0,
            "dropped_zero_variance": 0.0,
            "dropped_surplus": 0.0,
        }

    @staticmethod
    def validate_params(params: dict[str, Any]) -> None:
        r, o = params.get("max_rounds", 10), params.get("oversample", 1.0)
        if not (isinstance(r, int) and not isinstance(r, bool) and r >= 1):
            raise InvalidValueError(f"max_rounds must be an integer >= 1, got {r!r}")
        if not (isinstance(o, int | float) and not isinstance(o, bool) and o >= 1):
            raise InvalidValueError(f"oversample must be a number >= 1, got {o!r}")

    def start_step(self, step: int, requested: int) -> None:
        self._requested = requested
        self._stats = self._fresh()

    def start_round(self, plan: PromptPlan) -> None:
        self._stats["rounds"] += 1
        self._stats["rollouts_generated"] += sum(plan.n_per_prompt)

    def decide(self, outcomes: list[GroupOutcome], need: int) -> list[GroupDecision]:
        out, n = [], 0
        for o in outcomes:
            if o.zero_variance:
                out.append(GroupDecision(False, "zero_variance"))
            elif n >= need:
                out.append(GroupDecision(False, "surplus"))
            else:
                n += 1
                out.append(GroupDecision(True))
        for d in out:
            if not d.keep:
                self._stats[f"dropped_{d.reason}"] += 1
        self._stats["groups_kept"] += n
        if n < need and self._stats["rounds"] >= self.max_rounds:
            self._stats["cap_hit"] = 1.0
            warnings.warn(
                f"{self.label}: after max_rounds={self.max_rounds} rounds only "
                f"{int(self._stats['groups_kept'])} of {self._requested} groups have non-constant rewards; "
                "training on those (raise max_rounds or oversample, or the task is too easy/hard)",
                DynamicSamplingWarning,
                stacklevel=3,
            )
        return out

    def metrics(self) -> dict[str, float]:
        return dict(self._stats)
