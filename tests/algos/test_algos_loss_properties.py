"""Policy losses: float64 gradcheck (directly, or against the paper's potential) for every registered
loss, so a new loss without a gradcheck case fails here; padding-poison and micro-batch invariance
(hypothesis)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.algos import get_policy_loss, list_agg_modes, list_policy_losses

F64 = torch.float64
LOSSES = list_policy_losses()
PROP = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# r values per advantage sign chosen to cover every region of every loss, away from region boundaries
# (ε = 0.2, c = 3): A>0: 0.5 (unclipped low), 1.1 (inside), 1.5 (HP / clipped), 4.0 (far HP)
#                   A<0: 0.5 (LN / clipped), 0.9 (inside), 2.0 (unclipped high), 5.0 (dual-clip)
R_POS = [0.5, 1.1, 1.5, 4.0]
R_NEG = [0.5, 0.9, 2.0, 5.0]


def region_batch():
    """(logp, old_logp, adv (B,T), mask): rows A=+1.3, A=−0.7, mixed per-token A, π_old varied; the last
    token of row 2 is padding holding garbage."""
    r = torch.tensor([R_POS, R_NEG, [1.1, 0.5, 2.0, 7.0]], dtype=F64)
    pi_old = torch.tensor([[0.9, 0.5, 0.3, 0.01], [0.9, 0.2, 0.1, 1e-4], [0.6, 0.4, 0.05, 0.7]], dtype=F64)
    adv = torch.tensor([[1.3] * 4, [-0.7] * 4, [0.4, -2.0, -1.0, 55.0]], dtype=F64)
    old = pi_old.log()
    logp = old + r.log()
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[2, 3] = False
    logp[2, 3] = 123.0
    old[2, 3] = -1e6
    return logp, old, adv, mask


def straight_through(potential, loss):
    """Value of `potential`, gradient of `loss` (both functions of x): gradcheck then compares the
    loss's autograd gradient with finite differences of the potential."""
    return potential.detach() + (loss - loss.detach())


# ---- the papers' per-token potentials φ(x), x = logp − old_logp, with ∂φ/∂x = −A·g


def phi_cispo(x, a, lo=10.0, hi=0.2):
    r = x.exp()
    g_int = torch.where(r < 1 - lo, (1 - lo) * x, torch.where(r > 1 + hi, (1 + hi) * x, r))
    return -a * g_int


def phi_dgpo(x, a, n=1, m=2, lo=0.2, hi=0.2):
    r = x.exp()
    ln = (a < 0) & (r < 1 - lo)
    hp = (a > 0) & (r > 1 + hi)
    p_ln = torch.exp((n + 1) * x) / ((n + 1) * (1 - lo) ** n)
    p_hp = (1 + hi) * x if m == 1 else (1 + hi) ** (1 / m) * torch.exp((1 - 1 / m) * x) / (1 - 1 / m)
    return -a * torch.where(ln, p_ln, torch.where(hp, p_hp, r))


def phi_maspo(x, a, old):
    r = x.exp()
    mass = torch.clamp(torch.exp(-0.3 * old), 1.0, 10.0)
    risk = torch.where(a > 0, 1 + 0.03 * a.clamp(min=0), 1 / (1 - 0.03 * a.clamp(max=0)))
    sigma = mass * risk.clamp(0.1, 10.0)
    gated = ((a > 0) & (r > 1)) | ((a < 0) & (r < 1))
    # ∫ exp(−(r−1)²/2σ²) dr — the Gaussian gate integrated over r (dr = r·dx)
    p_gate = sigma * math.sqrt(math.pi / 2) * torch.erf((r - 1) / (sigma * math.sqrt(2)))
    return -a * torch.where(gated, p_gate, r)


