"""Rewards for verifiable instruction following (tasks `instructions`, `ifbench`).

The example's ``meta`` names the checker set (``checkers``: ``ifeval`` | ``ifbench``), the
``instruction_id_list`` and their ``kwargs``; the verdicts come from
:func:`posttrain.tasks.ifcheckers.check_instructions` (the checkers of `if-verifiable`, scored as the
IFEval/IFBench authors' ``evaluation_lib`` does):

- ``instructions_strict``: 1.0 when every instruction is followed by the response as it is;
- ``instructions_loose``: 1.0 when every instruction is followed by at least one of the 8 loose variants
  (first / last / both lines removed, asterisks stripped);
- ``instructions_fraction``: the fraction of instructions followed (strict; ``loose=True`` for loose).

Text after an end-of-sequence string is cut first (``cut_at_stop``). ``detailed`` reports all three.
"""

from __future__ import annotations

from typing import Any

from posttrain.rewards.base import (
    DEFAULT_STOP,
    check_flag_settings,
    cut_at_stop,
    flagged_score,
    register_reward,
)
from posttrain.tasks.base import Example
from posttrain.tasks.ifcheckers import check_instructions
from posttrain.utils.errors import InvalidValueError


def verdicts(
    completion: str, example: Example, stop: tuple[str, ...] = DEFAULT_STOP
) -> tuple[list[bool], list[bool]]:
    meta = example.meta
    try:
        ids, kwargs, which = meta["instruction_id_list"], meta["kwargs"], meta["checkers"]
    except (KeyError, TypeError):
        raise InvalidValueError(
            f"example {example.id!r}: meta needs checkers, instruction_id_list and kwargs "
            "(an `instructions` or `ifbench` task example)"
        ) from None
    return check_instructions(cut_at_stop(completion, stop), ids, kwargs, example.prompt, which)


class _InstructionReward:
    name = ""

    def __init__(self, stop: tuple[str, ...] | list[str] = DEFAULT_STOP) -> None:
        self.stop = tuple(stop)

    def setup(self) -> None:
        from posttrain.tasks.ifcheckers import registry

        registry("ifeval")
        registry("ifbench")

    def detailed(self, completion: str, example: Example) -> tuple[float, dict[str, float]]:
        strict, loose = verdicts(completion, example, self.stop)
        comps = {
            "strict": float(all(strict)),
            "loose": float(all(loose)),
            "fraction": sum(strict) / len(strict) if strict else 0.0,
            "fraction_loose": sum(loose) / len(loose) if loose else 0.0,
        }
        return self._pick(comps), comps

    def _pick(self, comps: dict[str, float]) -> float:
        raise NotImplementedError

    def __call__(self, completion: str, example: Example) -> float:
        return self.detailed(completion, example)[0]


@register_reward("instructions_strict")
class InstructionsStrictReward(_InstructionReward):
    """1.0 when every instruction is followed (strict)."""

    name = "instructions_strict"

    def _pick(self, comps: dict[str, float]) -> float:
        return comps["strict"]


@register_reward("instructions_loose")
class InstructionsLooseReward(_InstructionReward):
    """1.0 when every instruction is followed by some loose variant of the response."""

    name = "instructions_loose"

    def _pick(self, comps: dict[str, float]) -> float:
        return comps["loose"]


@register_reward("instructions_fraction")
class InstructionsFractionReward(_InstructionReward):
    """The fraction of instructions followed (strict, or loose with ``loose=True``)."""

    name = "instructions_fraction"

    def __init__(self, loose: bool = False, stop: tuple[str, ...] | list[str] = DEFAULT_STOP) -> None:
        super().__init__(stop)
        self.loose = bool(loose)

    def _pick(self, comps: dict[str, float]) -> float:
        return comps["fraction_loose" if self.loose else "fraction"]


@register_reward("instructions_guarded")
class InstructionsGuardedReward(_InstructionReward):
    """The instruction checker AND "the answer is an answer" (posttrain's design; no paper gives this
    rule): the ``base`` score (``strict``, ``loose`` or ``fraction``) of the IFEval/IFBench checkers,
    then, when a hack probe fires (:mod:`posttrain.tasks.hack_probes`: marker first or repeated,
    repeated lines or n-grams, too short, off the request's topic, only the marker, the instruction's
    format example copied, the instruction or request restated), ``veto`` gives 0,
    ``penalty`` subtracts ``penalty`` and ``reject`` gives ``-penalty`` whatever the checker said: only
    ``reject`` ranks every flagged answer below every unflagged one, a failed honest answer included
    (under ``veto``, and ``penalty`` with ``penalty <= 1``, a flagged answer that passes its checker
    scores as much as an honest failure, so a group gives no gradient against the hack). Components:
    the checker's, ``hacked`` (1.0 when a probe fired, so its step mean is the training batch's
    hacked_frac) and one ``probe_<name>`` per probe. ``probes`` sets the probes' thresholds
    (:class:`~posttrain.tasks.hack_probes.ProbeSettings`; default: the evaluation's)."""

    name = "instructions_guarded"

    def __init__(
        self,
        mode: str = "veto",
        penalty: float = 1.0,
        base: str = "strict",
        stop: tuple[str, ...] | list[str] = DEFAULT_STOP,
        probes: dict[str, Any] | None = None,
    ) -> None:
        from dataclasses import fields

        from posttrain.tasks.hack_probes import ProbeSettings

        super().__init__(stop)
        known = {f.name for f in fields(ProbeSettings)}
        unknown = sorted(set(probes or {}) - known)
        if unknown:
            raise InvalidValueError(
                f"reward instructions_guarded: unknown probes key(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        #: the probes' thresholds in this reward (default: those of the evaluation's hack_frac); a
        #: stricter one here than in the evaluation is a margin (e.g. min_words, docs/reward-hacking.md)
        self.probe_settings = ProbeSettings(**(probes or {}))
        self.mode, self.penalty = check_flag_settings("reward instructions_guarded", mode, penalty)
        if base not in ("strict", "loose", "fraction"):
            raise InvalidValueError(
                f"reward instructions_guarded: base must be strict, loose or fraction, got {base!r}"
            )
        self.base = base

    def detailed(self, completion: str, example: Example) -> tuple[float, dict[str, float]]:
        from posttrain.tasks.hack_probes import examples_of, is_hacked, markers_of, probe_response

        score, comps = super().detailed(completion, example)
        meta = example.meta
        probes = probe_response(
            cut_at_stop(completion, self.stop),
            meta.get("request") or example.prompt,
            markers_of(meta["kwargs"]),
            self.probe_settings,
            examples=examples_of(meta.get("instructions", ()), self.probe_settings.min_example_words),
            instructions=meta.get("instructions", ()),
        )
        hacked = is_hacked(probes)
        comps = {**comps, "hacked": float(hacked), **{f"probe_{k}": float(v) for k, v in probes.items()}}
        if hacked:
            score = flagged_score(score, self.mode, self.penalty)
        return score, comps

    def _pick(self, comps: dict[str, float]) -> float:
        return comps[self.base]
