"""Knowledge-consistency metrics and the Spearman partial correlation (pure math, no model).

Source: Ren et al., "Learning or Self-aligning? Rethinking Instruction Fine-tuning", ACL 2024,
arXiv 2402.18243; the authors' code `renmengjie7/Self-Aligning`, `eval/analyse/metric.py`
(`replace_with_order`, `calculate_pearson_correlation`, `kl_divergence`, `cosine_similarity`, `cal`)
and `eval/analyse/partial_correlation.py` (`calculate_spearman_partial_correlation`).

For question q, ``p_base(q)`` is the base model's distribution over the options (few-shot prompt, no
chat template) and ``p_ft(q)`` the fine-tuned model's (0-shot, chat template). Then

    rank consistency  Cons = (1/|Q|) Σ_q ρ_Pearson(rank(p_base(q)), rank(p_ft(q)))      (NaN → 0)
    KL                       (1/|Q|) Σ_q Σ_i p_base,i · ln(p_base,i / p_ft,i)
    cosine                   (1/|Q|) Σ_q <p_base, p_ft> / (‖p_base‖ ‖p_ft‖)

``rank`` gives 1 to the most likely option; tied probabilities share a rank. The authors'
``replace_with_order`` numbers the distinct values 1, 2, 3, ... ("dense" ranks: [.7,.1,.1,.1] →
[1,2,2,2]); ``ties="average"`` gives the mean of the tied positions instead ([1,3,3,3]). Both give
the same Pearson correlation unless ties sit between other values (e.g. [.4,.4,.1,.05]).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from posttrain.utils.errors import InvalidValueError

Ties = Literal["dense", "average"]

__all__ = [
    "cosine_consistency",
    "kl_consistency",
    "pearson",
    "rank_consistency",
    "rank_order",
    "spearman",
    "spearman_partial_correlation",
    "student_t_two_sided_p",
]


def _pair(p_base, p_ft) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per-question (p_base, p_ft) arrays; questions may have different numbers of options."""
    base, ft = list(p_base), list(p_ft)
    if base and np.isscalar(base[0]):
        base, ft = [base], [ft] if ft and np.isscalar(ft[0]) else ft
    if len(base) != len(ft):
        raise InvalidValueError(f"p_base has {len(base)} questions but p_ft has {len(ft)}; they must match")
    if not base:
        raise InvalidValueError("no questions")
    out = []
    for i, (a, b) in enumerate(zip(base, ft, strict=True)):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.ndim != 1 or a.shape != b.shape or a.size < 1:
            raise InvalidValueError(
                f"question {i}: p_base has shape {a.shape} but p_ft has shape {b.shape}; they must match"
            )
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            raise InvalidValueError(f"question {i}: a distribution contains NaN or infinite values")
        out.append((a, b))
    return out


