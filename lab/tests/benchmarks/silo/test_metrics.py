"""SILO-BENCH metrics (arXiv 2603.01045 §3.3): hand cases, both C and D variants, the Level-III fix,
properties."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_lab.benchmarks.silo import TASK_IDS, generate_case, task_level
from posttrain_lab.benchmarks.silo.metrics import (
    _lis_length,
    answer_key,
    communication_density,
    emergent_leaders,
    is_correct,
    normalize_value,
    partial_correctness,
    partial_credit,
    relative_coordination_cost,
    success_rate,
    token_consumption_code,
    token_consumption_paper,
)

# ------------------------------------------------------------------------------- normalisation


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("42", 42),
        (" -7 ", -7),
        ("3.50", 3.5),
        ("[1, 2]", [1, 2]),
        ('{"a": "1"}', {"a": 1}),
        ("true", True),
        ("True", True),
        ("False", False),
        ("null", None),
        ("Candidate_A", "Candidate_A"),
        ('"Candidate_A"', "Candidate_A"),
        ('"12"', 12),
        ("nan", "nan"),
        ((1, (2, "3")), [1, [2, 3]]),
        ({0: "1", "2": [("4",)]}, {"0": 1, "2": [[4]]}),
        ({1.0: 5}, {"1": 5}),
        ({"1.0": 5}, {"1": 5}),
        (["[1, 2]", "x"], [[1, 2], "x"]),
        (None, None),
        (2.5, 2.5),
    ],
)
def test_normalize_value(raw, norm):
    assert normalize_value(raw) == norm
    assert type(normalize_value(raw)) is type(norm)


def test_is_correct_exact_no_tolerance():
    assert is_correct("620", 620) and is_correct(620.0, 620) and is_correct("52.30", 52.3)
    assert not is_correct(619, 620)  # S has no tolerance (the authors' compute_success_rate)
    assert not is_correct(52.31, 52.3)
    assert not is_correct(1, True) and not is_correct(True, 1) and not is_correct(0, False)
    assert is_correct("True", True) and is_correct("false", False)
    assert is_correct({0: 1, 1: 2}, {"0": 1, "1": 2})  # dict keys as strings on both sides (JSON round trip)
    assert not is_correct({"0": 1}, {"0": 1, "1": 2})
    assert is_correct([(1.0, 2.5)], [[1, 2.5]]) and is_correct("[[1, 2], [3, 4]]", [[1, 2], [3, 4]])
    assert not is_correct([1, 2], [1, 2, 3])
    assert not is_correct(None, 5) and not is_correct("None", 5)
    assert is_correct({"variance": "0.25", "max_load": 66, "min_load": 65.0},
                      {"variance": 0.25, "max_load": 66, "min_load": 65})  # fmt: skip


# ------------------------------------------------------------------------------- S


def test_success_rate_hand_cases():
    assert success_rate([1, None, 3], [1, 2, 3]) == pytest.approx(2 / 3)
    assert success_rate(["7", 7], [7, 7]) == 1.0
    assert success_rate([None, None], [0, 0]) == 0.0
    assert success_rate([[1, 2], [3, 5]], [[1, 2], [3, 4]]) == 0.5  # segmented: agent i against its slice
    with pytest.raises(ValueError, match="answers has 2 entries but expected has 3"):
        success_rate([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="at least one agent"):
        success_rate([], [])


# ------------------------------------------------------------------------------- P


def test_partial_correctness_spec_examples():
    # worked examples of the P rules
    assert partial_credit([1, 2, 0, 4, 5], [1, 2, 3, 4], 2) == 0.75
    assert partial_credit([5, 3, 7, 9], [3, 5, 7, 9], 3) == 0.75
    assert partial_credit(619, 620, 1) == 1.0


def test_partial_level_one():
    assert partial_credit(613, 620, 1) == 0.0  # |7| > 6.2
    assert partial_credit(101, 100, 1) == 1.0 and partial_credit(99, 100, 1) == 1.0  # exactly 1 %
    assert partial_credit(101.01, 100, 1) == 0.0
    assert partial_credit(-101, -100, 1) == 1.0
    assert partial_credit(0, 0, 1) == 1.0 and partial_credit(0.001, 0, 1) == 0.0  # y = 0 needs exact
    assert partial_credit("49.9", 50.3, 1) == 1.0
    assert partial_credit("Candidate_B", "Candidate_A", 1) == 0.0
    assert partial_credit(True, True, 1) == 1.0 and partial_credit(1, True, 1) == 0.0
    top = [1000, 999, 990, 980, 975, 970, 969, 960, 955, 950]
    assert partial_credit(top, top, 1) == 1.0 and partial_credit(top[::-1], top, 1) == 0.0  # lists: exact
    assert partial_credit(None, 5, 1) == 0.0


def test_partial_level_two():
    assert partial_credit([1, 2], [1, 2, 3, 4], 2) == 0.5  # short answer
    assert partial_credit("[1, 2, 3, 9]", [1, 2, 3, 4], 2) == 0.75  # string answer parsed
    assert partial_credit(7, 7, 2) == 1.0 and partial_credit(7, 8, 2) == 0.0  # non-list: exact
    assert partial_credit({"0": 0, "1": 1}, {"0": 0, "1": 1}, 2) == 1.0  # II-18 dict: exact
    assert partial_credit({"0": 0, "1": 2}, {"0": 0, "1": 1}, 2) == 0.0
    assert partial_credit([], [], 2) == 1.0 and partial_credit([1], [], 2) == 0.0


def test_partial_level_three_list_of_lists_no_crash():
    # the authors' position map (compute_partial_correctness) crashed on list elements (III-25, III-27,
    # III-30)
    centroids = [[12.5, 40.0], [70.1, 20.2], [55.0, 90.3]]
    assert partial_credit(centroids, centroids, 3) == 1.0
    assert partial_credit(centroids[::-1], centroids, 3) == pytest.approx(1 / 3)
    assert partial_credit([[12.5, 40.0], [0, 0], [55.0, 90.3]], centroids, 3) == pytest.approx(2 / 3)
    triples = [[3, 5, 2.1], [1, 4, 2.05], [0, 0, 1.9]]
    assert partial_credit([[1, 4, 2.05], [3, 5, 2.1]], triples, 3) == pytest.approx(1 / 3)
    assert partial_credit("[[3, 5, 2.1], [1, 4, 2.05], [0, 0, 1.9]]", triples, 3) == 1.0
    matrix = [[1, 2], [3, 4], [5, 6]]
    assert partial_credit([(1, 2), (5, 6), (3, 4)], matrix, 3) == pytest.approx(2 / 3)
    assert partial_credit([[1, [2]], {"a": 1}], [[1, [2]], {"a": 1}], 3) == 1.0  # nested + dict elements
    assert partial_credit({"0": 0}, {"0": 0}, 3) == 1.0 and partial_credit(5, 6, 3) == 0.0


def test_partial_level_three_duplicates_matched_in_order():
    # our decision: the k-th submitted copy maps to the k-th occurrence
    assert partial_credit([1, 1, 2], [1, 1, 2], 3) == 1.0  # the authors' last-index map gives 2/3
    assert partial_credit([1, 2], [1, 1, 2], 3) == pytest.approx(2 / 3)
    assert partial_credit([1, 1, 1, 2], [1, 1, 2], 3) == 1.0  # a surplus copy has no slot and is ignored
    assert partial_credit([2, 1, 1], [1, 1, 2], 3) == pytest.approx(2 / 3)
    assert partial_credit([1, 1.0, True], [1, 1, 1], 3) == pytest.approx(2 / 3)  # True is not the number 1


def test_partial_correctness_average_and_errors():
    expected = [[1, 2, 3, 4]] * 4
    answers = [[1, 2, 3, 4], [1, 2, 0, 4, 5], None, "garbage"]
    assert partial_correctness(answers, expected, 2) == pytest.approx((1 + 0.75 + 0 + 0) / 4)
    with pytest.raises(ValueError, match="level must be 1, 2 or 3"):
        partial_correctness([1], [1], 4)
    with pytest.raises(ValueError, match="one per agent"):
        partial_correctness([1], [1, 1], 1)


def test_partial_on_every_generated_task():
    # the exact answer scores P = S = 1 for every task and level; a missing answer scores 0
    for task_id in TASK_IDS:
        expected = generate_case(task_id, 3, 5)["expected_output"]["per_agent_values"]
        level = task_level(task_id)
        assert success_rate(expected, expected) == 1.0
        assert partial_correctness(expected, expected, level) == 1.0, task_id
        assert partial_correctness([None] * 3, expected, level) == 0.0


def test_lis_against_brute_force():
    for seq in ([], [3], [1, 0, 2, 3], [5, 4, 3], [2, 2, 2], [0, 8, 4, 12, 2, 10, 6, 14, 1, 9]):
        brute = max(
            (len(c) for r in range(len(seq) + 1) for c in itertools.combinations(seq, r)
             if all(a < b for a, b in itertools.pairwise(c))),
            default=0,
        )  # fmt: skip
        assert _lis_length(seq) == brute


json_scalars = st.one_of(st.integers(-50, 50), st.sampled_from(["a", "b", "Candidate_A"]), st.booleans())
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=4), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(json_values, st.sampled_from([1, 2, 3]))
def test_correct_answer_full_credit(value, level):
    assert is_correct(value, value)
    assert partial_credit(value, value, level) == 1.0


def _variants(value):
    """Forms an agent might submit for the same answer: as is, as JSON text, integers as floats."""
    as_float = json.loads(json.dumps(value), parse_int=float)
    return [value, json.dumps(value), as_float]


@settings(max_examples=200, deadline=None)
@given(json_values, json_values)
def test_answer_key_agrees_with_is_correct(a, b):
    """Equal keys iff `is_correct` judges the answers equal (the consensus-failure count relies on it)."""
    for x in _variants(a):
        assert answer_key(x) == answer_key(a)
        for y in _variants(b):
            assert (answer_key(x) == answer_key(y)) == is_correct(x, y)
    assert answer_key(True) != answer_key(1) and answer_key({"0": 1}) == answer_key({0: 1.0})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(json_values, json_values), min_size=1, max_size=6), st.sampled_from([1, 2, 3]))
def test_p_bounds_and_p_at_least_s(pairs, level):
    answers = [a for a, _ in pairs]
    expected = [e for _, e in pairs]
    s = success_rate(answers, expected)
    p = partial_correctness(answers, expected, level)
    assert 0.0 <= s <= 1.0 and 0.0 <= p <= 1.0
    assert p >= s - 1e-12


@settings(max_examples=200, deadline=None)
@given(st.permutations(list(range(8))))
def test_level_three_permutation_credit(perm):
    credit = partial_credit(list(perm), list(range(8)), 3)
    assert credit == _lis_length(list(perm)) / 8
    assert (credit == 1.0) == (list(perm) == list(range(8)))


# ------------------------------------------------------------------------------- C, D, RCC, leaders


def test_token_consumption_both_variants():
    # the same run: 3 agents, 6 rounds executed, R_max = 100
    assert token_consumption_code(1000, 200, 6) == 200.0
    assert token_consumption_paper(200, 100) == 2.0
    assert token_consumption_paper([50, 70, 80]) == 2.0  # per-agent totals are summed
    assert token_consumption_code(0, 0, 0) == 0.0
    with pytest.raises(ValueError, match="input_tokens must be a finite number >= 0"):
        token_consumption_code(-1, 0, 1)
    with pytest.raises(ValueError, match="max_rounds must be a positive integer"):
        token_consumption_paper(10, 0)


def test_communication_density_both_counting_variants():
    # D = m / (N (N-1)): SFS counted as writes (code) vs reads by others (paper) on the same run
    writes, reads = 6, 15
    assert communication_density(writes, 4) == 0.5
    assert communication_density(reads, 4) == 1.25  # uncapped
    # BP: one per broadcast (code) vs recipient-weighted (× (N − 1))
    assert communication_density(3, 4) == 0.25 and communication_density(3 * 3, 4) == 0.75
    assert communication_density(0, 1) == 0.0
    with pytest.raises(ValueError, match="num_agents must be a positive integer"):
        communication_density(1, 0)
    with pytest.raises(ValueError, match="message_count"):
        communication_density(-2, 3)


def test_relative_coordination_cost_table2():
    # paper Table 2 (GPT-OSS-120B): SR(N=1) / SR(N=k) / RCC
    assert relative_coordination_cost(82.0, 96.7) == pytest.approx(0.152, abs=5e-4)
    assert relative_coordination_cost(62.0, 90.0) == pytest.approx(0.311, abs=5e-4)
    assert relative_coordination_cost(0.0, 26.7) == 1.0
    assert relative_coordination_cost(0.41, 0.80) == pytest.approx(0.4875)  # fractions work the same
    assert math.isnan(relative_coordination_cost(0.0, 0.0))


def test_emergent_leaders():
    assert emergent_leaders([10, 1, 1, 0]) == [0]  # mean 3, threshold 4.5
    assert emergent_leaders([6, 4, 4, 2]) == []  # exactly 1.5 × mean is not "more than"
    assert emergent_leaders([9, 0, 9, 0, 0, 0]) == [0, 2]
    assert emergent_leaders([2, 2, 2]) == [] and emergent_leaders([0, 0]) == [] and emergent_leaders([]) == []
    with pytest.raises(ValueError, match=r"received_counts\[1\]"):
        emergent_leaders([1, -1])
