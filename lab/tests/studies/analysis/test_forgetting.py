"""The restoration protocol's classification rule (proposed design) on the reference example."""

from __future__ import annotations

import pytest

from posttrain_lab.studies.analysis.forgetting import classify, epsilon, log_steps, transition_step, verdicts


def test_reference_example():
    # score(M_0) = 60, score(M_s) = 52, eps = 1: restored 59.5 -> F 8, G 0.5 -> pseudo; 55 -> G 5 -> actual
    assert classify(60, 52, 59.5, 1.0) == (8, 0.5, "pseudo")
    assert classify(60, 52, 55, 1.0) == (8, 5, "actual")
    assert classify(60, 61, 60.5, 1.0)[2] == "none"  # no forgetting, recovered
    assert classify(60, 52, 59.0, 1.0)[2] == "pseudo"  # G == eps is still pseudo (G <= eps)


def test_transition_and_epsilon():
    vs = verdicts(60, [1, 10, 100, 1000], [58, 52, 50, 40], [60, 59.5, 55, 45], 1.0)
    assert [v.stage for v in vs] == ["pseudo", "pseudo", "actual", "actual"]
    assert transition_step(vs) == 100
    assert transition_step(verdicts(60, [5], [52], [59.5], 1.0)) is None
    assert epsilon([]) == 1.0 and epsilon([50.0]) == 1.0
    assert epsilon([50.0, 52.0]) == pytest.approx(2 * 2**0.5)  # 2 x sample std (sqrt 2)
    assert epsilon([50.0, 50.2], floor=1.0) == 1.0
    with pytest.raises(ValueError, match="same length"):
        verdicts(60, [1, 2], [50], [50], 1.0)


def test_log_steps():
    assert log_steps(100, 3) == [1, 10, 100]
    assert log_steps(1000, 4) == [1, 10, 100, 1000]
    s = log_steps(7, 10)
    assert s == sorted(set(s)) and s[-1] == 7 and len(s) == 7


def test_control_calibrated_reading():
    # restoration alone costs 10 points (control 50 vs base 60): against M_0 every checkpoint looks
    # "actual"; against the control only the one that stays below it does
    vs = verdicts(60, [1, 10], [52, 40], [49.5, 42], 1.0, control=50.0)
    assert [v.stage for v in vs] == ["actual", "actual"]
    assert [v.control_gap for v in vs] == [0.5, 8.0]
    assert [v.control_stage for v in vs] == ["pseudo", "actual"]
    assert transition_step(vs) == 1 and transition_step(vs, calibrated=True) == 10
