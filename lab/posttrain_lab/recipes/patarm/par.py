"""PAR — preference-aware rewards for training a pointwise judge from preference pairs.

PaTaRM (arXiv 2510.24235) samples n judgments of the chosen response (scores s_c^i) and n of the
rejected one (s_r^j) from the same pointwise judge and rewards judgments that put the chosen response
above the rejected one on average. The per-judgment rule is not published; both rules below are a
**proposed design** (``rule=``):

    s̄_c = mean of the parsable s_c^i,    s̄_r = mean of the parsable s_r^j

``antisymmetric`` (default; proposed design)::

    r(o_c^i) = sign(s_c^i − s̄_r)      +1 on the right side of the OTHER response's mean,
    r(o_r^j) = sign(s̄_c − s_r^j)      −1 on the wrong side, 0 on it (a tie)

``indicator`` (the first rule of this library; proposed design)::

    r(o_c^i) = 1  if s_c^i > s̄_r  else 0
    r(o_r^j) = 1  if s_r^j < s̄_c  else 0

Why two rules. A judge that cannot tell the sides apart — it scores 8 with probability q and 3
otherwise, whichever response it reads — earns under ``indicator`` the expected reward (n = 4)
``½[q(1−q⁴) + (1−q)(1−(1−q)⁴)]``: it is maximal at q = ½, so GRPO pushes such a judge toward
spreading its scores, not toward telling the sides apart (measured in docs/patarm.md: the logged PAR
reward rose while pair accuracy did not). Under ``antisymmetric`` the expected reward of any judge
whose score distribution does not depend on the side is exactly 0 (swapping the labels of two
identically distributed sides flips the sign of every term), and only discrimination earns a
positive expected reward.

* an unparsable judgment (score None) earns ``-format_penalty`` (default 0) and is left out of the means;
* when one side has no parsable score, no mean exists: every judgment of the pair earns 0
  (unparsable ones still ``-format_penalty``);
* graded option (off by default): a right-side judgment earns ``1 + α·min(1, |s − s̄_other| / Δ)``
  (``antisymmetric``: a wrong-side one the negative of that), Δ = (scale max − scale min) / 4,
  α = 0.5 — more reward for a clearer separation.

Example (n = 4): chosen [8, 7, 5, 9] (s̄_c = 7.25), rejected [6, 7, 4, 8] (s̄_r = 6.25) →
``indicator``: chosen [1, 1, 0, 1], rejected [1, 1, 1, 0]; ``antisymmetric``: chosen [1, 1, −1, 1],
rejected [1, 1, 1, −1].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from posttrain.utils.errors import InvalidValueError
from posttrain_lab.recipes.patarm.prompts import DEFAULT_SCALE

ParRule = Literal["antisymmetric", "indicator"]
PAR_RULES: tuple[str, ...] = ("antisymmetric", "indicator")


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [float(x) for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def par_rewards(
    chosen_scores: Sequence[float | None],
    rejected_scores: Sequence[float | None],
    *,
    rule: ParRule = "antisymmetric",
    graded: bool = False,
    alpha: float = 0.5,
    delta: float | None = None,
    scale: tuple[float, float] = DEFAULT_SCALE,
    format_penalty: float = 0.0,
) -> tuple[list[float], list[float]]:
    """(chosen_rewards, rejected_rewards), one per judgment, by the PAR ``rule`` of this module
    (``antisymmetric`` or ``indicator``, both proposed designs). ``delta`` defaults to a quarter of
    the scale range (graded option only)."""
    if rule not in PAR_RULES:
        raise InvalidValueError(f"unknown PAR rule {rule!r}; accepted: {', '.join(PAR_RULES)}")
    if format_penalty < 0:
        raise InvalidValueError(f"format_penalty must be >= 0, got {format_penalty}")
    mean_c, mean_r = _mean(chosen_scores), _mean(rejected_scores)
    d = float(delta) if delta is not None else (float(scale[1]) - float(scale[0])) / 4.0
    if d <= 0:
        raise InvalidValueError(f"delta must be > 0, got {d}")
    wrong_sign = -1.0 if rule == "antisymmetric" else 0.0

    def side(scores: Sequence[float | None], other: float | None, better: bool) -> list[float]:
        out = []
        for s in scores:
            if s is None:
                out.append(-format_penalty)
                continue
            if other is None:
                out.append(0.0)
                continue
            gap = float(s) - other if better else other - float(s)  # > 0: the right side
            if gap == 0:
                out.append(0.0)
                continue
            mag = 1.0 + alpha * min(1.0, abs(gap) / d) if graded else 1.0
            out.append(mag if gap > 0 else wrong_sign * mag)
        return out

    if mean_c is None or mean_r is None:
        mean_c = mean_r = None
    return side(chosen_scores, mean_r, True), side(rejected_scores, mean_c, False)
