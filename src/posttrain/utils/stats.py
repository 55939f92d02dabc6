"""Small summary statistics shared by the demos, benchmarks and experiments."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


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
