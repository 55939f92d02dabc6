"""Small summary statistics shared by the demos, benchmarks and experiments."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from posttrain.utils.errors import InvalidValueError


def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean, ``sd / sqrt(n)`` with the sample sd (n − 1);
    the SE is NaN for one value, both are NaN for none."""
    n = len(xs)
    if not n:
        return float("nan"), float("nan")
    m = statistics.fmean(xs)
    return m, (statistics.stdev(xs) / math.sqrt(n) if n > 1 else float("nan"))


def se_binomial(p: float, n: int) -> float:
    """Standard error of a proportion ``p`` over ``n`` items, ``sqrt(p (1 − p) / n)``; NaN when n = 0."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")


def paired_gain(before: list[float], after: list[float]) -> dict[str, float]:
    """Gain of ``after`` over ``before`` (same prompts; 0/1 verdicts, or an after-verdict averaged over
    seeds) with its paired standard error ``sd(d)/sqrt(n)`` over the per-prompt differences."""
    if len(before) != len(after) or not before:
        raise InvalidValueError(
            f"paired_gain: need two equally long non-empty lists, got {len(before)} and {len(after)}"
        )
    n = len(before)
    d = [float(a) - float(b) for a, b in zip(after, before, strict=True)]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    se = math.sqrt(var / n)
    return {"gain": mean, "se": se, "gain_over_se": mean / se if se > 0 else float("inf") if mean else 0.0}
