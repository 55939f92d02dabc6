"""DuCA/HIAN token advantages drive a real multi-turn update."""

from __future__ import annotations

import torch
from tiny_policy import GOOD, PROMPTS, G, T, TinyPolicy  # tests/helpers

from posttrain.algos import get_policy_loss
from posttrain_lab.recipes.duca.advantages import hian_advantages


def test_hian_token_advantages_drive_a_multi_turn_update():
    """DuCA/HIAN (proposed design): a session = 2 "turns" of the response; turn reward = rewarded token
    in that turn, session reward = both turns good. Per-token (B, T) advantages go into the loss."""
    gen = torch.Generator().manual_seed(5)
    policy = TinyPolicy(seed=6)
    opt = torch.optim.Adam(policy.parameters(), lr=0.05)
    spans = [[(0, 2), (2, T)]] * (PROMPTS * G)
    rewards = []
    for _ in range(25):
        prompt = torch.arange(PROMPTS).repeat_interleave(G)
        tokens = policy.sample(prompt, gen)
        good = (tokens == GOOD).float()
        turn_r = [torch.stack([good[i, :2].mean(), good[i, 2:].mean()]) for i in range(len(prompt))]
        sess_r = torch.stack([(tr > 0).all().float() for tr in turn_r])
        adv = hian_advantages(sess_r, prompt, turn_r, spans, T)
        mask = adv != 0
        with torch.no_grad():
            old = policy.logp(prompt, tokens)
        loss, _ = get_policy_loss("ppo")(policy.logp(prompt, tokens), old, adv, torch.ones_like(mask))
        opt.zero_grad()
        loss.backward()
        opt.step()
        rewards.append(good.mean().item())
    assert sum(rewards[:3]) / 3 < 0.3 < 0.5 < sum(rewards[-3:]) / 3
