"""Preference losses equal TRL's for the same inputs: TRL's own loss code is called, not a copy of it.

``DPOTrainer._compute_loss`` (sigmoid, ipo) and ``KTOTrainer._compute_loss`` (kto) run unbound on a
minimal ``self`` and a stand-in model whose forward returns the per-token log-probs we choose (TRL's
fused head returns 0 at positions without a label, as here); SimPO and cDPO's label smoothing are
TRL's ``CPOTrainer.cpo_loss`` (``loss_type="simpo"``; ``"sigmoid"`` fed with DPO's log-ratios, the
cDPO form, which TRL 1.16's ``DPOTrainer`` no longer has), ORPO is ``ORPOTrainer.odds_ratio_loss``
plus the chosen token-mean NLL of its ``concatenated_forward``. Skipped with the reason when TRL is
not installed (``pip install -e '.[bench]'``)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from posttrain.algos import PreferenceInputs, get_preference_loss

trl = pytest.importorskip(
    "trl", reason="TRL is not installed (it is in the bench extra: pip install -e '.[bench]')"
)

F64 = torch.float64
B, T = 3, 7


def _batch(seed: int = 0):
    """(input_ids, attention_mask, completion_mask, per-token log-probs (rows, T-1) zero off-completion)
    for 2B rows [chosen..., rejected...] with unequal completion lengths, and the same as sums."""
    g = torch.Generator().manual_seed(seed)
    prompt = [2, 3, 1, 2, 4, 1]
    comp = [3, 2, 5, 1, 4, 2]
    ids = torch.randint(5, 50, (2 * B, T), generator=g)
    cmask = torch.zeros(2 * B, T, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt, comp, strict=True)):
        cmask[i, p : p + c] = 1
    amask = (cmask.cumsum(1) < cmask.sum(1, keepdim=True)) | (cmask == 1) | (torch.arange(T) < 1)
    per_tok = -torch.rand(2 * B, T - 1, generator=g, dtype=F64) * 1.5 - 0.05
    per_tok = per_tok * cmask[:, 1:]
    return ids, amask.long(), cmask, per_tok


class _Model:
    """TRL's model call with ``fused_lm_head=True`` returns per-token log-probs (and stats) directly."""

    def __init__(self, per_tok):
        self.per_tok = per_tok
        self.training = True

    def __call__(self, **kw):
        n, t = self.per_tok.shape
        return SimpleNamespace(
            log_probs=self.per_tok,
            entropy=torch.zeros(n, t, dtype=F64),
            mean_logits=torch.zeros(n, t, dtype=F64),
            is_top1=torch.zeros(n, t, dtype=torch.bool),
        )


def _accelerator():
    return SimpleNamespace(
        device=torch.device("cpu"),
        gather_for_metrics=lambda x: x,
        gather=lambda x: x,
        unwrap_model=lambda m: m,
    )


def _trl_self(model, **attrs):
    return SimpleNamespace(
        model=model,
        accelerator=_accelerator(),
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_weights=[1.0],
        label_smoothing=0.0,
        use_weighting=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
        **attrs,
    )


def _ours(per_tok, cmask, ref=None):
    sums = per_tok.sum(1)
    n = cmask[:, 1:].sum(1).to(F64)
    return PreferenceInputs(
        sums[:B],
        sums[B:],
        n[:B],
        n[B:],
        None if ref is None else ref[:B],
        None if ref is None else ref[B:],
    )


@pytest.mark.parametrize(
    ("trl_type", "ours", "beta"),
    [("sigmoid", "dpo", 0.1), ("sigmoid", "dpo", 0.7), ("ipo", "ipo", 0.1), ("ipo", "ipo", 0.4)],
)
def test_dpo_and_ipo_equal_trl_dpotrainer(trl_type, ours, beta):
    from trl import DPOTrainer

    ids, am, cm, per_tok = _batch()
    ref = per_tok.sum(1) + torch.linspace(-1.5, 1.2, 2 * B, dtype=F64)
    model = _Model(per_tok)
    self = _trl_self(model, loss_types=[trl_type], beta=beta)
    inputs = {
        "input_ids": ids,
        "attention_mask": am,
        "completion_mask": cm,
        "ref_chosen_logps": ref[:B],
        "ref_rejected_logps": ref[B:],
    }
    trl_loss = DPOTrainer._compute_loss(self, model, inputs, False)
    loss, m = get_preference_loss(ours)(_ours(per_tok, cm, ref), beta=beta)
    assert float(loss) == pytest.approx(float(trl_loss), rel=1e-12, abs=1e-12)
    logged = self._metrics["train"]
    for key in (
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
        "logps/rejected",
    ):
        assert float(m[key]) == pytest.approx(logged[key][-1], rel=1e-12, abs=1e-12), key


