"""posttrain.integrations.verl against verl's real registries (verl/trainer/ppo/core_algos.py).

verl cannot be installed into the test environment with its dependencies (it pins transformers<5.11
and pulls Ray); these tests run where ``verl.trainer.ppo.core_algos`` imports (e.g. ``pip install
--no-deps verl`` plus ray, tensordict, omegaconf) and are skipped, visibly, elsewhere. The import
error test runs everywhere."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from posttrain.algos import get_policy_loss


def test_import_without_verl_names_the_extra(monkeypatch):
    for mod in ("verl", "verl.trainer", "verl.trainer.ppo", "verl.trainer.ppo.core_algos"):
        monkeypatch.setitem(sys.modules, mod, None)
    monkeypatch.delitem(sys.modules, "posttrain.integrations.verl", raising=False)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[verl\]"'):
        importlib.import_module("posttrain.integrations.verl")
    monkeypatch.delitem(sys.modules, "posttrain.integrations.verl", raising=False)


@pytest.fixture(scope="module")
def verl():
    core = pytest.importorskip(
        "verl.trainer.ppo.core_algos", reason="verl is not importable here (pip install -e '.[verl]')"
    )
    from verl.workers.config import ActorConfig

    integ = importlib.import_module("posttrain.integrations.verl")
    yield core, integ, ActorConfig
    integ.register({})  # leave the default parameters for other tests


def _tensors(seed=0, b=6, t=9):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    logp = (old + torch.randn(b, t, generator=g) * 0.4).requires_grad_(True)
    adv = torch.randn(b, t, generator=g)
    mask = (torch.rand(b, t, generator=g) > 0.2).float()
    mask[0] = 0  # one fully padded row
    return old, logp, adv, mask


def _cfg(actor_config, **kw):
    return actor_config(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=2, **kw)


@pytest.mark.parametrize("name", ["dgpo", "maspo"])
def test_verl_registry_resolves_posttrain_objectives_with_equal_values(verl, name):
    core, integ, actor_config = verl
    integ.register({})
    fn = core.get_policy_loss_fn(name)
    assert (
        fn.__module__ == "posttrain.integrations.verl" and core.get_policy_loss_fn(f"posttrain_{name}") is fn
    )
    old, logp, adv, mask = _tensors()
    loss_v, metrics = fn(
        old_log_prob=old,
        log_prob=logp,
        advantages=adv,
        response_mask=mask.bool(),
        loss_agg_mode="token-mean",
        config=_cfg(actor_config),
    )
    (g_v,) = torch.autograd.grad(loss_v, logp)
    loss_p, m_p = get_policy_loss(name)(logp, old, adv, mask)
    (g_p,) = torch.autograd.grad(loss_p, logp)
    torch.testing.assert_close(loss_v, loss_p, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g_v, g_p, rtol=1e-6, atol=1e-8)
    assert metrics["actor/ppo_kl"] == pytest.approx(float(m_p["approx_kl"]), rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(float(m_p["clipfrac"]), abs=1e-6)
    assert all(isinstance(v, float) for v in metrics.values())


def test_posttrain_ppo_equals_verl_vanilla_including_dp_scaling_and_is_weights(verl):
    """The adapter maps verl's clip ratios, dual clip, rollout IS weights and global batch info exactly
    as verl's own PPO loss does (same tensors, same config)."""
    core, integ, actor_config = verl
    integ.register({})
    old, logp, adv, mask = _tensors(3)
    isw = torch.rand_like(old) + 0.5
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum"):
        cfg = _cfg(actor_config, clip_ratio_low=0.1, clip_ratio_high=0.3, loss_agg_mode=agg)
        cfg.global_batch_info.update(dp_size=2, batch_num_tokens=71, global_batch_size=11)
        kw = dict(
            old_log_prob=old,
            log_prob=logp,
            advantages=adv,
            response_mask=mask.bool(),
            loss_agg_mode=agg,
            config=cfg,
            rollout_is_weights=isw,
        )
        ours, m_ours = core.get_policy_loss_fn("posttrain_ppo")(**kw)
        theirs, m_theirs = core.get_policy_loss_fn("vanilla")(**kw)
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
        for k in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
            if k == "actor/pg_clipfrac_lower":  # verl: dual-clipped fraction; ours: low-clip fraction
                continue
            assert m_ours[k] == pytest.approx(m_theirs[k], abs=1e-6), (agg, k)


def test_verl_names_are_kept_and_params_come_from_env(verl, monkeypatch):
    core, integ, actor_config = verl
    assert core.get_policy_loss_fn("gspo").__module__ == "verl.trainer.ppo.core_algos"
    assert core.get_policy_loss_fn("sapo").__module__ == "verl.trainer.ppo.core_algos"
    monkeypatch.setenv("POSTTRAIN_VERL_PARAMS", '{"dgpo": {"dgpo_n": 2}}')
    added = integ.register()
    assert added["dgpo"] == "dgpo" and "gspo" not in added and added["posttrain_gspo"] == "gspo"
    old, logp, adv, mask = _tensors(5)
    adv = -adv.abs() - 0.5  # negative advantages and low ratios: DGPO's LN region, where n matters
    logp = (old - 1.0).requires_grad_(True)
    lv, _ = core.get_policy_loss_fn("dgpo")(old, logp, adv, mask, "token-mean", _cfg(actor_config))
    torch.testing.assert_close(lv, get_policy_loss("dgpo")(logp, old, adv, mask, dgpo_n=2)[0])
    assert not torch.allclose(lv, get_policy_loss("dgpo")(logp, old, adv, mask, dgpo_n=1)[0])
    monkeypatch.setenv("POSTTRAIN_VERL_PARAMS", '{"dgpo": {"dgpo_k": 2}}')
    with pytest.raises(TypeError, match="dgpo_k"):
        integ.register()
    monkeypatch.setenv("POSTTRAIN_VERL_PARAMS", "{not json")
    with pytest.raises(ValueError, match="POSTTRAIN_VERL_PARAMS is not valid JSON"):
        integ.register()
