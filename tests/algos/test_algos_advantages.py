"""Advantage estimators: reference table (verl GRPO semantics), groups of any size/order, RLOO, REINFORCE++, DuCA/HIAN."""

from __future__ import annotations

import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.algos import advantage_defaults, get_advantage, hian_advantages, list_advantages


def adv(name, rewards, ids, **kw):
    return get_advantage(name)(torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids), **kw)


def close(x, y, tol=1e-4):
    torch.testing.assert_close(
        torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64), rtol=0, atol=tol
    )


def test_registry():
    assert list_advantages() == ["dr_grpo", "duca", "grpo", "reinforce_plus_plus", "reinforce_pp", "rloo"]
    assert get_advantage("reinforce_plus_plus_baseline") is get_advantage("reinforce_pp")
    assert advantage_defaults("grpo") == {"norm_std": True, "eps": 1e-6}
    assert advantage_defaults("rloo") == {}
    with pytest.raises(KeyError, match=r"unknown advantage estimator 'gpro'.*Did you mean 'grpo'"):
        get_advantage("gpro")
    with pytest.raises(
        TypeError, match=r"'grpo': unknown parameter 'norm'.*accepted parameters: eps, norm_std"
    ):
        adv("grpo", [1.0, 0.0], [0, 0], norm=False)
    with pytest.raises(ValueError, match="eps must be a number >= 0"):
        adv("grpo", [1.0, 0.0], [0, 0], eps=-1)


# reference table (verl GRPO semantics): scores, std-normalised A, Dr.GRPO A
GRPO_TABLE = [
    ([1, 0, 0, 1], [0.866, -0.866, -0.866, 0.866], [0.5, -0.5, -0.5, 0.5]),
    ([1, 0, 0, 0], [1.5, -0.5, -0.5, -0.5], [0.75, -0.25, -0.25, -0.25]),
    ([1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]),
    ([0.7], [0.7], [0.7]),
]


@pytest.mark.parametrize(("scores", "a_std", "a_dr"), GRPO_TABLE)
def test_grpo_reference_table(scores, a_std, a_dr):
    ids = [7] * len(scores)
    close(adv("grpo", scores, ids), a_std, 1e-3)
    close(adv("grpo", scores, ids, norm_std=False), a_dr, 1e-12)
    close(adv("dr_grpo", scores, ids), a_dr, 1e-12)


def test_grpo_all_groups_in_one_call_unsorted_ids():
    # the four table groups interleaved, ids non-contiguous and unsorted
    scores, ids, expect = [], [], []
    order = [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (0, 2), (2, 1), (1, 2), (0, 3)]
    order += [(2, 2), (1, 3), (2, 3)]
    labels = [42, -5, 1000, 3]
    for g, k in order:
        s, a_std, _ = GRPO_TABLE[g]
        scores.append(s[k])
        ids.append(labels[g])
        expect.append(a_std[k])
    close(adv("grpo", scores, ids), expect, 1e-3)
    # singleton follows verl: mean 0, std 1 → A = R / (1 + ε)
    assert adv("grpo", [0.7], [1]).item() == pytest.approx(0.7 / (1 + 1e-6), abs=1e-15)


def _reference(name, rewards, ids, eps=1e-6):
    """Per-group Python loop (the slow, obvious implementation) to compare against."""
    out = [0.0] * len(rewards)
    groups = {}
    for i, g in enumerate(ids):
        groups.setdefault(g, []).append(i)
    for members in groups.values():
        vals = [rewards[i] for i in members]
        n = len(vals)
        for i in members:
            if name == "grpo":
                mu, sd = (0.0, 1.0) if n == 1 else (statistics.mean(vals), statistics.stdev(vals))
                out[i] = (rewards[i] - mu) / (sd + eps)
            elif name == "dr_grpo":
                out[i] = rewards[i] - (0.0 if n == 1 else statistics.mean(vals))
            elif name == "rloo":
                out[i] = rewards[i] - (0.0 if n == 1 else (sum(vals) - rewards[i]) / (n - 1))
            elif name == "reinforce_pp":
                out[i] = rewards[i] - (0.0 if n == 1 else statistics.mean(vals))
    if name == "reinforce_pp":
        mu = statistics.mean(out)
        var = statistics.variance(out) if len(out) > 1 else 0.0
        out = [(x - mu) / (var + 1e-8) ** 0.5 for x in out]
    return out


@settings(max_examples=60, deadline=None)
@given(
    rewards=st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=24),
    data=st.data(),
    name=st.sampled_from(["grpo", "dr_grpo", "rloo", "reinforce_pp"]),
)
def test_matches_per_group_loop_for_any_grouping(rewards, data, name):
    ids = data.draw(st.lists(st.integers(-3, 1000), min_size=len(rewards), max_size=len(rewards)))
    got = adv(name, rewards, ids)
    close(got, _reference(name, rewards, ids), 1e-6 if name != "reinforce_pp" else 1e-5)
    # permutation equivariance: shuffling rows shuffles the advantages
    perm = data.draw(st.permutations(range(len(rewards))))
    got_p = adv(name, [rewards[i] for i in perm], [ids[i] for i in perm])
    close(got_p, got[list(perm)], 1e-9)


