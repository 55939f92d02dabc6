"""Advantage estimators: reference table (verl GRPO semantics), groups of any size/order, RLOO,
REINFORCE++ (and its token-level whitening against verl's)."""

from __future__ import annotations

import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.algos import advantage_defaults, get_advantage, list_advantages


def adv(name, rewards, ids, **kw):
    return get_advantage(name)(torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids), **kw)


def close(x, y, tol=1e-4):
    torch.testing.assert_close(
        torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64), rtol=0, atol=tol
    )


def test_registry():
    # the library's own estimators (installed packages may add more by entry point, e.g. the lab's duca)
    assert {"dr_grpo", "grpo", "reinforce_plus_plus", "reinforce_pp", "rloo"} <= set(list_advantages())
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


# ---------------------------------------------------------------- REINFORCE++ against verl
def _verl_masked_whiten(values, mask):
    """verl ``verl/utils/torch_functional.py::masked_whiten`` (unbiased masked variance)."""
    mean = (values * mask).sum() / mask.sum()
    centered = values - mean
    var = (centered**2 * mask).sum() / mask.sum()
    var = var * mask.sum() / (mask.sum() - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8)


def _verl_rpp_baseline(scores, index, mask):
    """verl ``compute_reinforce_plus_plus_baseline_outcome_advantage`` (outcome score per sequence)."""
    s = scores.clone()
    for g in index.unique():
        rows = index == g
        if rows.sum() > 1:
            s[rows] = scores[rows] - scores[rows].mean()
    tok = s[:, None] * mask
    return _verl_masked_whiten(tok, mask) * mask


def _verl_rpp(scores, mask):
    """verl ``compute_reinforce_plus_plus_outcome_advantage`` with γ = 1: every token's return is R."""
    returns = scores[:, None] * mask
    return _verl_masked_whiten(returns, mask) * mask


@pytest.mark.parametrize("lengths", [[7] * 8, [1, 3, 7, 2, 5, 7, 4, 6]])
def test_reinforce_pp_matches_verl_token_level_whitening(lengths):
    """8 sequences x 7 tokens: whitening over sequences instead of tokens gives 0.944x verl's advantage;
    with ``token_counts`` each sequence weighs as many tokens as it has."""
    g = torch.Generator().manual_seed(0)
    r = torch.rand(8, generator=g, dtype=torch.float64)
    gids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 3])
    n = torch.tensor(lengths)
    mask = (torch.arange(7)[None, :] < n[:, None]).double()
    got = get_advantage("reinforce_pp")(r, gids, token_counts=n)
    torch.testing.assert_close(got[:, None] * mask, _verl_rpp_baseline(r, gids, mask))
    got_plain = get_advantage("reinforce_plus_plus")(r, gids, token_counts=n)
    torch.testing.assert_close(got_plain[:, None] * mask, _verl_rpp(r, mask))
