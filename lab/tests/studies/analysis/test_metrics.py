"""Knowledge-consistency metrics (Ren et al. 2024, eval/analyse/metric.py) and the partial correlation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_lab.studies.analysis import (
    cosine_consistency,
    kl_consistency,
    rank_consistency,
    rank_order,
    spearman,
    spearman_partial_correlation,
)
from posttrain_lab.studies.analysis.metrics import student_t_two_sided_p

# the reference table: p_base, p_ft, ranks, rho, KL (nats)
TABLE = [
    ([0.6, 0.25, 0.1, 0.05], [0.4, 0.45, 0.1, 0.05], ([1, 2, 3, 4], [2, 1, 3, 4]), 0.8, 0.0963),
    ([0.7, 0.1, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4], ([1, 2, 2, 2], [4, 3, 2, 1]), -0.7746, 1.0443),
]


@pytest.mark.parametrize(("pb", "pf", "ranks", "rho", "kl"), TABLE)
def test_reference_table(pb, pf, ranks, rho, kl):
    assert rank_order(pb) == ranks[0] and rank_order(pf) == ranks[1]
    assert rank_consistency([pb], [pf]) == pytest.approx(rho, abs=5e-5)
    assert kl_consistency([pb], [pf]) == pytest.approx(kl, abs=5e-5)


def test_closed_forms():
    # row 2: ranks [1,2,2,2] vs [4,3,2,1]: cov = -1.5/4, var = .75/4 and 5/4 -> rho = -1.5/sqrt(3.75)
    assert rank_consistency([[0.7, 0.1, 0.1, 0.1]], [[0.1, 0.2, 0.3, 0.4]]) == pytest.approx(
        -1.5 / math.sqrt(3.75)
    )
    kl = 0.6 * math.log(0.6 / 0.4) + 0.25 * math.log(0.25 / 0.45)
    assert kl_consistency([[0.6, 0.25, 0.1, 0.05]], [[0.4, 0.45, 0.1, 0.05]]) == pytest.approx(kl, rel=1e-12)


def test_uniform_is_nan_counted_as_zero_and_mean_over_questions():
    rows_b = [[0.25] * 4, [0.6, 0.25, 0.1, 0.05]]
    rows_f = [[0.1, 0.2, 0.3, 0.4], [0.4, 0.45, 0.1, 0.05]]
    assert rank_consistency(rows_b, rows_f, per_question=True) == pytest.approx([0.0, 0.8])
    assert rank_consistency(rows_b, rows_f) == pytest.approx(0.4)


def test_ties_dense_vs_average():
    assert rank_order([0.4, 0.4, 0.1, 0.05]) == [1, 1, 2, 3]
    assert rank_order([0.4, 0.4, 0.1, 0.05], "average") == [1.5, 1.5, 3, 4]
    pb, pf = [[0.4, 0.4, 0.1, 0.05]], [[0.4, 0.3, 0.2, 0.1]]
    dense = rank_consistency(pb, pf)
    avg = rank_consistency(pb, pf, ties="average")
    assert dense != pytest.approx(avg)  # ties between other values: the two conventions differ
    assert dense == pytest.approx(np.corrcoef([1, 1, 2, 3], [1, 2, 3, 4])[0, 1])
    assert avg == pytest.approx(np.corrcoef([1.5, 1.5, 3, 4], [1, 2, 3, 4])[0, 1])


def test_cosine_and_errors():
    assert cosine_consistency([[1, 0]], [[0, 1]]) == pytest.approx(0.0)
    assert cosine_consistency([[0.5, 0.5]], [[0.2, 0.2]]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="shape"):
        rank_consistency([[0.5, 0.5]], [[0.2, 0.3, 0.5]])
    with pytest.raises(ValueError, match="NaN"):
        kl_consistency([[float("nan"), 1]], [[0.5, 0.5]])


weights = st.lists(st.integers(1, 100), min_size=2, max_size=6)


@settings(max_examples=50, deadline=None)
@given(st.lists(weights, min_size=1, max_size=4))
def test_properties(rows):
    norm = [[v / sum(r) for v in r] for r in rows]
    assert rank_consistency(norm, norm) == pytest.approx(
        np.mean([0.0 if len(set(r)) == 1 else 1.0 for r in norm])
    )
    assert kl_consistency(norm, norm) == pytest.approx(0.0, abs=1e-12)
    rev = [[101 - v for v in r] for r in rows]  # reversed order -> -1 per question (0 if constant)
    assert rank_consistency(rows, rev) == pytest.approx(
        np.mean([0.0 if len(set(r)) == 1 else -1.0 for r in rows])
    )


def test_student_t_closed_forms():
    for t in (0.3, 1.0, 4.0):
        assert student_t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), rel=1e-10)
        assert student_t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-10)


def test_partial_correlation_by_hand():
    x = [10.0, 20.0, 30.0, 40.0, 50.0]
    y = [3.0, 1.0, 4.0, 5.0, 2.0]
    z = [1.0, 2.0, 3.0, 5.0, 4.0]
    # ranks (1 = smallest): rx = 1..5, ry = [3,1,4,5,2], rz = [1,2,3,5,4]. OLS on [1, rz]:
    # rz centred = [-2,-1,0,2,1], |.|^2 = 10; rx centred = [-2,-1,0,1,2]: slope (4+1+0+2+2)/10 = .9
    # ry centred = [0,-2,1,2,-1]: slope (0+2+0+4-1)/10 = .5
    ex = np.array([-2, -1, 0, 1, 2]) - 0.9 * np.array([-2, -1, 0, 2, 1])  # [-.2,-.1,0,-.8,1.1]
    ey = np.array([0, -2, 1, 2, -1]) - 0.5 * np.array([-2, -1, 0, 2, 1])  # [1,-1.5,1,1,-1.5]
    # Spearman of the residuals: ranks ex [2,3,4,1,5], ey (ties averaged) [4,1.5,4,4,1.5]
    rex, rey = np.array([2, 3, 4, 1, 5.0]), np.array([4, 1.5, 4, 4, 1.5])
    rho = np.corrcoef(rex, rey)[0, 1]
    t = rho * math.sqrt(3 / (1 - rho**2))
    got, p = spearman_partial_correlation(x, y, z)
    assert np.argsort(ex).tolist() == [3, 0, 1, 2, 4] and ey.tolist() == [1, -1.5, 1, 1, -1.5]
    assert got == pytest.approx(rho, rel=1e-12)
    assert p == pytest.approx(student_t_two_sided_p(t, 3), rel=1e-12)
    # a constant control leaves plain Spearman
    assert spearman_partial_correlation(x, y, [7.0] * 5) == pytest.approx(spearman(x, y))
    with pytest.raises(ValueError, match="same length"):
        spearman_partial_correlation(x, y[:4], z)
