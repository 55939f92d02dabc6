"""KPIG-style information gain, replay allocation (KPIG-style, RGD-R, uniform) and the hinge objective.

KPIG: He et al., "Don't Half-listen: Capturing Key-part Information in Continual Instruction
Tuning", arXiv 2403.10056 (no public code). The formulas below are a **proposed design** after the
paper's abstract ("KPIG-style"): information gain on masked key parts drives dynamic replay and a
refined objective.

Information gain of a sample (token-normalised; ``I^m`` = instruction with key parts masked):

    IG(I, x, y) = (1/|y|) · [ log p_θ(y | I, x) − log p_θ(y | I^m, x) ]

High IG: the model uses the key part; IG ≈ 0: it "half-listens".

Replay: a memory per finished task; while training task t+1 a budget of R replay samples is split
over the old tasks by largest remainders of the shares

* ``uniform``: equal;
* ``kpig`` (proposed design): ∝ (IG_at_learning − IG_now)_+ (uniform when no task dropped);
* ``rgd-r`` (Sun et al., "Unveiling and Addressing Pseudo Forgetting in LLMs", ACL 2025, repo
  BIT-NLP/Pseudo-Forgetting): α_j = RGD_j / Σ_k RGD_k, RGD_j = PPL_now(y | I, x) / PPL_at_learning(y | I, x)
  over task j's memory (its gold responses given the instruction).

Hinge objective (proposed design): L = L_NLL + λ · mean_i max(0, γ − IG_i). With
``masked_branch_grad=False`` the masked forward is no-grad, so the hinge only up-weights the NLL of
samples whose IG is below γ; with True it also pushes log p(y | I^m, x) down (risk of degenerate
unlikelihood).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from posttrain.models.logprobs import pad_right
from posttrain_lab.studies.cit.data import (
    DEFAULT_MASK,
    DEFAULT_PROMPT_FORMAT,
    EncodedInstruction,
    encode_instruction,
)


# ---------------------------------------------------------------------------------- scoring
def token_logprobs_of(model: Any, ids: torch.Tensor, am: torch.Tensor, lm: torch.Tensor) -> torch.Tensor:
    """(B, T) log p(x_t | x_<t) on ``lm`` positions (0 elsewhere). Hugging Face causal LMs go through
    the memory-lean :func:`~posttrain.models.sequence_logprobs`; any other ``nn.Module`` is called as
    ``model(input_ids=, attention_mask=)`` and must return logits (or an object with ``.logits``)."""
    if hasattr(model, "get_output_embeddings"):
        from posttrain.models import sequence_logprobs

        return sequence_logprobs(model, ids, am, response_mask=lm)[0]
    out = model(input_ids=ids, attention_mask=am)
    logits = getattr(out, "logits", out)
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    res = torch.zeros(ids.shape, dtype=lp.dtype, device=lp.device)
    res[:, 1:] = lp
    return res * lm


def _device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def _encoded(examples: Sequence[Any], tokenizer: Any, **kw: Any) -> list[EncodedInstruction]:
    return [
        e if isinstance(e, EncodedInstruction) else encode_instruction(e, tokenizer, **kw) for e in examples
    ]


@torch.no_grad()
def response_logprobs(
    model: Any, tokenizer: Any, encoded: Sequence[EncodedInstruction], *, masked: bool, batch_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ log p(y | prompt), |y|) per sample, float64, for the original or the masked prompt."""
    pad = tokenizer.pad_token_id or 0
    dev = _device(model)
    sums, lens = [], []
    was = getattr(model, "training", False)
    model.eval()
    try:
        for s in range(0, len(encoded), batch_size):
            chunk = [e.sft_example(masked=masked) for e in encoded[s : s + batch_size]]
            ids, am, lm = pad_right([c.input_ids for c in chunk], pad, [c.loss_mask for c in chunk])
            lp = token_logprobs_of(model, ids.to(dev), am.to(dev), lm.to(dev))
            sums.append(lp.double().sum(1).cpu())
            lens.append(lm.sum(1).double())
    finally:
        model.train(was)
    if not sums:
        return torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
    return torch.cat(sums), torch.cat(lens)


@torch.no_grad()
def information_gain(
    model: Any,
    tokenizer: Any,
    examples: Sequence[Any],
    *,
    batch_size: int = 64,
    mask: str = DEFAULT_MASK,
    prompt_format: str = DEFAULT_PROMPT_FORMAT,
    chat: bool = False,
) -> torch.Tensor:
    """KPIG-style IG per sample (module docstring), float64 (N,), in nats per response token.
    ``examples``: :class:`~posttrain_lab.studies.cit.data.InstructionExample` (encoded here with ``prompt_format``,
    ``chat``, ``mask``) or already :class:`~posttrain_lab.studies.cit.data.EncodedInstruction`. Batched, no grad;
    a sample without key parts has IG 0."""
    enc = _encoded(examples, tokenizer, prompt_format=prompt_format, chat=chat, mask=mask)
    full, n = response_logprobs(model, tokenizer, enc, masked=False, batch_size=batch_size)
    masked, _ = response_logprobs(model, tokenizer, enc, masked=True, batch_size=batch_size)
    ig = (full - masked) / n.clamp_min(1)
    has_key = torch.tensor([any(e.key_mask) for e in enc], dtype=torch.bool)
    return torch.where(has_key, ig, torch.zeros_like(ig))


