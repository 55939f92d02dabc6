"""cl_metrics on a hand-made accuracy matrix (GEM definitions), P- and V-scores."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_lab.studies.cit.metrics import cl_metrics, p_score, v_score

# acc[i][j]: accuracy on task j after training through task i
ACC = [
    [0.9, 0.2, 0.1],
    [0.6, 0.8, 0.3],
    [0.5, 0.7, 0.9],
]
INIT = [0.1, 0.1, 0.2]


def test_cl_metrics_hand_made_matrix():
    m = cl_metrics(ACC, INIT)
    assert m["average_accuracy"] == pytest.approx((0.5 + 0.7 + 0.9) / 3)
    assert m["backward_transfer"] == pytest.approx(((0.5 - 0.9) + (0.7 - 0.8)) / 2)  # -0.25
    assert m["forward_transfer"] == pytest.approx(((0.2 - 0.1) + (0.3 - 0.2)) / 2)  # 0.1
    assert m["forgetting"] == pytest.approx([0.9 - 0.5, 0.8 - 0.7])
    assert m["mean_forgetting"] == pytest.approx(0.25)
    assert cl_metrics(ACC)["forward_transfer"] is None


def test_forgetting_uses_the_best_earlier_accuracy():
    # task 0 peaks after stage 1 (0.95), not at its own stage (0.7)
    m = cl_metrics([[0.7, 0.0, 0.0], [0.95, 0.5, 0.0], [0.6, 0.5, 0.9]])
    assert m["forgetting"][0] == pytest.approx(0.35)
    assert m["backward_transfer"] == pytest.approx(((0.6 - 0.7) + 0.0) / 2)


def test_cl_metrics_edge_cases():
    one = cl_metrics([[0.4]], [0.1])
    assert one["average_accuracy"] == 0.4 and one["backward_transfer"] is None
    with pytest.raises(ValueError, match="square"):
        cl_metrics([[0.1, 0.2]])
    with pytest.raises(ValueError, match="one entry per task"):
        cl_metrics(ACC, [0.1])


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 6).flatmap(lambda t: st.lists(st.floats(0, 1), min_size=t, max_size=t)))
def test_no_forgetting_when_accuracy_is_kept(final):
    """If every task keeps its accuracy once learned, BWT = 0 and forgetting = 0."""
    t = len(final)
    acc = [[final[j] if j <= i else 0.0 for j in range(t)] for i in range(t)]
    m = cl_metrics(acc)
    assert m["backward_transfer"] == pytest.approx(0.0, abs=1e-12)
    assert m["mean_forgetting"] == pytest.approx(0.0, abs=1e-12)
    assert m["average_accuracy"] == pytest.approx(sum(final) / t)


def test_p_and_v_scores():
    assert p_score({"breadth": {"a": 0.5, "b": 1.0}, "constraint": {"a": 0.0, "b": 0.5}}) == pytest.approx(
        0.5
    )
    assert v_score([True, False, True, True]) == 0.75
    with pytest.raises(ValueError):
        v_score([])