def test_rloo_closed_form():
    r = [1.0, 0.0, 0.0, 0.5, 3.0, -1.0, 2.0]
    ids = [9, 9, 9, 9, 4, 4, 8]
    a = adv("rloo", r, ids)
    # group 9: n = 4, mean 0.375 → A = 4/3·(R − 0.375)
    close(a[:4], [4 / 3 * (x - 0.375) for x in r[:4]], 1e-12)
    close(a[4:6], [4.0, -4.0], 1e-12)  # n = 2: A = R_i − R_other
    close(a[6:], [2.0], 1e-12)  # singleton: baseline 0
    close(a[:4].sum(), 0.0, 1e-12)


def test_reinforce_pp_whitening():
    torch.manual_seed(0)
    r = torch.rand(40, dtype=torch.float64)
    ids = torch.arange(40) % 7
    a = get_advantage("reinforce_pp")(r, ids)
    close(a.mean(), 0.0, 1e-12)
    close(a.std(), 1.0, 1e-6)
    # group baseline first: adding a per-group constant changes nothing
    shifted = r + (ids.double() * 10)
    close(get_advantage("reinforce_pp")(shifted, ids), a, 1e-9)
    assert adv("reinforce_pp", [3.0], [0]).item() == 0.0


def test_input_errors():
    with pytest.raises(ValueError, match=r"rewards\[1\] = nan is not finite"):
        adv("grpo", [1.0, float("nan")], [0, 0])
    with pytest.raises(ValueError, match=r"group_ids must have shape \(2,\)"):
        adv("grpo", [1.0, 0.0], [0, 0, 1])
    with pytest.raises(TypeError, match="group_ids must be an integer tensor"):
        get_advantage("grpo")(torch.ones(2), torch.zeros(2))
    with pytest.raises(ValueError, match=r"rewards must have shape \(B,\)"):
        get_advantage("grpo")(torch.ones(2, 2), torch.zeros(2, dtype=torch.long))


def test_integer_rewards_and_float32():
    a = get_advantage("grpo")(torch.tensor([1, 0, 0, 1]), torch.zeros(4, dtype=torch.long))
    assert a.dtype == torch.get_default_dtype()
    a32 = get_advantage("rloo")(torch.tensor([1.0, 0.0], dtype=torch.float32), torch.tensor([0, 0]))
    assert a32.dtype == torch.float32 and a32.tolist() == [1.0, -1.0]
    assert not get_advantage("grpo")(
        torch.ones(3, requires_grad=True), torch.zeros(3, dtype=torch.long)
    ).requires_grad


# ---------------------------------------------------------------- DuCA / HIAN


def test_hian_reference_example():
    # proposed HIAN design, option (a) pool, unbiased std, ε = 1e-6
    spans = [[(0, 2), (3, 5)], [(0, 1), (1, 2), (4, 6)]]
    turns = [torch.tensor([0.8, 0.6]), torch.tensor([0.4, 0.9, 0.5])]
    a = hian_advantages(torch.tensor([1.0, 0.0]), torch.tensor([3, 3]), turns, spans, 7)
    assert a.shape == (2, 7)
    s1, s2 = [1.4787, 0.5142], [-1.8645, 0.5467, -1.3822]
    expect = torch.tensor(
        [[s1[0], s1[0], 0, s1[1], s1[1], 0, 0], [s2[0], s2[1], 0, 0, s2[2], s2[2], 0]], dtype=torch.float32
    )
    close(a, expect, 1e-4)
    assert (a[expect == 0] == 0).all()  # outside every span: exactly 0
    # the separately normalised parts: w_turn = 0 leaves A^sess = ±0.7071, w_sess = 0 leaves A^turn
    only_sess = hian_advantages(torch.tensor([1.0, 0.0]), torch.tensor([3, 3]), turns, spans, 7, w_turn=0.0)
    close(only_sess[:, 0], [0.7071, -0.7071], 1e-4)
    only_turn = hian_advantages(torch.tensor([1.0, 0.0]), torch.tensor([3, 3]), turns, spans, 7, w_sess=0.0)
    close(only_turn[0, [0, 3]], [0.7716, -0.1929], 1e-4)
    close(only_turn[1, [0, 1, 4]], [-1.1574, 1.2538, -0.6751], 1e-4)


