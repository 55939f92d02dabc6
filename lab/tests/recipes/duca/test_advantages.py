"""DuCA/HIAN dual-horizon advantages (proposed design): closed-form values, grouping, errors, the fused
turn term's unit scale, invariance to the session rewards' scale, and which groups are zero-variance."""

from __future__ import annotations

import pytest
import torch

from posttrain.algos import get_advantage, list_advantages
from posttrain_lab.recipes.duca.advantages import hian_advantages, hian_zero_variance_groups


def close(x, y, tol=1e-4):
    torch.testing.assert_close(
        torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64), rtol=0, atol=tol
    )


def test_duca_is_registered_by_the_lab_entry_point():
    assert "duca" in list_advantages()
    assert get_advantage("duca").name == "duca"


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


# ---------------------------------------------------------------- turn-term scale, zero variance
def _batch(seed: int, sessions: int = 4, turns: int = 5, crit: int = 4):
    g = torch.Generator().manual_seed(seed)
    session = torch.randint(0, 2, (sessions,), generator=g).float()
    # each criterion violated (-1) on ~30 % of turns, independently: several criteria vary
    turn = [-(torch.rand(turns, crit, generator=g) < 0.3).float() for _ in range(sessions)]
    spans = [[(k, k + 1) for k in range(turns)] for _ in range(sessions)]
    return session, turn, spans


def test_fused_turn_term_has_unit_variance_however_many_criteria_vary():
    """Per-criterion z-scores SUMMED gave the turn term std 1.67 against the session term's 0.57 on a
    4-session x 5-turn batch (measured), so the turn horizon outweighed the session one. The default
    re-normalises the sum; `turn_norm="per_criterion"` keeps the plain sum."""
    for seed in range(5):
        _, turn, spans = _batch(seed)
        gids = torch.zeros(4, dtype=torch.long)
        a_turn = hian_advantages(torch.zeros(4), gids, turn, spans, 5, w_sess=0.0)  # turn term alone
        old = hian_advantages(torch.zeros(4), gids, turn, spans, 5, w_sess=0.0, turn_norm="per_criterion")
        assert float(a_turn.flatten().std()) == pytest.approx(1.0, abs=1e-4)
        assert float(a_turn.flatten().mean()) == pytest.approx(0.0, abs=1e-5)
        assert float(old.flatten().std()) > 1.3  # the sum of ~4 unit-variance terms
    mean = hian_advantages(torch.zeros(4), gids, turn, spans, 5, w_sess=0.0, turn_norm="mean")
    torch.testing.assert_close(mean, old / 4)
    with pytest.raises(ValueError, match="turn_norm"):
        hian_advantages(torch.zeros(4), gids, turn, spans, 5, turn_norm="zscore")


def test_hian_is_invariant_to_the_session_rewards_scale():
    session, turn, spans = _batch(3)
    gids = torch.zeros(4, dtype=torch.long)
    a1 = hian_advantages(session, gids, turn, spans, 5)
    a10 = hian_advantages(10 * session, gids, turn, spans, 5)
    torch.testing.assert_close(a1, a10, atol=1e-5, rtol=0)


def test_zero_variance_counts_what_hian_normalises():
    """Equal session rewards but a varying turn criterion: HIAN still has a signal (not zero-variance);
    a group where nothing varies, or a single session, is."""
    gids = torch.tensor([0, 0, 1, 1, 2])
    session = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0])
    turns = torch.zeros(5, 3, 2)
    turns[0, 1, 0] = -1.0  # group 0: one violation
    turns[3, 2, 1] = -1.0  # group 1: beyond session 3's last turn: ignored
    num = torch.tensor([3, 3, 2, 2, 3])
    got = hian_zero_variance_groups(session, gids, turns, num)
    assert got.tolist() == [False, True, True]
    session[2] = 1.0
    assert hian_zero_variance_groups(session, gids, turns, num).tolist() == [False, False, True]
