"""A tiny autoregressive policy over a 6-token vocabulary, for end-to-end loss tests without a model:
token t depends on the prompt and token t-1 (tests/algos/test_algos_e2e.py, the lab's DuCA tests)."""

from __future__ import annotations

import torch
from torch import nn

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