@torch.no_grad()
def response_perplexity(
    model: Any, tokenizer: Any, encoded: Sequence[EncodedInstruction], batch_size: int = 64
) -> float:
    """exp(token-mean NLL of the responses given the full instruction) over ``encoded``."""
    s, n = response_logprobs(model, tokenizer, encoded, masked=False, batch_size=batch_size)
    return math.exp(float(-s.sum() / n.sum().clamp_min(1)))


# --------------------------------------------------------------------------------- allocation
def largest_remainder(
    shares: Mapping[str, float], budget: int, caps: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Integers summing to ``budget`` (or to Σ caps when smaller) proportional to ``shares``
    (Hamilton / largest-remainder rounding; ties by key order); each at most ``caps[k]``."""
    keys = list(shares)
    if not keys or budget <= 0:
        return dict.fromkeys(keys, 0)
    caps = dict(caps or {})
    out = dict.fromkeys(keys, 0)
    left = min(budget, sum(caps.get(k, budget) for k in keys))
    active = [k for k in keys if caps.get(k, budget) > 0]
    while left > 0 and active:
        w = [max(float(shares[k]), 0.0) for k in active]
        tot = sum(w)
        w = [x / tot for x in w] if tot > 0 else [1.0 / len(active)] * len(active)
        quota = [x * left for x in w]
        give = {k: math.floor(q) for k, q in zip(active, quota, strict=True)}
        rem = left - sum(give.values())
        order = sorted(range(len(active)), key=lambda i: (-(quota[i] - math.floor(quota[i])), i))
        for i in order[:rem]:
            give[active[i]] += 1
        for k in active:
            room = caps.get(k, budget + 1) - out[k]
            g = min(give[k], room)
            out[k] += g
            left -= g
        active = [k for k in active if out[k] < caps.get(k, budget + 1)]
    return out


def uniform_allocation(
    tasks: Sequence[str], budget: int, caps: Mapping[str, int] | None = None
) -> dict[str, int]:
    return largest_remainder(dict.fromkeys(tasks, 1.0), budget, caps)


def kpig_allocation(
    ig_at_learning: Mapping[str, float],
    ig_now: Mapping[str, float],
    budget: int,
    caps: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """KPIG-style (proposed design): budget per old task ∝ (IG_at_learning − IG_now)_+; uniform when
    no task's IG dropped."""
    drops = {k: max(float(ig_at_learning[k]) - float(ig_now[k]), 0.0) for k in ig_at_learning}
    if sum(drops.values()) <= 0:
        return uniform_allocation(list(drops), budget, caps)
    return largest_remainder(drops, budget, caps)


def rgd_allocation(
    ppl_at_learning: Mapping[str, float],
    ppl_now: Mapping[str, float],
    budget: int,
    caps: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """RGD-R (Sun et al., ACL 2025): α_j = RGD_j / Σ_k RGD_k, RGD_j = PPL_now / PPL_at_learning."""
    rgd = {k: float(ppl_now[k]) / max(float(ppl_at_learning[k]), 1e-12) for k in ppl_at_learning}
    return largest_remainder(rgd, budget, caps)


# ---------------------------------------------------------------------------------- objective
def hinge_term(
    ig: torch.Tensor, *, gamma: float, lam: float, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """λ · Σ_i w_i · max(0, γ − IG_i) (the caller divides by the batch's row count)."""
    h = torch.clamp(gamma - ig, min=0.0)
    if weight is not None:
        h = h * weight
    return lam * h.sum()


class HingeLoss:
    """``extra_loss`` hook of :class:`~posttrain.train.sft.SFTTrainer`: the KPIG-style hinge
    ``λ · max(0, γ − IG_i)`` per row, divided by the batch's row count. ``masked[i]`` is the masked
    (``I^m``) version of ``trainer.examples[i]`` (None: no key part, no hinge)."""

    def __init__(
        self,
        masked: Sequence[Any],
        *,
        lam: float = 0.1,
        gamma: float = 0.05,
        masked_branch_grad: bool = False,
    ) -> None:
        self.masked = list(masked)
        self.lam, self.gamma, self.masked_branch_grad = lam, gamma, masked_branch_grad

    def __call__(
        self, trainer: Any, idx: list[int], logp: torch.Tensor, loss_mask: torch.Tensor, batch_rows: int
    ) -> torch.Tensor:
        rows = [r for r, i in enumerate(idx) if self.masked[i] is not None]
        if not rows:
            return logp.sum() * 0.0
        full = (logp * loss_mask).sum(1)[rows]
        n = loss_mask.sum(1)[rows].to(logp.dtype)
        ids, am, lm = trainer.collate([idx[r] for r in rows], self.masked)
        if self.masked_branch_grad:
            mlp, _ = trainer.train_lm.logprobs(ids, am, lm, chunk_size=trainer.cfg.logprob_chunk_size)
        else:
            with torch.no_grad():
                mlp, _ = trainer.lm.logprobs(ids, am, lm, chunk_size=trainer.cfg.logprob_chunk_size)
        ig = (full - (mlp * lm).sum(1)) / n
        return hinge_term(ig, gamma=self.gamma, lam=self.lam) / batch_rows
