"""DuCA/HIAN token advantages drive a real multi-turn update."""

from __future__ import annotations

import torch
from torch import nn

from posttrain.algos import get_policy_loss
from posttrain_lab.recipes.duca.advantages import hian_advantages

# the toy policy of tests/algos/test_algos_e2e.py

V, T, PROMPTS, G = 6, 5, 4, 8
GOOD = 2  # the rewarded token


class TinyPolicy(nn.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(V + PROMPTS, 16)
        self.pos = nn.Parameter(0.1 * torch.randn(T, 16, generator=gen))
        self.out = nn.Linear(16, V)
        with torch.no_grad():
            for p in (self.emb.weight, self.out.weight):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            self.out.bias.zero_()

    def logits(self, prompt: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """(B,), (B, T) -> (B, T, V) logits of token t given the prompt and token t−1."""
        prev = torch.cat([prompt.unsqueeze(-1) + V, tokens[:, :-1]], dim=1)
        return self.out(torch.tanh(self.emb(prev) + self.pos))

    def logp(self, prompt, tokens):
        return torch.log_softmax(self.logits(prompt, tokens), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def sample(self, prompt, gen):
        tokens = torch.zeros(prompt.shape[0], T, dtype=torch.long)
        for t in range(T):
            probs = torch.softmax(self.logits(prompt, tokens)[:, t], -1)
            tokens[:, t] = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
        return tokens


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
