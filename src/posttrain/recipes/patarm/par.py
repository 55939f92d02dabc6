"""PAR — preference-aware rewards for training a pointwise judge from preference pairs.

PaTaRM (arXiv 2510.24235) samples n judgments of the chosen response (scores s_c^i) and n of the
rejected one (s_r^j) from the same pointwise judge and rewards judgments that put the chosen response
above the rejected one on average. The exact per-judgment rule below is a **proposed design**:

    s̄_c = mean of the parsable s_c^i,    s̄_r = mean of the parsable s_r^j
    r(o_c^i) = 1  if s_c^i > s̄_r  else 0        (each judgment must land strictly on the right side
    r(o_r^j) = 1  if s_r^j < s̄_c  else 0         of the OTHER response's mean)

* an unparsable judgment (score None) earns ``-format_penalty`` (default 0) and is left out of the means;
* when one side has no parsable score, no mean exists: every judgment of the pair earns 0
  (unparsable ones still ``-format_penalty``);
* graded option (off by default): a correct judgment earns ``1 + α·min(1, |s − s̄_other| / Δ)``,
  Δ = (scale max − scale min) / 4, α = 0.5 — more reward for a clearer separation.

Example (n = 4): chosen [8, 7, 5, 9] (s̄_c = 7.25), rejected [6, 7, 4, 8] (s̄_r = 6.25) →
rewards chosen [1, 1, 0, 1], rejected [1, 1, 1, 0].
"""

from __future__ import annotations

from collections.abc import Sequence

from posttrain.recipes.patarm.prompts import DEFAULT_SCALE


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [float(x) for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def par_rewards(
    chosen_scores: Sequence[float | None],
    rejected_scores: Sequence[float | None],
    *,
    graded: bool = False,
    alpha: float = 0.5,
    delta: float | None = None,
    scale: tuple[float, float] = DEFAULT_SCALE,
    format_penalty: float = 0.0,
) -> tuple[list[float], list[float]]:
    """(chosen_rewards, rejected_rewards), one per judgment, by the PAR rule of this module
    (proposed design). ``delta`` defaults to a quarter of the scale range (graded option only)."""
    if format_penalty < 0:
        raise ValueError(f"format_penalty must be >= 0, got {format_penalty}")
    mean_c, mean_r = _mean(chosen_scores), _mean(rejected_scores)
    d = float(delta) if delta is not None else (float(scale[1]) - float(scale[0])) / 4.0
    if d <= 0:
        raise ValueError(f"delta must be > 0, got {d}")

    def side(scores: Sequence[float | None], other: float | None, better: bool) -> list[float]:
        out = []
        for s in scores:
            if s is None:
                out.append(-format_penalty)
            elif other is None:
                out.append(0.0)
            else:
                ok = s > other if better else s < other
                if not ok:
                    out.append(0.0)
                elif graded:
                    out.append(1.0 + alpha * min(1.0, abs(float(s) - other) / d))
                else:
                    out.append(1.0)
        return out

    if mean_c is None or mean_r is None:
        mean_c = mean_r = None
    return side(chosen_scores, mean_r, True), side(rejected_scores, mean_c, False)
