"""KL estimators: reference table values and gradients, aliases, straight-through, clamps, gradcheck."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.algos import agg_loss, kl_clamped, kl_penalty, list_kl_estimators

F64 = torch.float64
LOGP = [-1.0, -2.0]
REF = [-1.2, -1.0]
# reference values: k1, abs, k2, k3, ∂k3/∂logp, ∂k2/∂logp
TABLE = {
    "k1": ([0.2, -1.0], [1.0, 1.0]),
    "abs": ([0.2, 1.0], [1.0, -1.0]),
    "k2": ([0.02, 0.5], [0.2, -1.0]),
    "k3": ([0.01873, 0.71828], [0.1813, -1.7183]),
    "k3+": ([0.01873, 0.71828], [0.2, -1.0]),
}
ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3", "low_var_kl+": "k3+"}


def value_and_grad(kind, logp=LOGP, ref=REF):
    x = torch.tensor(logp, dtype=F64, requires_grad=True)
    v = kl_penalty(x, torch.tensor(ref, dtype=F64), kind)
    (g,) = torch.autograd.grad(v.sum(), x)
    return v.detach(), g


def test_names():
    assert list_kl_estimators() == ["abs", "k1", "k2", "k3"]
    assert sorted(list_kl_estimators(include_aliases=True)) == [
        "abs",
        "k1",
        "k2",
        "k3",
        "kl",
        "low_var_kl",
        "mse",
    ]


@pytest.mark.parametrize("kind", [*TABLE, *ALIASES])
def test_spec_table(kind):
    value, grad = TABLE[ALIASES.get(kind, kind)]
    v, g = value_and_grad(kind)
    torch.testing.assert_close(v, torch.tensor(value, dtype=F64), rtol=0, atol=1e-5)
    torch.testing.assert_close(g, torch.tensor(grad, dtype=F64), rtol=0, atol=1e-4)


def test_k3_gradient_is_one_minus_ratio_and_gradcheck():
    torch.manual_seed(0)
    logp = (-torch.rand(6, dtype=F64) * 3).requires_grad_(True)
    ref = -torch.rand(6, dtype=F64) * 3
    (g,) = torch.autograd.grad(kl_penalty(logp, ref, "k3").sum(), logp)
    torch.testing.assert_close(g, 1 - torch.exp(ref - logp.detach()))
    for kind in ("k1", "k2", "k3", "abs"):
        assert torch.autograd.gradcheck(lambda x, k=kind: kl_penalty(x, ref, k), (logp,), eps=1e-6, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    d=st.lists(st.floats(-6, 6, allow_nan=False).filter(lambda v: abs(v) > 1e-3), min_size=1, max_size=8),
    base=st.sampled_from(["k1", "abs", "k2", "k3"]),
)
def test_straight_through_value_of_base_gradient_of_k2(d, base):
    ref = torch.zeros(len(d), dtype=F64) - 1.0
    x = (ref + torch.tensor(d, dtype=F64)).requires_grad_(True)
    st_val = kl_penalty(x, ref, base + "+")
    (g,) = torch.autograd.grad(st_val.sum(), x)
    torch.testing.assert_close(st_val.detach(), kl_penalty(x.detach(), ref, base), rtol=0, atol=1e-12)
    torch.testing.assert_close(g, torch.tensor(d, dtype=F64), rtol=0, atol=1e-12)
    # k3 is non-negative and k3 ≥ 0 with equality only at d = 0; k2 ≥ 0
    assert (kl_penalty(x.detach(), ref, "k3") >= 0).all()


def test_k3_clamps_and_their_mask():
    logp = torch.tensor([-1.0, -1.0, -40.0, -1.0], dtype=F64, requires_grad=True)
    ref = torch.tensor([-1.0, 2.0, -1.0, -3.0], dtype=F64)
    v = kl_penalty(logp, ref, "k3")
    (g,) = torch.autograd.grad(v.sum(), logp)
    # d = 0: 0; ref−logp = 3: e^3 − 4 = 16.09 → clamped to 10, zero gradient; ref−logp = 39 → clamps; −2: e^−2+1
    torch.testing.assert_close(v.detach(), torch.tensor([0.0, 10.0, 10.0, math.exp(-2) + 1], dtype=F64))
    assert g[1] == 0 and g[2] == 0 and g[0] == 0
    assert kl_clamped(logp, ref).tolist() == [False, True, True, False]


def test_combines_with_agg_and_errors():
    logp = torch.tensor([[-1.0, -2.0, -9.0]], dtype=F64)
    ref = torch.tensor([[-1.2, -1.0, 50.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0]])
    out = agg_loss(kl_penalty(logp, ref, "low_var_kl"), mask, "token-mean")
    assert out.item() == pytest.approx((0.018730753 + 0.718281828) / 2, abs=1e-8)
    with pytest.raises(KeyError, match=r"unknown KL estimator 'k4'.*Known: abs, k1"):
        kl_penalty(logp, ref, "k4")
    with pytest.raises(KeyError, match="unknown KL estimator"):
        kl_penalty(logp, ref, "+")
    with pytest.raises(ValueError, match="does not match"):
        kl_penalty(logp, ref[:, :2], "k1")
