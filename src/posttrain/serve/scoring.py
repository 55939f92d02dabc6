"""Token log-probabilities for the server's ``logprobs`` / ``echo`` fields, computed as the trainer does.

:func:`score_tokens` runs the model's decoder once over right-padded rows
(:class:`posttrain.models.CausalLMHidden`, position ids ``cumsum(mask) − 1``) and applies the
trainer's chunked head, :func:`posttrain.models.token_logprobs`, at every position: the log-prob of
token t given tokens < t is the number ``sequence_logprobs`` (the trainer's recomputation) gives for
that token (``tests/serve/test_completions.py`` checks it; docs/serve.md states the tolerance). The
``top`` alternatives of a position come from the same hidden state, one ``chunk_size x V`` block of
logits at a time; where the scored token is among them, its value is the scored number itself, so a
client's "is the token the most likely one" test (lm-eval's ``is_greedy``) compares equal numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from posttrain.models.logprobs import (
    DEFAULT_CHUNK_SIZE,
    CausalLMHidden,
    pad_right,
    position_ids_from_attention_mask,
    token_logprobs,
)


@dataclass
class TokenScores:
    """One row: ``logprobs[t] = log p(ids[t] | ids[:t])`` (None at t = 0, which has no context);
    ``top[t]`` the ``top_k`` most likely (id, log-prob) at position t, most likely first (None at 0);
    ``next_top`` the same for the token after the last one (when ``with_next`` was asked)."""

    ids: list[int]
    logprobs: list[float | None]
    top: list[list[tuple[int, float]] | None] = field(default_factory=list)
    next_top: list[tuple[int, float]] | None = None


def _head(model: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    head = model.get_output_embeddings()
    return head.weight, getattr(head, "bias", None)


def _top(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, k: int, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, ids), each (N, k): the k largest log-softmax entries of each row of ``h @ W^T + b``."""
    vals, ids = [], []
    for s in range(0, h.shape[0], chunk_size):
        z = h[s : s + chunk_size] @ weight.T
        if bias is not None:
            z = z + bias
        lp = torch.log_softmax(z.float(), dim=-1)
        v, i = lp.topk(k, dim=-1)
        vals.append(v)
        ids.append(i)
    if not vals:
        return torch.zeros(0, k), torch.zeros(0, k, dtype=torch.long)
    return torch.cat(vals), torch.cat(ids)


@torch.inference_mode()
def score_tokens(
    model: Any,
    seqs: list[list[int]],
    *,
    top_k: int = 0,
    with_next: bool = False,
    pad_id: int = 0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> list[TokenScores]:
    """Per-token log-probs (and the ``top_k`` alternatives per position) of each sequence in ``seqs``
    under ``model`` (a Hugging Face causal LM) at temperature 1. ``with_next`` also returns the
    ``max(top_k, 1)`` most likely next tokens after each sequence (greedy continuation, one token)."""
    if not seqs:
        return []
    device = next(model.parameters()).device
    ids, attn, _ = pad_right(seqs, pad_id)
    ids, attn = ids.to(device), attn.to(device)
    pos = position_ids_from_attention_mask(attn)
    width = ids.shape[1] if with_next else ids.shape[1] - 1
    if width < 1:
        return [TokenScores(list(s), [None] * len(s), [None] * len(s)) for s in seqs]
    hidden = CausalLMHidden(model)(ids[:, :width], attn[:, :width], pos[:, :width])
    weight, bias = _head(model)
    hidden = hidden.to(weight.dtype)
    out = []
    for r, seq in enumerate(seqs):
        n = len(seq)
        h = hidden[r, : n - 1]
        lp, _ = token_logprobs(h, weight, ids[r, 1:n], lm_head_bias=bias, chunk_size=chunk_size)
        logprobs: list[float | None] = [None, *(float(x) for x in lp.tolist())]
        top: list[list[tuple[int, float]] | None] = [None] * n
        if top_k > 0 and n > 1:
            vals, tids = _top(h, weight, bias, top_k, chunk_size)
            for t in range(n - 1):
                target, own = seq[t + 1], logprobs[t + 1]
                top[t + 1] = [
                    (int(i), own if int(i) == target else float(v))
                    for v, i in zip(vals[t].tolist(), tids[t].tolist(), strict=True)
                ]
        next_top = None
        if with_next:
            v, i = _top(hidden[r, n - 1 : n], weight, bias, max(top_k, 1), chunk_size)
            next_top = [(int(a), float(b)) for b, a in zip(v[0].tolist(), i[0].tolist(), strict=True)]
        out.append(TokenScores(list(seq), logprobs, top, next_top))
    return out
