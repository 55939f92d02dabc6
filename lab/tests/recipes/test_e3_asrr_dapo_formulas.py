"""E3 allocation / temperature / annealing, ASRR length penalty and DAPO overlong penalty: the
reference values derived from the papers' formulas, plus property tests of the allocation invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_lab.recipes.asrr.hooks import asrr_length_penalty
from posttrain_lab.recipes.dapo.hooks import dapo_overlong_penalty
from posttrain_lab.recipes.e3.hooks import allocate_rollouts, e3_annealed_target, e3_temperature_step

QWEN_VOCAB = 152064  # ln|V| + ln ln|V| = 14.4113


# --------------------------------------------------------------------------------- E3 allocation
@pytest.mark.parametrize(
    ("ranks", "g_min", "g_max", "leftover", "expected"),
    [
        ([0.1, 0.3, 0.6, 0.9], 4, 12, "hardest-first", [4, 6, 10, 12]),
        ([0.1, 0.3, 0.6, 0.9], 4, 12, "capped", [4, 6, 10, 12]),
        ([0.2, 0.4, 0.5, 0.7], 6, 10, "hardest-first", [6, 7, 9, 10]),
        # authors' code (get_rollout_n_per_prompt): proportional step [4, 4, 5, 17] (not capped, so it
        # exceeds G_max = 12), leftover 2 to the hardest prompt below G_max -> [4, 4, 7, 17]
        ([0.0, 0.05, 0.1, 0.95], 4, 12, "hardest-first", [4, 4, 7, 17]),
        # capped at 12 and the overflow handed out in descending difficulty, cycling
        ([0.0, 0.05, 0.1, 0.95], 4, 12, "capped", [6, 6, 8, 12]),
        # the authors' k / (Σk + 1e-8) puts each share of the 16 extra just under 4 (floor 3, counts 7),
        # so leftover 4 goes to the hardest prompt first (up to G_max), not one each round-robin
        ([0.3, 0.3, 0.3, 0.3], 4, 12, "hardest-first", [11, 7, 7, 7]),
        ([0.3, 0.3, 0.3, 0.3], 4, 12, "capped", [8, 8, 8, 8]),
    ],
)
def test_allocation_reference_rows(ranks, g_min, g_max, leftover, expected):
    assert allocate_rollouts(ranks, 32, g_min, g_max, leftover=leftover) == expected


def test_allocation_default_is_the_authors_rule():
    assert allocate_rollouts([0.0, 0.05, 0.1, 0.95], 32, 4, 12) == [4, 4, 7, 17]
    with pytest.raises(ValueError, match="leftover"):
        allocate_rollouts([0.1], 8, 4, 12, leftover="round-robin")


def test_unseen_and_all_zero_difficulty_give_the_uniform_split():
    assert allocate_rollouts([-100.0] * 4, 32, 4, 12) == [8, 8, 8, 8]
    assert allocate_rollouts([0.0, 0.0, 0.0], 10, 2, 6) == [4, 3, 3]
    # unseen prompts next to ranked ones weigh 0: they keep g_min
    assert allocate_rollouts([-100.0, 0.5], 16, 4, 12) == [4, 12]


@pytest.mark.parametrize(("total", "g_min", "g_max"), [(15, 4, 12), (49, 4, 12), (32, 5, 4), (32, 0, 4)])
def test_allocation_refuses_an_infeasible_budget(total, g_min, g_max):
    with pytest.raises(ValueError, match=r"g_min|total"):
        allocate_rollouts([0.1, 0.2, 0.3, 0.4], total, g_min, g_max)


@st.composite
def _alloc_case(draw):
    b = draw(st.integers(1, 12))
    g_min = draw(st.integers(1, 8))
    g_max = draw(st.integers(g_min, 16))
    total = draw(st.integers(b * g_min, b * g_max))
    diff = draw(st.lists(st.one_of(st.floats(0, 0.999), st.just(-100.0)), min_size=b, max_size=b))
    return diff, total, g_min, g_max


@pytest.mark.parametrize("leftover", ["hardest-first", "capped"])
@settings(max_examples=300, deadline=None)
@given(case=_alloc_case())
def test_allocation_invariants(case, leftover):
    diff, total, g_min, g_max = case
    n = allocate_rollouts(diff, total, g_min, g_max, leftover=leftover)
    assert sum(n) == total
    assert all(g_min <= x for x in n)
    if leftover == "capped":
        assert all(x <= g_max for x in n)
    k = [max(d, 0.0) for d in diff]
    for i in range(len(n)):
        for j in range(len(n)):
            if k[i] > k[j]:
                assert n[i] >= n[j], (diff, n)
    if sum(k) == 0:
        assert max(n) - min(n) <= 1


# --------------------------------------------------------------------------------- E3 temperature
@pytest.mark.parametrize(
    ("tau", "h", "expected"),
    [
        (1.0, 0.40, 1.01548),
        (1.0, 0.50, 1.0),
        (1.0, 0.60, 0.98735),
        (1.0, 0.25, 1.04810),
        (1.2, 0.40, 1.22230),
    ],
)
def test_temperature_reference_rows(tau, h, expected):
    assert e3_temperature_step(tau, h, 0.5, QWEN_VOCAB) == pytest.approx(expected, abs=5e-5)


def test_temperature_factor_is_ln_v_plus_ln_ln_v():
    factor = math.log(QWEN_VOCAB) + math.log(math.log(QWEN_VOCAB))
    assert factor == pytest.approx(14.4113, abs=1e-4)
    assert e3_temperature_step(1.0, 0.5 / math.e, 0.5, QWEN_VOCAB) == pytest.approx(1 + 1 / factor)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.1, 3.0), st.floats(0.01, 5.0), st.floats(0.01, 5.0), st.integers(3, 300_000))
def test_temperature_moves_towards_the_target(tau, h, target, v):
    new = e3_temperature_step(tau, h, target, v)
    if h < target:
        assert new >= tau
    elif h > target:
        assert new <= tau


@pytest.mark.parametrize(("t", "ratio"), [(0, 1.0), (288, 1.0), (384, 0.95), (432, 0.91464), (480, 0.90)])
def test_annealing_reference_rows(t, ratio):
    assert e3_annealed_target(2.0, t, 480) == pytest.approx(2.0 * ratio, abs=2e-5)


# ---------------------------------------------------------------------------------------- ASRR
LENGTHS = [3000, 4024, 5048, 7000]


@pytest.mark.parametrize(
    ("correct", "tau", "expected_r"),
    [
        ([1, 1, 1, 1], 1.0, [1, 0.75, 0.5, 0.5]),
        ([1, 1, 1, 0], 1.0, [1, 1, 1, 0]),
        ([1, 1, 1, 0], 0.5, [1, 0.875, 0.75, -0.25]),
        ([1, 1, 1, 0], 0.0, [1, 0.8125, 0.625, -0.375]),
        # the shortest rollout is wrong: O_i is measured from the shortest CORRECT one (4024), so the
        # wrong 3000-token rollout gets O = 0 (clipped) and the 5048 one O = 0.5; a rule taking the
        # shortest over all rollouts gives [0, 0.875, 0.75, 0.75] and [0, 0.8125, 0.625, 0.625]
        ([0, 1, 1, 1], 0.5, [0, 1, 0.875, 0.75]),
        ([0, 1, 1, 1], 0.0, [0, 1, 0.8125, 0.625]),
    ],
)
def test_asrr_reference_rows(correct, tau, expected_r):
    pen = asrr_length_penalty([bool(c) for c in correct], LENGTHS, beta=0.5, window=2048, tau=tau)
    r = [c - p for c, p in zip(correct, pen, strict=True)]
    assert r == pytest.approx(expected_r, abs=1e-5)


def test_asrr_shortest_correct_not_shortest_overall():
    """The shortest rollout (100) is wrong: O_i = clip((L_i − 200) / 200, 0, 1) from the shortest
    CORRECT one; Acc = 0.75, α = 1 · (0.75 − 0.5 + ε) / (1 − 0.5 + ε) ≈ 0.5. Measuring from the shortest
    of all rollouts would give [0, 0.25, 0.5, 0.5]."""
    eps = 1e-6
    alpha = (0.75 - 0.5 + eps) / (1 - 0.5 + eps)
    pen = asrr_length_penalty([False, True, True, True], [100, 200, 300, 400], beta=1.0, window=200, tau=0.5)
    assert pen == pytest.approx([0.0, 0.0, 0.5 * alpha, 1.0 * alpha], abs=1e-12)


def test_asrr_no_correct_rollout_means_no_length_term():
    assert asrr_length_penalty([False] * 4, LENGTHS, tau=0.0) == [0.0] * 4


@pytest.mark.parametrize(("key", "value"), [("tau", 1.5), ("tau", -0.1), ("window", -5), ("beta", -1)])
def test_asrr_bad_settings_name_the_key(key, value):
    with pytest.raises(ValueError, match=key):
        asrr_length_penalty([True], [1], **{key: value})


# ---------------------------------------------------------------------------------------- DAPO
@pytest.mark.parametrize(("length", "expected"), [(16000, 0.0), (16384, 0.0), (18432, -0.5), (20480, -1.0)])
def test_dapo_overlong_reference_rows(length, expected):
    assert dapo_overlong_penalty(length, max_length=20480, buffer=4096, factor=1.0) == pytest.approx(expected)


def test_dapo_overlong_bad_buffer_names_the_key():
    with pytest.raises(ValueError, match="buffer"):
        dapo_overlong_penalty(10, max_length=8, buffer=16)
