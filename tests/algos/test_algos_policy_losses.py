"""Policy losses: spec reference tables (every row), gradient weights per region, errors, and a
registry-driven gate: every registered loss has closed-form reference values (``CLOSED_FORM``), so a
new loss without them fails here (its float64 gradcheck: test_algos_loss_properties.py)."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.algos import (
    Terms,
    get_policy_loss,
    list_policy_losses,
    policy_loss_default_agg,
    policy_loss_defaults,
    register_policy_loss,
)

F64 = torch.float64
#: The losses the library itself registers; installed packages may add more through the
#: ``posttrain.policy_losses`` entry point group, so the registry is a superset.
BUILTIN = {"cispo", "dapo", "dgpo", "gspo", "maspo", "ppo", "sapo"}


def rows(name, a, r, pi_old=0.05, **params):
    """One token per row, token-sum: returns per-row loss ℓ and ∂ℓ/∂logp (= −A·g), plus metrics."""
    a = torch.tensor(a, dtype=F64)
    r = torch.tensor(r, dtype=F64)
    pi_old = torch.as_tensor(pi_old, dtype=F64).expand_as(r)
    old = pi_old.log().unsqueeze(-1)
    logp = (old + r.log().unsqueeze(-1)).clone().requires_grad_(True)
    mask = torch.ones_like(logp)
    fn = get_policy_loss(name)
    per_row = []
    for i in range(len(a)):  # per-row loss values (small tables; clarity over speed)
        li, _ = fn(
            logp[i : i + 1].detach(), old[i : i + 1], a[i : i + 1], mask[i : i + 1], agg="token-sum", **params
        )
        per_row.append(li.item())
    loss, metrics = fn(logp, old, a, mask, agg="token-sum", **params)
    (grad,) = torch.autograd.grad(loss, logp)
    return torch.tensor(per_row, dtype=F64), grad.squeeze(-1), metrics


def close(x, y, tol=1e-4):
    torch.testing.assert_close(torch.as_tensor(x, dtype=F64), torch.as_tensor(y, dtype=F64), rtol=0, atol=tol)


# ---------------------------------------------------------------- registry / defaults


def test_registry_names_and_aliases():
    assert BUILTIN.issubset(list_policy_losses())
    assert get_policy_loss("grpo") is get_policy_loss("ppo")
    assert get_policy_loss("vanilla") is get_policy_loss("ppo")
    with pytest.raises(KeyError, match=r"unknown policy loss 'dgpoo'.*Did you mean 'dgpo'.*Known: .*cispo"):
        get_policy_loss("dgpoo")
    with pytest.raises(ValueError, match="Known:"):
        policy_loss_defaults("nope")


def test_defaults_are_the_papers():
    assert policy_loss_defaults("ppo") == {"clip_low": 0.2, "clip_high": 0.2, "clip_c": 3.0}
    # DAPO: verl's DAPO recipe clip_ratio_c = 10 (ppo keeps verl's actor default 3)
    assert policy_loss_defaults("dapo") == {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 10.0}
    assert policy_loss_defaults("gspo") == {"clip_low": 3e-4, "clip_high": 4e-4}
    assert policy_loss_defaults("cispo") == {"clip_low": 10.0, "clip_high": 0.2}
    assert policy_loss_defaults("sapo") == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert policy_loss_defaults("dgpo") == {
        "dgpo_n": 1,
        "dgpo_m": 2,
        "clip_low": 0.2,
        "clip_high": 0.2,
        "dual_clip": False,
        "clip_c": 3.0,
    }
    assert policy_loss_defaults("maspo") == {
        "maspo_sigma_base": 1.0,
        "maspo_alpha": 0.3,
        "maspo_sigma_high": 10.0,
        "maspo_beta_pos": 0.03,
        "maspo_beta_neg": 0.03,
        "maspo_adv_low": 0.1,
        "maspo_adv_high": 10.0,
        "dual_clip": False,
        "clip_c": 3.0,
    }
    assert policy_loss_default_agg("gspo") == "seq-mean-token-mean"
    assert policy_loss_default_agg("sapo") == "seq-mean-token-mean"
    for name in ("ppo", "dapo", "cispo", "dgpo", "maspo"):
        assert policy_loss_default_agg(name) == "token-mean"
    # the returned dict is a copy
    policy_loss_defaults("ppo")["clip_low"] = 9
    assert policy_loss_defaults("ppo")["clip_low"] == 0.2


def _tiny():
    logp = torch.tensor([[-1.0, -2.0]])
    return logp, logp - 0.1, torch.tensor([1.0]), torch.ones(1, 2)


def test_unknown_param_names_the_key_and_the_accepted_ones():
    with pytest.raises(TypeError, match=r"'dgpo'.*'dgpo_k'.*accepted parameters: clip_c, clip_high"):
        get_policy_loss("dgpo")(*_tiny(), dgpo_k=3)
    with pytest.raises(TypeError, match=r"'clip_hgh' \(did you mean 'clip_high'\?\)"):
        get_policy_loss("ppo")(*_tiny(), clip_hgh=0.3)
    with pytest.raises(TypeError, match="tau_pos"):
        get_policy_loss("sapo")(*_tiny(), clip_low=0.2)


@pytest.mark.parametrize(
    ("name", "params", "key"),
    [
        ("ppo", {"clip_low": -0.1}, "clip_low"),
        ("ppo", {"clip_c": 0.5}, "clip_c"),
        ("ppo", {"clip_high": "0.2"}, "clip_high"),
        ("sapo", {"tau_neg": 0.0}, "tau_neg"),
        ("dgpo", {"dgpo_m": 0}, "dgpo_m"),
        ("dgpo", {"dgpo_n": -1}, "dgpo_n"),
        ("dgpo", {"clip_low": 1.0}, "clip_low"),
        ("dgpo", {"dual_clip": "yes"}, "dual_clip"),
        ("maspo", {"maspo_sigma_high": 0.5}, "maspo_sigma_high"),
        ("maspo", {"maspo_adv_low": 0.0}, "maspo_adv_low"),
        ("maspo", {"maspo_alpha": -0.3}, "maspo_alpha"),
        ("maspo", {"dual_clip": True, "clip_c": 1.0}, "clip_c"),
    ],
)
def test_bad_param_values(name, params, key):
    with pytest.raises(ValueError, match=f"{name}.*{key} must be"):
        get_policy_loss(name)(*_tiny(), **params)


def test_bad_shapes_and_agg():
    logp, old, a, m = _tiny()
    fn = get_policy_loss("ppo")
    with pytest.raises(ValueError, match=r"advantages: expected shape \(1,\) or \(1, 2\)"):
        fn(logp, old, torch.ones(3), m)
    with pytest.raises(ValueError, match=r"old_logp: expected shape \(1, 2\)"):
        fn(logp, old[:, :1], a, m)
    with pytest.raises(ValueError, match=r"logp: expected shape \(B, T\)"):
        fn(logp[0], old[0], a, m[0])
    with pytest.raises(TypeError, match="floating-point"):
        fn(logp.long(), old, a, m)
    with pytest.raises(ValueError, match=r"is_weights: expected shape \(1, 2\)"):
        fn(logp, old, a, m, is_weights=torch.ones(2))
    with pytest.raises(KeyError, match=r"unknown aggregation mode 'token_mean'.*Did you mean 'token-mean'"):
        fn(logp, old, a, m, agg="token_mean")


# ---------------------------------------------------------------- PPO (arXiv 1707.06347; verl vanilla)

PPO_TABLE = [  # A, r, ℓ, dℓ/dlogp, region
    (+1, 1.1, -1.1, -1.1, "inside"),
    (+1, 1.5, -1.2, 0.0, "clipped upper"),
    (+1, 0.5, -0.5, -0.5, "unclipped A>0 low r"),
    (-1, 0.9, 0.9, 0.9, "inside"),
    (-1, 0.5, 0.8, 0.0, "clipped lower"),
    (-1, 2.0, 2.0, 2.0, "unclipped r<c"),
    (-1, 5.0, 3.0, 0.0, "dual-clipped"),
]


@pytest.mark.parametrize("name", ["ppo", "grpo", "vanilla"])
def test_ppo_reference_table(name):
    a, r, loss, grad, _ = zip(*PPO_TABLE, strict=True)
    got_loss, got_grad, metrics = rows(name, list(a), list(r))
    close(got_loss, loss, 1e-12)
    close(got_grad, grad, 1e-12)
    close(metrics["clipfrac_high"], 1 / 7, 1e-12)
    close(metrics["clipfrac_low"], 1 / 7, 1e-12)
    close(metrics["dualclip_frac"], 1 / 7, 1e-12)
    close(metrics["clipfrac"], 2 / 7, 1e-12)


def test_ppo_dual_clip_off_and_asymmetric_clip():
    # clip_c=None: A<0, r=5 is unbounded (g = r); ε_low = 0.1: r = 0.85 < 0.9 is clipped (g = 0)
    loss, grad, m = rows("ppo", [-1, -1, -1], [5.0, 0.85, 0.95], clip_c=None, clip_low=0.1)
    close(loss, [5.0, 0.9, 0.95], 1e-12)
    close(grad, [5.0, 0.0, 0.95], 1e-12)
    close(m["clipfrac_low"], 1 / 3, 1e-12)
    assert m["dualclip_frac"].item() == 0.0


def test_ppo_clip_fraction_split_matches_sign():
    # DAPO clip-higher: r = 1.25 is inside for ε_high = 0.28, clipped for ppo's 0.2
    _, g_ppo, m_ppo = rows("ppo", [1.0], [1.25])
    _, g_dapo, m_dapo = rows("dapo", [1.0], [1.25])
    close(g_ppo, [0.0])
    close(g_dapo, [-1.25], 1e-12)
    assert m_ppo["clipfrac_high"].item() == 1.0 and m_dapo["clipfrac_high"].item() == 0.0
    _, g, _ = rows("dapo", [1.0], [1.3])
    close(g, [0.0])


# ---------------------------------------------------------------- GSPO (arXiv 2507.18071)


def _gspo(token_log_ratios, a, **kw):
    lr = torch.tensor([token_log_ratios], dtype=F64)
    old = torch.full_like(lr, -1.0)
    logp = (old + lr).requires_grad_(True)
    loss, m = get_policy_loss("gspo")(logp, old, torch.tensor([a], dtype=F64), torch.ones_like(lr), **kw)
    (g,) = torch.autograd.grad(loss, logp)
    return loss, g[0], m


def test_gspo_reference_examples():
    # [0.1, −0.2, 0.4] → s = exp(0.1) = 1.10517, outside [0.9997, 1.0004] → clipped for A > 0
    loss, g, m = _gspo([0.1, -0.2, 0.4], 1.0)
    close(m["seq_ratio_mean"], 1.10517, 1e-5)
    close(loss, -(1 + 4e-4), 1e-12)  # −A·clamp(s) on every token, seq-mean-token-mean
    close(g, [0.0, 0.0, 0.0])
    assert m["clipfrac_high"].item() == 1.0
    # the same sequence with A < 0 is inside the unclipped side: g = s on every token
    loss, g, _ = _gspo([0.1, -0.2, 0.4], -1.0)
    close(g, [math.exp(0.1) / 3] * 3, 1e-12)  # ∂/∂logp_t = −A·s/|y| (seq-mean-token-mean, 1 seq)
    # [1e-4, −2e-4, 4e-4] → s = exp(1e-4) = 1.0001 → inside, g = 1.0001 on every token
    loss, g, m = _gspo([1e-4, -2e-4, 4e-4], 1.0)
    s = math.exp(1e-4)
    close(loss, -s, 1e-12)
    close(g * 3, [-s] * 3, 1e-12)
    close(m["weight_mean"], s, 1e-12)
    assert m["clipfrac"].item() == 0.0


def test_gspo_sequence_clip_is_per_sequence_and_lower_side():
    lr = torch.tensor([[-0.01, -0.01], [1e-4, 1e-4]], dtype=F64)
    old = torch.full_like(lr, -2.0)
    logp = (old + lr).requires_grad_(True)
    a = torch.tensor([-1.0, -1.0], dtype=F64)
    loss, m = get_policy_loss("gspo")(logp, old, a, torch.ones_like(lr))
    (g,) = torch.autograd.grad(loss, logp)
    close(g[0], [0.0, 0.0])  # s = e^-0.01 < 1 − 3e-4, A < 0: clipped
    close(g[1], [math.exp(1e-4) / 4] * 2, 1e-12)  # 1/(|y|·S) = 1/4
    close(m["clipfrac_low"], 0.5, 1e-12)


def test_gspo_log_ratio_cap_zeroes_gradient():
    loss, g, _ = _gspo([15.0, 15.0], -1.0, clip_low=0.2, clip_high=0.2)
    close(loss, math.exp(10.0), 1e-6)  # log s clamped at 10
    close(g, [0.0, 0.0])


# ---------------------------------------------------------------- CISPO (arXiv 2506.13585)


def test_cispo_reference_examples():
    _, g, m = rows("cispo", [1.0], [1.5], clip_high=0.2)
    close(g, [-1.2], 1e-12)  # g = 1.2 (PPO: 0)
    assert m["clipfrac_high"].item() == 1.0
    _, g, _ = rows("cispo", [-1.0], [0.5], clip_low=0.2)
    close(g, [0.8], 1e-12)
    _, g, m = rows("cispo", [-1.0], [0.5], clip_low=10.0)
    close(g, [0.5], 1e-12)
    assert m["clipfrac_low"].item() == 0.0
    # the loss value is the REINFORCE form −A·sg(clip r)·logp
    loss, _, _ = rows("cispo", [2.0], [1.1], pi_old=0.5)
    close(loss, [-2.0 * 1.1 * math.log(0.55)], 1e-12)


# ---------------------------------------------------------------- SAPO (arXiv 2511.20347)

SAPO_TABLE = [  # A, r, ℓ, g
    (+1, 1.0, -2.0000, 1.0000),
    (+1, 1.5, -2.4898, 1.4100),
    (+1, 3.0, -3.5232, 1.2599),
    (-1, 0.5, 1.4159, 0.4671),
    (-1, 1.0, 1.9048, 1.0000),
    (-1, 2.0, 2.8220, 1.5362),
]


def test_sapo_reference_table():
    a, r, loss, g = zip(*SAPO_TABLE, strict=True)
    got_loss, got_grad, m = rows("sapo", list(a), list(r))
    close(got_loss, loss, 1e-4)
    close(got_grad, [-ai * gi for ai, gi in zip(a, g, strict=True)], 1e-4)
    assert m["clipfrac"].item() == 0.0
    close(m["gate_mean"], sum(gi / ri for gi, ri in zip(g, r, strict=True)) / 6, 1e-4)


# ---------------------------------------------------------------- DGPO (arXiv 2603.14389)

DGPO_TABLE = [  # n, m, A, r, ℓ, g, W = g/π (π_old = 0.05)
    (1, 2, -1, 0.5, 0.31250, 0.31250, 12.5),
    (1, 2, -1, 0.1, 0.01250, 0.01250, 2.5),
    (1, 2, -1, 0.01, 0.000125, 0.000125, 0.25),
    (1, 2, +1, 1.5, -1.34164, 1.34164, 17.889),
    (1, 2, +1, 3.0, -1.89737, 1.89737, 12.649),
    (1, 2, +1, 10, -3.46410, 3.46410, 6.928),
    (1, 2, +1, 1.1, -1.1, 1.1, 20),
    (1, 2, -1, 5.0, 5.0, 5.0, 20),
    (1, 2, +1, 0.5, -0.5, 0.5, 20),
    (2, 2, -1, 0.5, 0.19531, 0.19531, 7.8125),
    (1, 1, +1, 3.0, -1.2, 1.2, 8.0),
    (1, 3, +1, 3.0, -2.21042, 2.21042, 14.736),
]


@pytest.mark.parametrize("row", DGPO_TABLE, ids=lambda r: f"n{r[0]}m{r[1]}A{r[2]}r{r[3]}")
def test_dgpo_reference_table(row):
    n, m, a, r, loss, g, w = row
    got_loss, got_grad, _ = rows("dgpo", [a], [r], dgpo_n=n, dgpo_m=m)
    close(got_loss, [loss], 1e-5)
    close(got_grad, [-a * g], 1e-5)
    # W = g / π with π = π_old·r: the ∇π weight; ratio of the two must match the table
    close(-got_grad / a / (0.05 * r), [w], 2e-3)
    # PPO gives zero on every LN/HP row and on the dual-clipped A=−1, r=5 row
    _, ppo_grad, _ = rows("ppo", [a], [r])
    in_boundary = (a < 0 and r < 0.8) or (a > 0 and r > 1.2) or (a < 0 and r > 3)
    assert (ppo_grad.abs().item() == 0.0) == in_boundary


def test_dgpo_independent_of_pi_old_and_dual_clip_option():
    for pi_old in (0.05, 0.5, 0.9):
        loss, grad, _ = rows("dgpo", [-1.0, 1.0], [0.5, 1.1], pi_old=pi_old)
        close(loss, [0.3125, -1.1], 1e-12)
        close(grad, [0.3125, -1.1], 1e-12)
    loss, grad, m = rows("dgpo", [-1.0, -1.0], [5.0, 0.5], dual_clip=True)
    close(loss, [3.0, 0.3125], 1e-12)
    close(grad, [0.0, 0.3125], 1e-12)
    close(m["dualclip_frac"], 0.5, 1e-12)
    close(m["clipfrac_low"], 0.5, 1e-12)


def test_dgpo_special_cases_from_spec():
    # n = 0: LN weight = r (unclipped PG); m = 1: HP weight = 1 + ε_high (CISPO's upper side)
    _, g, _ = rows("dgpo", [-1.0], [0.3], dgpo_n=0)
    close(g, [0.3], 1e-12)
    _, g, _ = rows("dgpo", [1.0, 1.0], [2.0, 7.0], dgpo_m=1)
    close(g, [-1.2, -1.2], 1e-12)


# ---------------------------------------------------------------- MASPO (arXiv 2602.17550)

MASPO_TABLE = [  # π_old, A, r, mass, σ, w, g
    (0.9, +1, 1.1, 1.0321, 1.0631, 0.9956, 1.0951),
    (0.5, +1, 1.8, 1.2311, 1.2681, 0.8195, 1.4752),
    (0.3, +1, 3.0, 1.4350, 1.4781, 0.4003, 1.2010),
    (0.3, +3, 3.0, 1.4350, 1.5642, 0.4416, 1.3247),
    (0.01, +1, 3.0, 3.9811, 4.1005, 0.8879, 2.6636),
    (0.01, +1, 10, 3.9811, 4.1005, 0.0899, 0.8993),
    (1e-4, +1, 10, 10.0, 10.3, 0.6827, 6.8266),
    (1e-4, +1, 30, 10.0, 10.3, 0.0190, 0.5698),
    (0.9, -1, 0.5, 1.0321, 1.0021, 0.8829, 0.4415),
    (0.9, -1, 0.2, 1.0321, 1.0021, 0.7271, 0.1454),
    (0.9, -3, 0.5, 1.0321, 0.9469, 0.8699, 0.4349),
    (0.01, -1, 0.2, 3.9811, 3.8651, 0.9788, 0.1958),
    (0.3, -1, 3.0, None, None, 1.0, 3.0),
    (0.9, +1, 0.5, None, None, 1.0, 0.5),
]


@pytest.mark.parametrize("row", MASPO_TABLE, ids=lambda r: f"pi{r[0]}A{r[1]}r{r[2]}")
def test_maspo_reference_table(row):
    pi_old, a, r, mass, sigma, w, g = row
    loss, grad, m = rows("maspo", [a], [r], pi_old=pi_old)
    close(-grad / a, [g], 1e-4)  # table values are rounded to 4 decimals: compare g itself
    close(-loss / a, [g], 1e-4)  # authors' form: ℓ = −A·w·r = −A·g
    close(m["gate_mean"], w, 1e-4)
    close(m["weight_mean"], g, 1e-4)
    assert m["gated_frac"].item() == (1.0 if sigma is not None else 0.0)
    if sigma is not None:
        close(m["sigma_mean"], sigma, 1e-4)
        factor = 1 + 0.03 * a if a > 0 else 1 / (1 - 0.03 * a)
        close(m["sigma_mean"] / factor, mass, 1e-4)


def test_maspo_pure_function_vectors():
    # π_old = 0.9, A = +1 → σ = 1.0631; w = 0.9825 / 0.6425 / 0.1704 at r = 1.2 / 2 / 3
    for r, w in ((1.2, 0.9825), (2.0, 0.6425), (3.0, 0.1704)):
        _, grad, m = rows("maspo", [1.0], [r], pi_old=0.9)
        close(m["gate_mean"], w, 1e-4)
        close(grad, [-w * r], 5e-4)
        close(m["sigma_mean"], 1.0631, 1e-4)


def test_maspo_large_positive_advantage_has_no_division_by_zero():
    # 1 − β_neg·A = 0 at A = 1/0.03 ≈ 33.3: must not matter for A > 0
    a = 1 / 0.03
    loss, grad, m = rows("maspo", [a, -a], [2.0, 0.5], pi_old=0.5)
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    assert all(torch.isfinite(v) for v in m.values())


def test_maspo_dual_clip_option():
    loss, grad, m = rows("maspo", [-1.0], [5.0], pi_old=0.1, dual_clip=True)
    close(loss, [3.0], 1e-12)
    close(grad, [0.0])
    assert m["dualclip_frac"].item() == 1.0
    loss, grad, _ = rows("maspo", [-1.0], [5.0], pi_old=0.1)
    close(grad, [5.0], 1e-12)


# ---------------------------------------------------------------- general behaviour


def test_token_mean_normaliser_and_metrics():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.2, 0.2, 0.2]], dtype=F64))
    r = torch.tensor([[1.1, 1.5, 0.5], [0.9, 0.5, 9.0]], dtype=F64)
    logp = (old + r.log()).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    a = torch.tensor([1.0, -1.0], dtype=F64)
    loss, m = get_policy_loss("ppo")(logp, old, a, mask)
    (g,) = torch.autograd.grad(loss, logp)
    close(loss, (-1.1 - 1.2 - 0.5 + 0.9 + 0.8) / 5, 1e-12)
    close(g, [[-1.1 / 5, 0.0, -0.5 / 5], [0.9 / 5, 0.0, 0.0]], 1e-12)
    close(m["approx_kl"], -torch.log(r)[mask.bool()].mean(), 1e-12)
    close(m["ratio_mean"], r[mask.bool()].mean(), 1e-12)
    close(m["weight_mean"], (1.1 + 0 + 0.5 + 0.9 + 0) / 5, 1e-12)
    close(m["clipfrac_high"], 0.2, 1e-12)
    close(m["clipfrac_low"], 0.2, 1e-12)
    for v in m.values():
        assert v.dim() == 0 and not v.requires_grad


@pytest.mark.parametrize("name", ["ppo", "dapo", "gspo", "cispo", "sapo", "dgpo", "maspo"])
def test_is_weights_multiply_per_token_loss(name):
    torch.manual_seed(0)
    old = -torch.rand(2, 4, dtype=F64) - 0.5
    logp = (old + 0.3 * torch.randn(2, 4, dtype=F64)).requires_grad_(True)
    a = torch.tensor([1.3, -0.7], dtype=F64)
    mask = torch.ones(2, 4)
    w = torch.rand(2, 4, dtype=F64) + 0.5
    fn = get_policy_loss(name)
    base, _ = fn(logp, old, a, mask, agg="token-sum")
    weighted, _ = fn(logp, old, a, mask, agg="token-sum", is_weights=w)
    (gb,) = torch.autograd.grad(base, logp)
    (gw,) = torch.autograd.grad(weighted, logp)
    # ∂(w_t·ℓ_t)/∂logp_t = w_t·∂ℓ_t/∂logp_t (w detached; gspo's s_i reaches logp_t only via token t)
    close(gw, gb * w, 1e-12)
    assert weighted.item() != base.item()


def test_explicit_agg_overrides_the_default():
    old = torch.zeros(2, 3, dtype=F64) - 1
    logp = old.clone()
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    a = torch.tensor([1.0, 2.0], dtype=F64)
    fn = get_policy_loss("sapo")
    default, _ = fn(logp, old, a, mask)  # seq-mean-token-mean: (−2 + −4)/2
    tm, _ = fn(logp, old, a, mask, agg="token-mean")  # (3·−2 + −4)/4
    close(default, -3.0, 1e-12)
    close(tm, -2.5, 1e-12)


def test_log_ratio_clamp_keeps_everything_finite():
    old = torch.tensor([[-60.0, -0.1]], dtype=F64)
    logp = torch.tensor([[-0.5, -70.0]], dtype=F64, requires_grad=True)
    for name in list_policy_losses():
        for a in (1.0, -1.0):
            loss, m = get_policy_loss(name)(logp, old, torch.tensor([a], dtype=F64), torch.ones(1, 2))
            (g,) = torch.autograd.grad(loss, logp)
            assert torch.isfinite(loss) and torch.isfinite(g).all(), name
            assert all(torch.isfinite(v) for v in m.values()), name
            close(m["approx_kl"], (-20 + 20) / 2, 1e-12)  # both log-ratios clamped to ±20


@pytest.mark.parametrize("name", ["ppo", "dapo", "gspo", "cispo", "sapo", "dgpo", "maspo"])
def test_float32_and_float64_agree(name):
    torch.manual_seed(1)
    old = -torch.rand(3, 5, dtype=F64) * 3 - 0.05
    logp64 = (old + 0.4 * torch.randn(3, 5, dtype=F64)).clamp(max=0).requires_grad_(True)
    a = torch.randn(3, dtype=F64)
    mask = (torch.rand(3, 5) > 0.3).to(torch.int64)
    mask[:, 0] = 1
    fn = get_policy_loss(name)
    l64, m64 = fn(logp64, old, a, mask)
    assert all(v.dtype == F64 for v in m64.values())
    logp32 = logp64.detach().float().requires_grad_(True)
    l32, m32 = fn(logp32, old.float(), a.float(), mask)
    assert l32.dtype == torch.float32 and l64.dtype == torch.float64
    assert all(v.dtype == torch.float32 for v in m32.values())
    (g64,) = torch.autograd.grad(l64, logp64)
    (g32,) = torch.autograd.grad(l32, logp32)
    torch.testing.assert_close(l32.double(), l64, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(g32.double(), g64, rtol=1e-4, atol=1e-5)


def test_token_level_advantages_broadcast_equivalence():
    torch.manual_seed(2)
    old = -torch.rand(2, 3, dtype=F64) - 0.1
    logp = old + 0.2 * torch.randn(2, 3, dtype=F64)
    a = torch.tensor([0.5, -1.5], dtype=F64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    for name in list_policy_losses():
        fn = get_policy_loss(name)
        l1, _ = fn(logp, old, a, mask)
        l2, _ = fn(logp, old, a[:, None].expand(2, 3).clone(), mask)
        close(l1, l2, 1e-14)


def test_gspo_sequence_ratio_uses_unclamped_token_log_ratios() -> None:
    """verl's GSPO averages the raw per-token log-ratios; only log s_it is clamped (at 10).

    Token log-ratios [30, -28] average to 1 (s_i = e); clamping each at ±20 first would give 0 (s_i = 1).
    """
    from posttrain.algos import get_policy_loss

    logp = torch.tensor([[-1.0, -40.0]], dtype=torch.float64)
    old = torch.tensor([[-31.0, -12.0]], dtype=torch.float64)
    mask = torch.ones_like(logp)
    adv = torch.tensor([-1.0], dtype=torch.float64)  # A<0, s_i = e > 1 - eps_low: not clipped
    _, metrics = get_policy_loss("gspo")(logp, old, adv, mask)
    assert float(metrics["seq_ratio_mean"]) == pytest.approx(math.e, rel=1e-12)


# ---------------------------------------------------------------- every registered loss: closed form

# One row per token, token-sum, π_old per row: (A, r, π_old, params, ℓ, ∂ℓ/∂logp). The rows of the
# papers' tables above are reused; dapo, gspo and cispo get theirs here.
Row = tuple[float, float, float, dict, float, float]
DAPO_ROWS: list[Row] = [  # ε_low 0.2, ε_high 0.28 (clip-higher), dual clip c = 10
    (+1, 1.25, 0.05, {}, -1.25, -1.25),  # inside for ε_high = 0.28 (ppo clips it)
    (+1, 1.3, 0.05, {}, -1.28, 0.0),  # clipped upper
    (-1, 0.7, 0.05, {}, 0.8, 0.0),  # clipped lower
    (-1, 5.0, 0.05, {}, 5.0, 5.0),  # r < c = 10: unclipped (ppo's c = 3 dual-clips it)
    (-1, 12.0, 0.05, {}, 10.0, 0.0),  # dual-clipped at c = 10
]
GSPO_ROWS: list[Row] = [  # one token: s = r; ε_low 3e-4, ε_high 4e-4
    (+1, 1.0001, 0.05, {}, -1.0001, -1.0001),  # inside
    (+1, 1.1, 0.05, {}, -1.0004, 0.0),  # clipped upper
    (-1, 1.1, 0.05, {}, 1.1, 1.1),  # A < 0, s > 1: the unclipped side
    (-1, 0.9, 0.05, {}, 0.9997, 0.0),  # clipped lower
]
CISPO_ROWS: list[Row] = [  # ℓ = −A·sg(clip(r, 1−ε_low, 1+ε_high))·logp, logp = log(π_old·r)
    (+1, 1.5, 0.05, {}, -1.2 * math.log(0.075), -1.2),  # weight clipped at 1.2, never 0
    (-1, 0.5, 0.05, {"clip_low": 0.2}, 0.8 * math.log(0.025), 0.8),
    (-1, 0.5, 0.05, {}, 0.5 * math.log(0.025), 0.5),  # default ε_low = 10: no lower clip
    (+2, 1.1, 0.5, {}, -2.0 * 1.1 * math.log(0.55), -2.2),
]

#: name -> (tolerance per unit |A|, rows). A loss registered without an entry fails
#: test_every_registered_loss_matches_its_closed_form_values.
CLOSED_FORM: dict[str, tuple[float, list[Row]]] = {
    "ppo": (1e-12, [(a, r, 0.05, {}, loss, grad) for a, r, loss, grad, _ in PPO_TABLE]),
    "dapo": (1e-12, DAPO_ROWS),
    "gspo": (1e-12, GSPO_ROWS),
    "cispo": (1e-12, CISPO_ROWS),
    "sapo": (1e-4, [(a, r, 0.05, {}, loss, -a * g) for a, r, loss, g in SAPO_TABLE]),
    "dgpo": (
        1e-5,
        [(a, r, 0.05, {"dgpo_n": n, "dgpo_m": m}, loss, -a * g) for n, m, a, r, loss, g, _ in DGPO_TABLE],
    ),
    "maspo": (1e-4, [(a, r, pi, {}, -a * g, -a * g) for pi, a, r, _, _, _, g in MASPO_TABLE]),
}


def _reference_rows(name: str) -> tuple[float, list[Row]]:
    if name not in CLOSED_FORM:
        pytest.fail(
            f"policy loss {name!r} is registered but has no closed-form reference values: "
            "add (A, r, π_old, params, ℓ, ∂ℓ/∂logp) rows to CLOSED_FORM in tests/algos/test_algos_policy_losses.py"
        )
    return CLOSED_FORM[name]


@pytest.mark.parametrize("name", list_policy_losses())
def test_every_registered_loss_matches_its_closed_form_values(name):
    """Per row: the loss value and its gradient against hand-derived values, both signs of A."""
    tol, table = _reference_rows(name)
    assert {a > 0 for a, *_ in table} == {True, False}, f"{name}: give rows with A > 0 and A < 0"
    for a, r, pi_old, params, loss, grad in table:
        got_loss, got_grad, _ = rows(name, [a], [r], pi_old=pi_old, **params)
        t = tol * max(1.0, abs(a))
        close(got_loss, [loss], t)
        close(got_grad, [grad], t)


def test_closed_form_table_names_only_registered_losses():
    assert set(CLOSED_FORM) <= set(list_policy_losses())


def _dummy_core(batch, *, gain: float = 1.0) -> Terms:
    ratio = torch.exp(batch.log_ratio)
    none = torch.zeros_like(batch.valid)
    return Terms(-gain * batch.adv * ratio, (gain * ratio).detach(), ratio.detach(), none, none)


def test_a_loss_registered_without_reference_values_fails_the_gate():
    """Registering a loss makes it part of `list_policy_losses()`, which parametrises the gate above
    at collection; without CLOSED_FORM rows the gate fails for it (the registry is restored after
    this test by the root conftest's snapshot fixture)."""
    register_policy_loss("test-unreferenced", validate=lambda name, params: None)(_dummy_core)
    assert "test-unreferenced" in list_policy_losses()
    with pytest.raises(
        pytest.fail.Exception, match="'test-unreferenced' is registered but has no closed-form"
    ):
        test_every_registered_loss_matches_its_closed_form_values("test-unreferenced")
    test_every_registered_loss_matches_its_closed_form_values("ppo")  # a covered name passes