def test_hian_turn_index_grouping_and_groups():
    # two scenarios (ids 5 and 2, interleaved); turn_index: turn k is compared with turn k of the group
    sess = torch.tensor([1.0, 0.0, 2.0, 4.0])
    ids = torch.tensor([5, 2, 5, 2])
    turns = [
        torch.tensor([1.0, 10.0]),
        torch.tensor([3.0]),
        torch.tensor([2.0, 30.0, 7.0]),
        torch.tensor([5.0]),
    ]
    spans = [[(0, 1), (1, 2)], [(2, 4)], [(0, 1), (1, 2), (2, 3)], [(0, 1)]]
    a = hian_advantages(sess, ids, turns, spans, 4, turn_grouping="turn_index", w_sess=0.0)
    z = 2**-0.5  # two-member group: ±(d/2)/(|d|/√2) = ±1/√2 (ε negligible)
    close(a[0, :2], [-z, -z], 1e-5)  # turn 0: 1 vs 2; turn 1: 10 vs 30
    close(a[2, :3], [z, z, 0.0], 1e-5)  # turn 2 has no peer in its group → 0
    close(a[1, 2:4], [-z, -z], 1e-5)
    close(a[3, :1], [z], 1e-5)
    # pool (default): group 5 pools [1, 10, 2, 30, 7]
    pool = torch.tensor([1.0, 10, 2, 30, 7], dtype=torch.float64)
    zp = (pool - pool.mean()) / (pool.std() + 1e-6)
    a = hian_advantages(sess, ids, turns, spans, 4, w_sess=0.0)
    close(a[0, :2], zp[:2], 1e-5)
    close(a[2, :3], zp[2:], 1e-5)
    # session part: group 5 = [1, 2], group 2 = [0, 4] → ±1/√2 each
    a = hian_advantages(sess, ids, turns, spans, 4, w_turn=0.0, w_sess=2.0)
    close(a[:, 0], [-2 * z, 0.0, 2 * z, 2 * z], 1e-5)  # session 1 has no token at t = 0
    close(a[1, 2], -2 * z, 1e-5)


def test_hian_vector_criteria_are_zscored_separately():
    turns = [torch.tensor([[0.8, 100.0], [0.6, 300.0]]), torch.tensor([[0.4, 200.0]])]
    spans = [[(0, 1), (1, 2)], [(0, 1)]]
    a = hian_advantages(torch.tensor([0.0, 0.0]), torch.tensor([0, 0]), turns, spans, 2, w_sess=0.0)
    c1 = torch.tensor([0.8, 0.6, 0.4], dtype=torch.float64)
    c2 = torch.tensor([100.0, 300.0, 200.0], dtype=torch.float64)
    zsum = (c1 - c1.mean()) / (c1.std() + 1e-6) + (c2 - c2.mean()) / (c2.std() + 1e-6)
    close(a[0], zsum[:2], 1e-5)
    close(a[1, 0], zsum[2], 1e-5)


def test_hian_empty_session_next_to_vector_criteria():
    turns = [torch.zeros(0), torch.tensor([[1.0, 2.0], [3.0, 5.0]])]
    spans = [[], [(0, 1), (1, 2)]]
    a = hian_advantages(
        torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), turns, spans, 2, turn_norm="per_criterion"
    )
    close(a[0], [0.0, 0.0], 0)
    z = 2**-0.5  # two turns: each criterion z-scores to ±1/√2 (ε negligible); session part −1/√2
    close(a[1], [-2 * z - z, 2 * z - z], 1e-5)
    # fused (default): the sum ±√2 is z-scored again to ±1/√2
    a = hian_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), turns, spans, 2)
    close(a[0], [0.0, 0.0], 0)
    close(a[1], [-z - z, z - z], 1e-5)


def test_hian_empty_sessions_and_spans():
    a = hian_advantages(
        torch.tensor([1.0, 0.0]),
        torch.tensor([0, 0]),
        [torch.tensor([]), torch.tensor([0.5])],
        [[], [(2, 2)]],
        3,
    )
    assert torch.equal(a, torch.zeros(2, 3))


@pytest.mark.parametrize(
    ("turns", "spans", "msg"),
    [
        ([torch.tensor([1.0])], [[(0, 1)]], "expected 2 entries"),
        (
            [torch.tensor([1.0]), torch.tensor([1.0, 2.0])],
            [[(0, 1)], [(0, 1)]],
            "session 1 has 2 turn rewards but 1",
        ),
        (
            [torch.tensor([1.0]), torch.tensor([1.0])],
            [[(0, 1)], [(3, 9)]],
            r"turn_spans\[1\]\[0\] = \(3, 9\)",
        ),
        ([torch.tensor([1.0]), torch.tensor([1.0])], [[(0, 1)], [(2, 1)]], "start <= end"),
        (
            [torch.tensor([1.0, 2.0]), torch.tensor([1.0])],
            [[(0, 3), (2, 4)], [(0, 1)]],
            r"turn_spans\[0\] has overlapping",
        ),
        ([torch.tensor([1.0]), torch.tensor([[1.0, 2.0]])], [[(0, 1)], [(0, 1)]], "criteria"),
        ([torch.tensor([float("inf")]), torch.tensor([1.0])], [[(0, 1)], [(0, 1)]], "non-finite"),
        ([torch.tensor([1.0]), torch.tensor([1.0])], [[(0.0, 1)], [(0, 1)]], "expected two ints"),
    ],
)
def test_hian_errors(turns, spans, msg):
    with pytest.raises(ValueError, match=msg):
        hian_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), turns, spans, 5)


def test_hian_bad_grouping():
    with pytest.raises(ValueError, match="turn_grouping must be 'pool' or 'turn_index'"):
        hian_advantages(
            torch.tensor([1.0]), torch.tensor([0]), [torch.tensor([1.0])], [[(0, 1)]], 2, turn_grouping="x"
        )