def gspo_batch():
    """Sequences on each side of GSPO's narrow sequence clip (A<0 ∧ s>1; A>0 ∧ s<1; inside), one padded."""
    lr = torch.tensor([[0.1, 0.05, 0.15, 0.1], [-0.3, -0.1, 0.0, 0.0], [1e-5, -1e-5, 2e-5, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    old = torch.full_like(lr, -1.5)
    adv = torch.tensor([-1.0, 2.0, 0.5], dtype=F64)
    return old + lr, old, adv, mask


class Case(NamedTuple):
    """A gradcheck of registered loss `loss`: `fn(logp, old, adv, mask)` on the batch `batch()`."""

    loss: str
    fn: Callable[..., torch.Tensor]
    batch: Callable[[], tuple[torch.Tensor, ...]] = region_batch
    eps: float = 1e-6


def _direct(name, agg="token-sum", **params):
    def f(logp, old, adv, mask):
        return get_policy_loss(name)(logp, old, adv, mask, agg=agg, **params)[0]

    return Case(name, f)


def _potential(name, phi, **params):
    def f(logp, old, adv, mask):
        loss = get_policy_loss(name)(logp, old, adv, mask, agg="token-sum", **params)[0]
        x = torch.where(mask, logp - old, torch.zeros_like(logp))
        pot = torch.where(mask, phi(x, adv, old), torch.zeros_like(logp)).sum()
        return straight_through(pot, loss)

    return Case(name, f)


#: case id -> Case. Every registered loss needs at least one (the gate below).
GRADCHECK_CASES = {
    "ppo": _direct("ppo"),
    "ppo-no-dual": _direct("ppo", clip_c=None),
    "dapo": _direct("dapo"),
    "sapo": _direct("sapo"),
    "gspo": Case("gspo", _direct("gspo", agg=None).fn, gspo_batch, 1e-7),  # seq-mean-token-mean
    "cispo": _potential("cispo", lambda x, a, old: phi_cispo(x, a)),
    "cispo-lo0.2": _potential("cispo", lambda x, a, old: phi_cispo(x, a, lo=0.2), clip_low=0.2),
    "dgpo": _potential("dgpo", lambda x, a, old: phi_dgpo(x, a)),
    "dgpo-n2m3": _potential("dgpo", lambda x, a, old: phi_dgpo(x, a, n=2, m=3), dgpo_n=2, dgpo_m=3),
    "dgpo-m1": _potential("dgpo", lambda x, a, old: phi_dgpo(x, a, m=1), dgpo_m=1),
    "maspo": _potential("maspo", phi_maspo),
}


def _gradcheck_cases(name: str) -> list[str]:
    cases = [k for k, c in GRADCHECK_CASES.items() if c.loss == name]
    if not cases:
        pytest.fail(
            f"policy loss {name!r} is registered but has no float64 gradcheck: add a Case to "
            "GRADCHECK_CASES in tests/algos/test_algos_loss_properties.py (directly, or against its potential)"
        )
    return cases


def _gradcheck(c: Case) -> bool:
    logp, old, adv, mask = c.batch()
    x = logp.clone().requires_grad_(True)
    return torch.autograd.gradcheck(
        lambda lp: c.fn(lp, old, adv, mask), (x,), eps=c.eps, atol=1e-6, rtol=1e-5, raise_exception=False
    )


@pytest.mark.parametrize("name", LOSSES)
def test_gradcheck_float64_every_region(name):
    failed = [case for case in _gradcheck_cases(name) if not _gradcheck(GRADCHECK_CASES[case])]
    assert not failed, f"gradcheck fails for {failed}"


def test_a_loss_registered_without_a_gradcheck_fails_the_gate():
    """A newly registered loss joins `list_policy_losses()` (the gate's parameters at collection);
    without a Case the gate fails for it. The root conftest restores the registry afterwards."""
    from posttrain.algos import Terms, register_policy_loss

    def core(batch) -> Terms:
        ratio = torch.exp(batch.log_ratio)
        none = torch.zeros_like(batch.valid)
        return Terms(-batch.adv * ratio, ratio.detach(), ratio.detach(), none, none)

    register_policy_loss("test-unchecked", validate=lambda name, params: None)(core)
    assert "test-unchecked" in list_policy_losses()
    with pytest.raises(pytest.fail.Exception, match="'test-unchecked' is registered but has no float64"):
        test_gradcheck_float64_every_region("test-unchecked")


def test_gradcheck_cases_name_only_registered_losses():
    assert {c.loss for c in GRADCHECK_CASES.values()} <= set(LOSSES)


def test_potential_gradcheck_detects_a_wrong_gradient():
    """Guard: the straight-through construction must FAIL when the gradient is not the potential's."""
    logp, old, adv, mask = region_batch()
    x = logp.clone().requires_grad_(True)

    def wrong(lp):  # ppo's gradient (0 in the boundary regions) against DGPO's potential
        loss = get_policy_loss("ppo")(lp, old, adv, mask, agg="token-sum")[0]
        pot = torch.where(mask, phi_dgpo(lp - old, adv), torch.zeros_like(lp)).sum()
        return straight_through(pot, loss)

    assert not torch.autograd.gradcheck(wrong, (x,), eps=1e-6, atol=1e-6, raise_exception=False)


def test_gspo_sequence_objective_gradient_closed_form():
    """GSPO's loss value under seq-mean-token-mean is Σ_i max(−A s_i, −A clip(s_i))/S, whose true
    gradient (gradcheck: the gate above) is what autograd gives through the sg-trick
    (∂/∂logp_t = −A·s_i/(|y_i|·S))."""
    logp, old, adv, mask = gspo_batch()
    x = logp.clone().requires_grad_(True)
    fn = get_policy_loss("gspo")
    # all three sequences are on an unclipped side (A<0 ∧ s>1; A>0 ∧ s<1; inside), so
    # ∂/∂logp_t = −A_i·s_i/(|y_i|·S) on valid tokens, with S = 3 sequences
    (g,) = torch.autograd.grad(fn(x, old, adv, mask)[0], x)
    s = torch.exp(torch.tensor([0.1, -0.2, 1e-5 / 2], dtype=F64))
    n = torch.tensor([4.0, 2.0, 4.0], dtype=F64)
    expect = torch.where(mask, (-adv * s / (n * 3)).unsqueeze(-1), torch.zeros_like(g))
    torch.testing.assert_close(g, expect, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- hypothesis: padding poison


def _random_batch(seed, b, t, dtype, token_adv):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=gen, dtype=F64) * 4 - 0.01
    logp = (old + 0.5 * torch.randn(b, t, generator=gen, dtype=F64)).clamp(max=-1e-4)
    adv = torch.randn((b, t) if token_adv else (b,), generator=gen, dtype=F64)
    mask = torch.rand(b, t, generator=gen) < 0.7
    isw = torch.rand(b, t, generator=gen, dtype=F64) + 0.5
    return logp.to(dtype), old.to(dtype), adv.to(dtype), mask, isw.to(dtype), gen


@PROP
@given(
    seed=st.integers(0, 10_000),
    b=st.integers(1, 4),
    t=st.integers(1, 6),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    token_adv=st.booleans(),
    garbage=st.sampled_from([1e30, -1e30, 1e6, -3e4]),
    name=st.sampled_from(LOSSES),
    agg=st.sampled_from(list_agg_modes()),
)
def test_padding_poison_does_not_change_loss_or_gradient(seed, b, t, dtype, token_adv, garbage, name, agg):
    logp, old, adv, mask, isw, gen = _random_batch(seed, b, t, dtype, token_adv)
    pad = ~mask
    noise = torch.rand(b, t, generator=gen, dtype=F64).to(dtype)

    def poison(x, scale):
        return torch.where(pad, scale * (noise + 0.5), x)

    p_logp, p_old, p_isw = poison(logp, garbage), poison(old, -garbage), poison(isw, garbage)
    p_adv = poison(adv, garbage) if token_adv else adv.clone()
    if not token_adv:  # fully padded rows: their (B,) advantage is garbage too
        p_adv = torch.where(mask.any(-1), p_adv, torch.full_like(p_adv, garbage))
    fn = get_policy_loss(name)
    results = []
    for lp, o, a, w in ((logp, old, adv, isw), (p_logp, p_old, p_adv, p_isw)):
        x = lp.clone().requires_grad_(True)
        loss, metrics = fn(x, o, a, mask, agg=agg, is_weights=w)
        (g,) = torch.autograd.grad(loss, x)
        results.append((loss.detach(), g, metrics))
    (l0, g0, m0), (l1, g1, m1) = results
    assert torch.isfinite(l1) and torch.isfinite(g1).all()
    assert torch.equal(l0, l1)
    assert torch.equal(g0, g1)
    assert (g1[pad] == 0).all()
    for k in m0:
        assert torch.equal(m0[k], m1[k]), k


# ---------------------------------------------------------------- hypothesis: micro-batch invariance


@PROP
@given(
    seed=st.integers(0, 10_000),
    b=st.integers(2, 7),
    t=st.integers(1, 5),
    n_chunks=st.integers(2, 4),
    name=st.sampled_from(LOSSES),
    # token-mean-micro (the DGPO/MASPO authors' per-micro-batch mean) is not invariant by design
    agg=st.sampled_from([m for m in list_agg_modes() if m != "token-mean-micro"]),
    fixed_scale=st.sampled_from([None, 7.0]),
    data=st.data(),
)
def test_micro_batches_sum_to_the_full_batch(seed, b, t, n_chunks, name, agg, fixed_scale, data):
    logp, old, adv, mask, isw, _ = _random_batch(seed, b, t, F64, token_adv=False)
    mask[0, 0] = True  # at least one valid token
    perm = data.draw(st.permutations(range(b)))
    cuts = sorted(data.draw(st.lists(st.integers(1, b - 1), min_size=n_chunks - 1, max_size=n_chunks - 1)))
    bounds = [0, *cuts, b]
    chunks = [list(perm[lo:hi]) for lo, hi in itertools.pairwise(bounds) if hi > lo]
    n_tok = int(mask.sum())
    n_seq = int(mask.any(-1).sum())
    kw = {"agg": agg, "global_tokens": n_tok, "global_seqs": n_seq, "scale": fixed_scale}
    fn = get_policy_loss(name)

    x = logp.clone().requires_grad_(True)
    full, _ = fn(x, old, adv, mask, is_weights=isw, **kw)
    (g_full,) = torch.autograd.grad(full, x)

    y = logp.clone().requires_grad_(True)
    total = torch.zeros((), dtype=F64)
    for idx in chunks:
        i = torch.tensor(idx)
        part, _ = fn(y[i], old[i], adv[i], mask[i], is_weights=isw[i], **kw)
        total = total + part
    (g_micro,) = torch.autograd.grad(total, y)
    torch.testing.assert_close(total, full.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_micro, g_full, rtol=1e-12, atol=1e-12)
