"""Preference losses: hand-derived closed-form values and gradients, a float64 gradcheck, and a
registry-driven gate (a loss registered without closed-form rows or a gradcheck case fails here);
micro-batch invariance, input and parameter errors. Equality with TRL: test_algos_preference_trl.py."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.algos import (
    PreferenceInputs,
    Sides,
    get_preference_loss,
    list_preference_losses,
    preference_loss_defaults,
    register_preference_loss,
)
from posttrain.utils.errors import PosttrainError

F64 = torch.float64
BUILTIN = {"dpo", "ipo", "simpo", "orpo", "kto"}


def sig(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def logsig(z: float) -> float:
    return -math.log1p(math.exp(-z))


# One pair per row: (params, (l_w, l_l, n_w, n_l, r_w, r_l, kl, ref_kl), loss, ∂ℓ/∂l_w, ∂ℓ/∂l_l), each
# expected value derived by hand from the paper's formula (the docstrings) and evaluated with `math`.
Row = tuple[dict, tuple[float, ...], float, float, float]


def dpo_row(lw, ll, rw, rl, beta=0.1, eps=0.0) -> Row:
    z = beta * ((lw - rw) - (ll - rl))
    loss = -(1 - eps) * logsig(z) - eps * logsig(-z)
    d = beta * (-(1 - eps) * sig(-z) + eps * sig(z))
    return ({"beta": beta, "label_smoothing": eps}, (lw, ll, 1, 1, rw, rl, 0, 0), loss, d, -d)


def ipo_row(lw, ll, nw, nl, rw, rl, beta=0.1) -> Row:
    u = (lw - rw) / nw - (ll - rl) / nl - 1 / (2 * beta)
    return ({"beta": beta}, (lw, ll, nw, nl, rw, rl, 0, 0), u * u, 2 * u / nw, -2 * u / nl)


def simpo_row(lw, ll, nw, nl, beta=2.0, gamma=1.0) -> Row:
    z = beta * lw / nw - beta * ll / nl - gamma
    s = sig(-z)
    return (
        {"beta": beta, "gamma": gamma},
        (lw, ll, nw, nl, 0, 0, 0, 0),
        -logsig(z),
        -s * beta / nw,
        s * beta / nl,
    )


def orpo_row(lw, ll, nw, nl, beta=0.1) -> Row:
    a, b = lw / nw, ll / nl
    lo = (a - b) - (math.log(1 - math.exp(a)) - math.log(1 - math.exp(b)))
    loss = -a - beta * logsig(lo)  # one pair: the chosen token-mean NLL is −l_w/n_w
    s = sig(-lo)
    dw = (-1 - beta * s / (1 - math.exp(a))) / nw
    dl = beta * s / (1 - math.exp(b)) / nl
    return ({"beta": beta}, (lw, ll, nw, nl, 0, 0, 0, 0), loss, dw, dl)


def kto_row(lw, ll, rw, rl, kl, ref_kl, beta=0.1, wd=1.0, wu=1.0) -> Row:
    z0 = max(0.0, kl - ref_kl)
    zw, zl = beta * ((lw - rw) - z0), beta * (z0 - (ll - rl))
    loss = (wd * (1 - sig(zw)) + wu * (1 - sig(zl))) / 2  # one desirable + one undesirable example
    dw = -wd * beta * sig(zw) * (1 - sig(zw)) / 2
    dl = wu * beta * sig(zl) * (1 - sig(zl)) / 2
    params = {"beta": beta, "desirable_weight": wd, "undesirable_weight": wu}
    return (params, (lw, ll, 1, 1, rw, rl, kl, ref_kl), loss, dw, dl)


#: name -> rows; literal rows first (values a reader checks by hand), then evaluated closed forms.
CLOSED_FORM: dict[str, list[Row]] = {
    "dpo": [
        ({}, (-5.0, -5.0, 1, 1, -5.0, -5.0, 0, 0), math.log(2), -0.05, 0.05),  # Δ = 0: log 2, ∓β/2
        dpo_row(-3.0, -6.0, -4.0, -4.0),
        dpo_row(-8.0, -2.0, -4.0, -3.0, beta=0.5),
        dpo_row(-3.0, -6.0, -4.0, -4.0, beta=0.3, eps=0.1),  # cDPO
        dpo_row(-9.0, -1.0, -4.0, -4.0, beta=1.0, eps=0.25),
    ],
    "ipo": [
        ({"beta": 0.5}, (-2.0, -2.0, 2, 2, -2.0, -2.0, 0, 0), 1.0, -1.0, 1.0),  # h = 0: (0 − 1)², ∓2/n
        ipo_row(-3.0, -6.0, 3, 2, -4.0, -4.0),
        ipo_row(-8.0, -2.0, 4, 1, -4.0, -3.0, beta=0.5),
    ],
    "simpo": [
        ({"beta": 2.0, "gamma": 0.0}, (-4.0, -2.0, 2, 1, 0, 0, 0, 0), math.log(2), -0.5, 1.0),  # z = 0
        simpo_row(-3.0, -6.0, 3, 2),
        simpo_row(-8.0, -2.0, 4, 1, beta=2.5, gamma=0.5),
    ],
    "orpo": [orpo_row(-3.0, -6.0, 3, 2), orpo_row(-0.2, -0.1, 2, 1, beta=0.5), orpo_row(-12.0, -2.0, 4, 4)],
    "kto": [
        ({}, (-5.0, -5.0, 1, 1, -5.0, -5.0, -1.0, -1.0), 0.5, -0.0125, 0.0125),  # all 0: 1−σ(0) = ½
        kto_row(-3.0, -6.0, -4.0, -4.0, -2.0, -2.5),  # z0 = 0.5
        kto_row(-3.0, -6.0, -4.0, -4.0, -2.5, -2.0),  # mean KL < 0: z0 clamped to 0
        kto_row(-8.0, -2.0, -4.0, -3.0, -1.0, -3.0, beta=0.5, wd=1.33, wu=0.7),
    ],
}


def inputs(vals: tuple[float, ...], *, grad: bool = False) -> PreferenceInputs:
    lw, ll, nw, nl, rw, rl, kl, rkl = (torch.tensor([v], dtype=F64) for v in vals)
    if grad:
        lw, ll = lw.requires_grad_(True), ll.requires_grad_(True)
    return PreferenceInputs(lw, ll, nw, nl, rw, rl, kl, rkl)


def _rows(name: str) -> list[Row]:
    if name not in CLOSED_FORM:
        pytest.fail(
            f"preference loss {name!r} is registered but has no closed-form reference values: add "
            "(params, inputs, ℓ, ∂ℓ/∂l_w, ∂ℓ/∂l_l) rows to CLOSED_FORM in tests/algos/test_algos_preference_losses.py"
        )
    return CLOSED_FORM[name]


def test_registry_names_and_aliases():
    assert set(list_preference_losses()) >= BUILTIN
    assert get_preference_loss("sigmoid") is get_preference_loss("dpo")
    assert {n for n in BUILTIN if get_preference_loss(n).needs_reference} == {"dpo", "ipo", "kto"}
    assert [n for n in BUILTIN if get_preference_loss(n).needs_kl] == ["kto"]


def test_defaults_are_the_papers():
    assert preference_loss_defaults("dpo") == {"beta": 0.1, "label_smoothing": 0.0}
    assert preference_loss_defaults("ipo") == {"beta": 0.1}
    assert preference_loss_defaults("simpo") == {"beta": 2.0, "gamma": 1.0}
    assert preference_loss_defaults("orpo") == {"beta": 0.1}
    assert preference_loss_defaults("kto") == {
        "beta": 0.1,
        "desirable_weight": 1.0,
        "undesirable_weight": 1.0,
    }


@pytest.mark.parametrize("name", list_preference_losses())
def test_every_registered_loss_matches_its_closed_form_values(name):
    """Per row: the loss value and both gradients against the hand-derived values."""
    for params, vals, loss, dw, dl in _rows(name):
        x = inputs(vals, grad=True)
        got, _ = get_preference_loss(name)(x, **params)
        gw, gl = torch.autograd.grad(got, (x.chosen_logps, x.rejected_logps))
        assert got.item() == pytest.approx(loss, abs=1e-12), (name, vals)
        assert float(gw) == pytest.approx(dw, abs=1e-12), (name, vals)
        assert float(gl) == pytest.approx(dl, abs=1e-12), (name, vals)


# float64 gradcheck cases: name -> (params, batch of several rows with unequal lengths)
def _batch() -> PreferenceInputs:
    g = torch.Generator().manual_seed(0)
    n_w = torch.tensor([3.0, 5.0, 1.0, 7.0], dtype=F64)
    n_l = torch.tensor([2.0, 6.0, 4.0, 1.0], dtype=F64)
    lw = -(torch.rand(4, generator=g, dtype=F64) + 0.2) * n_w  # mean token log-probs in (−1.2, −0.2)
    ll = -(torch.rand(4, generator=g, dtype=F64) + 0.2) * n_l
    rw = lw + torch.randn(4, generator=g, dtype=F64)
    rl = ll + torch.randn(4, generator=g, dtype=F64)
    kl = -torch.rand(4, generator=g, dtype=F64) * 5
    return PreferenceInputs(lw, ll, n_w, n_l, rw, rl, kl, kl - 0.3)


GRADCHECK: dict[str, list[dict]] = {
    "dpo": [{}, {"beta": 0.7, "label_smoothing": 0.2}],
    "ipo": [{}, {"beta": 1.5}],
    "simpo": [{}, {"beta": 2.5, "gamma": 0.3}],
    "orpo": [{}, {"beta": 0.9}],
    "kto": [{}, {"beta": 0.6, "desirable_weight": 1.33, "undesirable_weight": 0.5}],
}


@pytest.mark.parametrize("name", list_preference_losses())
def test_every_registered_loss_passes_a_float64_gradcheck(name):
    if name not in GRADCHECK:
        pytest.fail(
            f"preference loss {name!r} is registered but has no float64 gradcheck: add params to GRADCHECK in "
            "tests/algos/test_algos_preference_losses.py"
        )
    b = _batch()
    fn = get_preference_loss(name)
    for params in GRADCHECK[name]:

        def f(lw, ll, params=params):
            return fn(b._replace(chosen_logps=lw, rejected_logps=ll), **params)[0]

        args = (b.chosen_logps.clone().requires_grad_(True), b.rejected_logps.clone().requires_grad_(True))
        assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-8)


def _dummy(x: PreferenceInputs, n_tok, *, gain: float = 1.0) -> Sides:
    d = x.chosen_logps - x.rejected_logps
    return Sides(-gain * d.sum(), len(d), d.detach(), -d.detach(), {})


def test_a_loss_registered_without_reference_values_fails_the_gate():
    """Registering a loss parametrises the two gates above; without rows and a gradcheck case both fail
    for it (the registry is restored after this test by the root conftest's snapshot fixture)."""
    register_preference_loss("test-unreferenced", validate=lambda n, p: None, needs_reference=False)(_dummy)
    assert "test-unreferenced" in list_preference_losses()
    with pytest.raises(
        pytest.fail.Exception, match="'test-unreferenced' is registered but has no closed-form"
    ):
        test_every_registered_loss_matches_its_closed_form_values("test-unreferenced")
    with pytest.raises(pytest.fail.Exception, match="'test-unreferenced' is registered but has no float64"):
        test_every_registered_loss_passes_a_float64_gradcheck("test-unreferenced")
    test_every_registered_loss_matches_its_closed_form_values("dpo")  # a covered name passes


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_micro_batches_sum_to_the_whole_batch(name):
    """Σ_k loss(B_k; global_pairs, global_tokens) = loss(B) and the same gradient, any split (kto with
    the whole batch's KL completions in every part)."""
    b = _batch()
    fn = get_preference_loss(name)
    lw, ll = b.chosen_logps.clone().requires_grad_(True), b.rejected_logps.clone().requires_grad_(True)
    whole, _ = fn(b._replace(chosen_logps=lw, rejected_logps=ll))
    g_whole = torch.autograd.grad(whole, (lw, ll))
    count = 8 if name == "kto" else 4
    parts = []
    for sl in (slice(0, 1), slice(1, 4)):
        part = b._replace(
            chosen_logps=lw[sl],
            rejected_logps=ll[sl],
            chosen_tokens=b.chosen_tokens[sl],
            rejected_tokens=b.rejected_tokens[sl],
            ref_chosen_logps=b.ref_chosen_logps[sl],
            ref_rejected_logps=b.ref_rejected_logps[sl],
        )
        parts.append(fn(part, global_pairs=count, global_tokens=b.chosen_tokens.sum())[0])
    total = sum(parts)
    g_parts = torch.autograd.grad(total, (lw, ll))
    assert float(total) == pytest.approx(float(whole), abs=1e-12)
    for a, c in zip(g_whole, g_parts, strict=True):
        torch.testing.assert_close(a, c, rtol=0, atol=1e-12)


def test_metrics_are_the_trl_keys_with_their_values():
    x = inputs((-3.0, -6.0, 3, 2, -4.0, -4.0, 0, 0))
    _, m = get_preference_loss("dpo")(x, beta=0.5)
    assert float(m["rewards/chosen"]) == pytest.approx(0.5)
    assert float(m["rewards/rejected"]) == pytest.approx(-1.0)
    assert float(m["rewards/margins"]) == pytest.approx(1.5)
    assert float(m["rewards/accuracies"]) == 1.0
    assert float(m["logps/chosen"]) == -3.0 and float(m["logps/rejected"]) == -6.0
    _, m = get_preference_loss("simpo")(x)
    assert float(m["rewards/chosen"]) == pytest.approx(-2.0)  # β·l/n = 2·(−3/3)
    assert float(m["rewards/rejected"]) == pytest.approx(-6.0)
    _, m = get_preference_loss("kto")(
        x._replace(
            kl_logps=torch.tensor([-1.0, -2.0], dtype=F64), ref_kl_logps=torch.tensor([-2.0, -2.0], dtype=F64)
        )
    )
    assert float(m["kl"]) == pytest.approx(0.5)


def test_gradients_reach_only_the_policy_logps():
    vals = (-3.0, -6.0, 3, 2, -4.0, -4.0, -1.0, -2.0)
    x = inputs(vals)
    leaves = [t.clone().requires_grad_(True) for t in x]
    out, _ = get_preference_loss("kto")(PreferenceInputs(*leaves))
    grads = torch.autograd.grad(out, leaves, allow_unused=True)
    assert [g is not None and float(g.abs().sum()) > 0 for g in grads] == [True, True] + [False] * 6


@pytest.mark.parametrize(
    ("name", "params", "key"),
    [
        ("dpo", {"beta": 0}, "beta"),
        ("dpo", {"label_smoothing": 0.5}, "label_smoothing"),
        ("simpo", {"gamma": -1}, "gamma"),
        ("kto", {"undesirable_weight": 0}, "undesirable_weight"),
        ("orpo", {"beta": "x"}, "beta"),
    ],
)
def test_bad_param_values_name_the_key(name, params, key):
    with pytest.raises(PosttrainError, match=key):
        get_preference_loss(name)(inputs((-3.0, -6.0, 3, 2, -4.0, -4.0, 0, 0)), **params)


def test_unknown_param_and_bad_inputs_are_named():
    x = inputs((-3.0, -6.0, 3, 2, -4.0, -4.0, 0, 0))
    with pytest.raises(TypeError, match="'betta' \\(did you mean 'beta'\\?\\)"):
        get_preference_loss("dpo")(x, betta=0.1)
    with pytest.raises(PosttrainError, match="needs reference log-probs: ref_chosen_logps is None"):
        get_preference_loss("dpo")(x._replace(ref_chosen_logps=None))
    with pytest.raises(PosttrainError, match="kl_logps and ref_kl_logps"):
        get_preference_loss("kto")(x._replace(kl_logps=None))
    with pytest.raises(PosttrainError, match="rejected_logps: expected shape \\(1,\\)"):
        get_preference_loss("ipo")(x._replace(rejected_logps=torch.zeros(2, dtype=F64)))
    with pytest.raises(PosttrainError, match="chosen_tokens: every completion needs at least one token"):
        get_preference_loss("simpo")(x._replace(chosen_tokens=torch.zeros(1, dtype=F64)))
    # reference-free losses read no reference at all
    free = x._replace(ref_chosen_logps=None, ref_rejected_logps=None)
    assert torch.isfinite(get_preference_loss("simpo")(free)[0])
    assert torch.isfinite(get_preference_loss("orpo")(free)[0])


def test_kto_takes_unpaired_rows():
    x = PreferenceInputs(
        torch.tensor([-3.0, -4.0, -2.0], dtype=F64),
        torch.tensor([-6.0], dtype=F64),
        torch.ones(3, dtype=F64),
        torch.ones(1, dtype=F64),
        torch.tensor([-3.5, -4.0, -2.5], dtype=F64),
        torch.tensor([-5.0], dtype=F64),
        torch.tensor([-1.0], dtype=F64),
        torch.tensor([-1.0], dtype=F64),
    )
    loss, m = get_preference_loss("kto")(x)
    rw = torch.tensor([0.5, 0.0, 0.5], dtype=F64) * 0.1
    expect = ((1 - torch.sigmoid(rw)).sum() + (1 - torch.sigmoid(torch.tensor(0.1, dtype=F64)))) / 4
    assert float(loss) == pytest.approx(float(expect), abs=1e-12)
    assert "rewards/accuracies" not in m  # unpaired: no pairwise accuracy


def test_orpo_is_finite_when_the_chosen_likelihood_is_near_one():
    """log(1 − e^ā) at ā → 0⁻ in float32: log1p(−exp(ā)) is −inf there; the expm1 branch is finite."""
    x = PreferenceInputs(
        torch.tensor([-1e-9], requires_grad=True),
        torch.tensor([-2.0]),
        torch.ones(1),
        torch.ones(1),
    )
    loss, _ = get_preference_loss("orpo")(x)
    (g,) = torch.autograd.grad(loss, x.chosen_logps)
    assert torch.isfinite(loss) and torch.isfinite(g).all()