@pytest.mark.parametrize(("beta", "weights"), [(0.1, (1.0, 1.0)), (0.5, (1.33, 0.7))])
def test_kto_equals_trl_ktotrainer(beta, weights):
    from trl import KTOTrainer

    ids, am, cm, per_tok = _batch(1)
    g = torch.Generator().manual_seed(5)
    ref = per_tok.sum(1) + torch.randn(2 * B, generator=g, dtype=F64)
    kl = -torch.rand(2 * B, generator=g, dtype=F64) * 4
    ref_kl = kl - 0.4 * torch.rand(2 * B, generator=g, dtype=F64)  # mean KL > 0: z0 is active
    labels = torch.tensor([True] * B + [False] * B)
    model = _Model(per_tok)
    self = _trl_self(
        model,
        beta=beta,
        loss_type="kto",
        calculate_KL=True,
        desirable_weight=weights[0],
        undesirable_weight=weights[1],
        _compute_kl_logps=lambda model, batch: kl,
    )
    inputs = {
        "input_ids": ids,
        "attention_mask": am,
        "completion_mask": cm,
        "label": labels,
        "ref_logps": ref,
        "ref_KL_logps": ref_kl,
    }
    trl_loss = KTOTrainer._compute_loss(self, model, inputs, False)
    x = _ours(per_tok, cm, ref)._replace(kl_logps=kl, ref_kl_logps=ref_kl)
    loss, m = get_preference_loss("kto")(
        x, beta=beta, desirable_weight=weights[0], undesirable_weight=weights[1]
    )
    assert float(loss) == pytest.approx(float(trl_loss), rel=1e-12, abs=1e-12)
    logged = self._metrics["train"]
    assert float(m["kl"]) == pytest.approx(logged["kl"][-1], rel=1e-12)
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"):
        assert float(m[key]) == pytest.approx(logged[key][-1], rel=1e-12, abs=1e-12), key


def _cpo_self(loss_type, beta, label_smoothing=0.0, simpo_gamma=0.5):
    return SimpleNamespace(
        alpha=0.0,
        loss_type=loss_type,
        beta=beta,
        label_smoothing=label_smoothing,
        simpo_gamma=simpo_gamma,
        accelerator=_accelerator(),
    )


@pytest.mark.parametrize(("beta", "gamma"), [(2.0, 1.0), (2.5, 0.3)])
def test_simpo_equals_trl_cpotrainer_simpo(beta, gamma):
    from trl.experimental.cpo import CPOTrainer

    _, _, cm, per_tok = _batch(2)
    x = _ours(per_tok, cm)
    # CPOTrainer(loss_type="simpo") feeds cpo_loss the length-averaged log-probs
    avg_w, avg_l = x.chosen_logps / x.chosen_tokens, x.rejected_logps / x.rejected_tokens
    losses, rw, rr = CPOTrainer.cpo_loss(_cpo_self("simpo", beta, simpo_gamma=gamma), avg_w, avg_l)
    loss, m = get_preference_loss("simpo")(x, beta=beta, gamma=gamma)
    assert float(loss) == pytest.approx(float(losses.mean()), rel=1e-12)
    assert float(m["rewards/chosen"]) == pytest.approx(float(rw.mean()), rel=1e-12)
    assert float(m["rewards/rejected"]) == pytest.approx(float(rr.mean()), rel=1e-12)


@pytest.mark.parametrize(("beta", "eps"), [(0.1, 0.1), (0.6, 0.3)])
def test_cdpo_label_smoothing_equals_trl_conservative_sigmoid(beta, eps):
    from trl.experimental.cpo import CPOTrainer

    _, _, cm, per_tok = _batch(3)
    ref = per_tok.sum(1) - torch.linspace(-1.0, 2.0, 2 * B, dtype=F64)
    x = _ours(per_tok, cm, ref)
    lr_w, lr_l = x.chosen_logps - x.ref_chosen_logps, x.rejected_logps - x.ref_rejected_logps
    losses, _, _ = CPOTrainer.cpo_loss(_cpo_self("sigmoid", beta, label_smoothing=eps), lr_w, lr_l)
    loss, _ = get_preference_loss("dpo")(x, beta=beta, label_smoothing=eps)
    assert float(loss) == pytest.approx(float(losses.mean()), rel=1e-12)


@pytest.mark.parametrize("beta", [0.1, 0.8])
def test_orpo_equals_trl_orpotrainer(beta):
    from trl.experimental.orpo import ORPOTrainer

    _, _, cm, per_tok = _batch(4)
    x = _ours(per_tok, cm)
    avg_w, avg_l = x.chosen_logps / x.chosen_tokens, x.rejected_logps / x.rejected_tokens
    trl_self = SimpleNamespace(beta=beta, accelerator=_accelerator())
    losses, rw, _, _, log_odds = ORPOTrainer.odds_ratio_loss(trl_self, avg_w, avg_l)
    # concatenated_forward's nll: CrossEntropyLoss (token mean) over the chosen rows' completion tokens
    chosen_tok = per_tok[:B][cm[:B, 1:].bool()]
    trl_loss = -chosen_tok.mean() - losses.mean()  # get_batch_loss_metrics: policy_nll_loss − losses.mean()
    loss, m = get_preference_loss("orpo")(x, beta=beta)
    # odds_ratio_loss casts its inputs to float32 (``.float()``): equal to float32 rounding
    assert float(loss) == pytest.approx(float(trl_loss), rel=1e-6)
    assert float(m["log_odds_ratio"]) == pytest.approx(float(log_odds), rel=1e-6)
    assert float(m["rewards/chosen"]) == pytest.approx(float(rw.mean()), rel=1e-6)