def rank_order(values: Sequence[float], ties: Ties = "dense") -> list[float]:
    """Ranks of ``values``, 1 = largest. ``dense``: distinct values get 1, 2, 3, ... in descending
    order (the authors' ``replace_with_order``); ``average``: tied values get the mean of the ranks
    they occupy (``scipy.stats.rankdata(-v)``)."""
    v = [float(x) for x in values]
    if ties == "dense":
        order = {x: i for i, x in enumerate(sorted(set(v), reverse=True), start=1)}
        return [float(order[x]) for x in v]
    if ties == "average":
        idx = sorted(range(len(v)), key=lambda i: -v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(idx):
            j = i
            while j + 1 < len(idx) and v[idx[j + 1]] == v[idx[i]]:
                j += 1
            for k in range(i, j + 1):
                out[idx[k]] = (i + j) / 2 + 1
            i = j + 1
        return out
    raise InvalidValueError(f"ties must be 'dense' or 'average', got {ties!r}")


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; NaN when either vector is constant (or shorter than 2)."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise InvalidValueError(f"pearson: vectors of equal length expected, got {a.shape} and {b.shape}")
    if a.size < 2:
        return float("nan")
    da, db = a - a.mean(), b - b.mean()
    den = math.sqrt(float(da @ da) * float(db @ db))
    if den == 0.0:
        return float("nan")
    return max(-1.0, min(1.0, float(da @ db) / den))


def rank_consistency(p_base, p_ft, *, ties: Ties = "dense", per_question: bool = False):
    """Mean over questions of ρ_Pearson(rank(p_base(q)), rank(p_ft(q))), an undefined ρ (constant
    ranks) counting as 0 (Ren et al. 2024, `eval/analyse/metric.py`). In [-1, 1]; the paper reports
    it × 100. ``per_question=True`` returns the list of per-question values instead."""
    vals = []
    for pa, pb in _pair(p_base, p_ft):
        r = pearson(rank_order(pa, ties), rank_order(pb, ties))
        vals.append(0.0 if math.isnan(r) else r)
    return vals if per_question else float(np.mean(vals))


def kl_consistency(p_base, p_ft, *, per_question: bool = False):
    """Mean over questions of KL(p_base ‖ p_ft) in nats (``scipy.stats.entropy(p, q)``: both rows
    are normalised to sum 1 first; terms with p = 0 are 0; p > 0 where q = 0 gives +inf)."""
    vals = []
    for a, b in _pair(p_base, p_ft):
        if np.any(a < 0) or np.any(b < 0) or a.sum() <= 0 or b.sum() <= 0:
            raise InvalidValueError("kl_consistency: distributions must be non-negative and not all zero")
        a, b = a / a.sum(), b / b.sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            vals.append(float(np.where(a > 0, a * (np.log(a) - np.log(b)), 0.0).sum()))
    return vals if per_question else float(np.mean(vals))


def cosine_consistency(p_base, p_ft, *, per_question: bool = False):
    """Mean over questions of the cosine similarity of the two option distributions."""
    vals = []
    for a, b in _pair(p_base, p_ft):
        den = float(np.linalg.norm(a) * np.linalg.norm(b))
        if den == 0:
            raise InvalidValueError("cosine_consistency: a distribution is all zeros")
        vals.append(float(a @ b) / den)
    return vals if per_question else float(np.mean(vals))


# ------------------------------------------------------------------------- partial correlation
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        de = d * c
        h *= de
        if abs(de - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def student_t_two_sided_p(t: float, df: float) -> float:
    """P(|T| ≥ |t|) for Student's t with ``df`` degrees of freedom: I_{df/(df+t²)}(df/2, 1/2)."""
    if df <= 0:
        return float("nan")
    if math.isinf(t):
        return 0.0
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def _correlation_p(r: float, n: int) -> float:
    """Two-sided p-value of a correlation r from n pairs, t = r √((n−2)/(1−r²)) with n − 2 degrees
    of freedom (the test ``scipy.stats.spearmanr`` / ``pearsonr`` report)."""
    if math.isnan(r) or n < 3:
        return float("nan")
    if abs(r) >= 1.0:
        return 0.0
    t = r * math.sqrt((n - 2) / (1.0 - r * r))
    return student_t_two_sided_p(t, n - 2)


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Spearman correlation (Pearson of average ranks) and its two-sided p-value."""
    rx, ry = rank_order([-v for v in x], "average"), rank_order([-v for v in y], "average")
    r = pearson(rx, ry)
    return r, _correlation_p(r, len(rx))


def spearman_partial_correlation(
    x: Sequence[float], y: Sequence[float], z: Sequence[float] | Sequence[Sequence[float]]
) -> tuple[float, float]:
    """Spearman partial correlation of X and Y controlling for Z, and its p-value (Ren et al. 2024,
    `eval/analyse/partial_correlation.py`): rank-transform X, Y and each control (average ranks,
    1 = smallest, as ``pandas.Series.rank``); regress rank(X) and rank(Y) on [1, rank(Z)] by least
    squares; return the Spearman correlation of the two residual vectors (rounded to 1e-9 first, so
    that residuals equal up to rounding noise count as ties) and its two-sided p-value
    (t-test with n − 2 degrees of freedom, as ``scipy.stats.spearmanr``). In the paper X =
    consistency × 100, Y = fine-tuned accuracy, Z = base accuracy, one point per data group.

    ``z`` is one control (a vector) or several (a list of vectors). A constant control leaves the
    ranks only centred, so the result is then the plain Spearman correlation of X and Y."""
    xs = [float(v) for v in x]
    ys = [float(v) for v in y]
    zs_raw = list(z)
    several = bool(zs_raw) and isinstance(zs_raw[0], (list, tuple, np.ndarray))
    controls = [[float(v) for v in c] for c in zs_raw] if several else [[float(v) for v in zs_raw]]
    n = len(xs)
    if len(ys) != n or any(len(c) != n for c in controls):
        raise InvalidValueError(
            f"spearman_partial_correlation: x, y and z need the same length (got {n}, {len(ys)}, "
            f"{[len(c) for c in controls]})"
        )
    if n < 3:
        raise InvalidValueError(f"spearman_partial_correlation: need at least 3 points, got {n}")

    def rank(v: list[float]) -> np.ndarray:  # average ranks, 1 = smallest
        return np.asarray(rank_order([-u for u in v], "average"), dtype=np.float64)

    design = np.column_stack([np.ones(n), *(rank(c) for c in controls)])
    res = []
    for v in (xs, ys):
        target = rank(v)
        coef, *_ = np.linalg.lstsq(design, target, rcond=None)
        # rounded so that residuals equal up to floating-point noise stay tied when ranked
        res.append(np.round(target - design @ coef, 9))
    return spearman(res[0].tolist(), res[1].tolist())
