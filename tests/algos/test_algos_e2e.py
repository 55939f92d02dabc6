"""End to end through the real call path with a tiny autoregressive policy:
sample → reward → advantage → policy loss (+ KL) → backward → optimizer step.

The policy is a 2-layer torch model over a 6-token vocabulary; nothing is mocked. Every registered loss
must (a) learn a rewarded behaviour, and (b) give the same parameter gradient when the batch is split
into micro-batches with global counts (gradient accumulation)."""

from __future__ import annotations

import pytest
import torch
from tiny_policy import GOOD, PROMPTS, G, T, TinyPolicy  # tests/helpers

from posttrain.algos import (
    agg_loss,
    get_advantage,
    get_policy_loss,
    kl_penalty,
    list_policy_losses,
    policy_loss_default_agg,
)


def rollout(policy, gen):
    prompt = torch.arange(PROMPTS).repeat_interleave(G)
    tokens = policy.sample(prompt, gen)
    # variable response lengths: the response ends after the first token 5 (padding after it)
    stop = (tokens == 5).float().cumsum(-1)
    mask = (stop - (tokens == 5).float()) == 0
    reward = ((tokens == GOOD) & mask).float().sum(-1) / T
    return prompt, tokens, mask, reward


@pytest.mark.parametrize("name", list_policy_losses())
def test_every_loss_learns_the_rewarded_token(name):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    policy = TinyPolicy()
    ref = TinyPolicy()
    opt = torch.optim.Adam(policy.parameters(), lr=0.05)
    loss_fn = get_policy_loss(name)
    first = last = None
    off_policy = {"clipfrac": 0.0, "gated_frac": 0.0, "one_minus_gate": 0.0}
    for _ in range(20):
        prompt, tokens, mask, reward = rollout(policy, gen)
        adv = get_advantage("grpo")(reward, prompt)
        with torch.no_grad():
            old = policy.logp(prompt, tokens)
            ref_logp = ref.logp(prompt, tokens)
        for epoch in range(2):  # second epoch is off-policy: ratios ≠ 1, clipping/gates active
            logp = policy.logp(prompt, tokens)
            pg, metrics = loss_fn(logp, old, adv, mask)
            kl = agg_loss(kl_penalty(logp, ref_logp, "low_var_kl"), mask, "token-mean")
            loss = pg + 0.001 * kl
            opt.zero_grad()
            loss.backward()
            opt.step()
            assert torch.isfinite(loss)
            assert all(torch.isfinite(v) for v in metrics.values())
            if epoch == 0:  # on-policy: r = 1 exactly, nothing clipped or gated
                assert metrics["ratio_mean"].item() == pytest.approx(1.0, abs=1e-6)
                assert metrics["clipfrac"].item() == 0.0
            else:
                off_policy["clipfrac"] = max(off_policy["clipfrac"], metrics["clipfrac"].item())
                off_policy["gated_frac"] = max(off_policy["gated_frac"], metrics.get("gated_frac", 0.0))
                gate = metrics.get("gate_mean", torch.tensor(1.0)).item()
                off_policy["one_minus_gate"] = max(off_policy["one_minus_gate"], 1.0 - gate)
        first = reward.mean().item() if first is None else first
        last = reward.mean().item()
    # uniform policy starts near 1/6 of tokens rewarded; every objective must move well above it
    assert first < 0.3
    assert last > 0.5, f"{name}: mean reward {first:.2f} -> {last:.2f}"
    # the off-policy epoch really exercised the loss's trust-region mechanism
    if name in ("ppo", "dapo", "gspo", "cispo", "dgpo"):
        assert off_policy["clipfrac"] > 0.05
    else:  # sapo, maspo: soft gates
        assert off_policy["one_minus_gate"] > 0.005
    if name == "maspo":
        assert off_policy["gated_frac"] > 0.1


@pytest.mark.parametrize("name", list_policy_losses())
def test_gradient_accumulation_equals_full_batch(name):
    gen = torch.Generator().manual_seed(3)
    policy = TinyPolicy(seed=4)
    prompt, tokens, mask, reward = rollout(policy, gen)
    adv = get_advantage("rloo")(reward, prompt)
    with torch.no_grad():  # pretend one update happened: old ≠ current
        old = policy.logp(prompt, tokens) + 0.3 * torch.randn(tokens.shape, generator=gen)
    loss_fn = get_policy_loss(name)
    counts = {"global_tokens": int(mask.sum()), "global_seqs": int(mask.any(-1).sum()), "scale": float(T)}
    for agg in (policy_loss_default_agg(name), "seq-mean-token-sum-norm"):
        policy.zero_grad()
        loss_fn(policy.logp(prompt, tokens), old, adv, mask, agg=agg, **counts)[0].backward()
        full = [p.grad.clone() for p in policy.parameters()]
        policy.zero_grad()
        perm = torch.randperm(tokens.shape[0], generator=gen)
        for idx in perm.split(7):  # uneven micro-batches
            loss_fn(policy.logp(prompt[idx], tokens[idx]), old[idx], adv[idx], mask[idx], agg=agg, **counts)[
                0
            ].backward()
        for a, b in zip(full, (p.grad for p in policy.parameters()), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
        assert any(a.abs().sum() > 0 for a in full)
