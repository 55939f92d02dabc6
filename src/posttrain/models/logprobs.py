"""Memory-lean token log-probabilities and entropies from final hidden states.

For hidden states h_n (H), an LM head W (V x H) with optional bias b, a temperature τ and targets y_n:

    z_n      = (W h_n + b) / τ                               (temperature-scaled logits, V values)
    lse_n    = log Σ_v exp(z_nv)
    logp_n   = z_{n,y_n} − lse_n                             (log softmax at the target)
    H_n      = lse_n − Σ_v p_nv z_nv,  p_n = softmax(z_n)    (entropy of the same distribution)

`token_logprobs` computes these chunk by chunk over tokens, so only a (chunk_size x V) block of logits
exists at any time instead of the full (N x V) matrix (at V = 152k, N = 4096 that matrix alone is
2.5 GB in fp32). Its backward recomputes each chunk's logits and applies the closed-form gradients

    ∂logp_n/∂z_n = onehot(y_n) − p_n
    ∂H_n/∂z_n    = −p_n ⊙ (z_n − E_{p_n}[z_n]) = −p_n ⊙ (log p_n + H_n)

then ∂/∂logits = (∂/∂z)/τ, ∂/∂h_n = W^T ∂/∂logits_n, ∂/∂W = Σ_n ∂/∂logits_n h_n^T, ∂/∂b = Σ_n ∂/∂logits_n.
This is the same recompute-in-backward idea as Liger-Kernel's fused linear cross-entropy
(Hsu et al., 2024, arXiv:2410.10989) and verl's `linear_cross_entropy`, extended to also return the
entropy with its gradient (the E3 temperature controller and entropy bonuses need it).
The softmax math runs in float32 (float64 for float64 inputs) whatever the input dtype.

`sequence_logprobs` runs any Hugging Face causal LM's base model (or, under data-parallel training,
the wrapper's forward around it, :class:`CausalLMHidden`) and applies `token_logprobs` at the
positions that matter. Position ids follow `transformers` generate (v5):
`position_ids = cumsum(attention_mask) − 1`, set to 0 at padding, so a left-padded prompt gets the same
positions during scoring as it got during generation.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from posttrain.models.precision import autocast_dtype
from posttrain.utils.errors import InvalidValueError

DEFAULT_CHUNK_SIZE = 1024


class _Buffers:
    """Work buffers reused by every chunk: two (C, V) in the compute dtype, plus one (C, V) in the
    input dtype when that differs (bf16/fp16 matmul output). Reuse keeps the memory bound explicit
    and avoids re-faulting fresh pages for every chunk on CPU."""

    def __init__(self, rows: int, vocab: int, cdtype: torch.dtype, in_dtype: torch.dtype, device: Any):
        self.z = torch.empty(rows, vocab, dtype=cdtype, device=device)
        self.p = torch.empty_like(self.z)
        self.low = None if in_dtype == cdtype else torch.empty(rows, vocab, dtype=in_dtype, device=device)


def _logits_into(
    buf: _Buffers, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, inv_t: float
) -> torch.Tensor:
    """(C, V) temperature-scaled logits of one chunk, in the compute dtype, written into `buf.z`."""
    c = h.shape[0]
    z = buf.z[:c]
    out = z if buf.low is None else buf.low[:c]
    if bias is None:
        torch.mm(h, weight.T, out=out)
    else:
        torch.addmm(bias, h, weight.T, out=out)
    if buf.low is not None:
        z.copy_(out)
    if inv_t != 1.0:
        z.mul_(inv_t)
    return z


class _ChunkedTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk_size: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        cdtype = torch.promote_types(hidden.dtype, torch.float32)
        inv_t = 1.0 / temperature
        logp = torch.empty(n, dtype=cdtype, device=hidden.device)
        entropy = torch.empty(n, dtype=cdtype, device=hidden.device)
        lse_all = torch.empty(n, dtype=cdtype, device=hidden.device)
        buf = _Buffers(min(chunk_size, n), weight.shape[0], cdtype, hidden.dtype, hidden.device)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            y = _logits_into(buf, hidden[s:e], weight, bias, inv_t)
            m = y.amax(dim=-1, keepdim=True)
            y.sub_(m)  # y = z − max z ≤ 0
            q = torch.exp(y, out=buf.p[: e - s])  # unnormalised probabilities, S = Σ q
            total = q.sum(dim=-1)
            log_total = total.log()
            # H = log S − Σ q·y / S: no cancellation since y ≤ 0 and log S ≤ log V; batched dot product
            dot = (q.unsqueeze(1) @ y.unsqueeze(2)).view(-1)
            entropy[s:e] = log_total - dot / total
            logp[s:e] = y.gather(1, targets[s:e, None]).view(-1) - log_total
            lse_all[s:e] = m.view(-1) + log_total
        del buf
        ctx.save_for_backward(hidden, weight, bias, targets, lse_all, entropy)
        ctx.inv_t = inv_t
        ctx.chunk_size = chunk_size
        ctx.cdtype = cdtype
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g_logp: torch.Tensor | None, g_ent: torch.Tensor | None) -> tuple[Any, ...]:
        hidden, weight, bias, targets, lse_all, entropy = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if g_logp is None and g_ent is None:
            return None, None, None, None, None, None
        n, cdtype, inv_t = hidden.shape[0], ctx.cdtype, ctx.inv_t
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=cdtype, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=cdtype, device=weight.device) if need_b else None
        buf = _Buffers(min(ctx.chunk_size, n), weight.shape[0], cdtype, hidden.dtype, hidden.device)
        for s in range(0, n, ctx.chunk_size):
            e = min(s + ctx.chunk_size, n)
            h = hidden[s:e]
            z = _logits_into(buf, h, weight, bias, inv_t)
            z.sub_(lse_all[s:e, None])  # log p
            p = torch.exp(z, out=buf.p[: e - s])
            # dz/τ with dz = g_logp·(onehot − p) − g_ent·p·(log p + H) = −p·(a·log p + b) + g_logp·onehot,
            # a = g_ent, b = g_logp + g_ent·H; built in place in the two (C, V) buffers (3 passes)
            if g_ent is not None:
                a_row = g_ent[s:e].to(cdtype)
                b_row = a_row * entropy[s:e]
                if g_logp is not None:
                    b_row = b_row + g_logp[s:e].to(cdtype)
                z.mul_((-inv_t) * a_row[:, None]).sub_(inv_t * b_row[:, None])
                dz = p.mul_(z)
            else:
                dz = p.mul_((-inv_t) * g_logp[s:e, None].to(cdtype))
            if g_logp is not None:
                rows = torch.arange(e - s, device=dz.device)
                dz.index_put_((rows, targets[s:e]), inv_t * g_logp[s:e].to(cdtype), accumulate=True)
            if grad_b is not None:
                grad_b.add_(dz.sum(0))
            if buf.low is not None:  # matmuls in the input dtype
                dz = buf.low[: e - s].copy_(dz)
            if grad_h is not None:
                torch.mm(dz, weight, out=grad_h[s:e])
            if grad_w is not None:
                if dz.dtype == cdtype:
                    grad_w.addmm_(dz.T, h)
                else:  # low-precision inputs: matmul in their dtype, accumulate over chunks in fp32
                    grad_w.add_(dz.T @ h)
        del buf
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        if grad_b is not None:
            grad_b = grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None


def token_logprobs(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    lm_head_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy), each of shape `targets.shape`, of softmax((hidden @ W^T + b) / temperature).

    `hidden` (..., H), `lm_head_weight` (V, H), `targets` (...) integer ids in [0, V),
    `lm_head_bias` (V,) or None. Never materialises more than `chunk_size` x V logits (see the module
    docstring for the formulas); differentiable w.r.t. hidden, weight and bias through BOTH outputs.
    Outputs are float32 (float64 for float64 inputs).
    """
    if not isinstance(temperature, int | float) or not temperature > 0:
        raise InvalidValueError(f"temperature must be a positive number, got {temperature!r}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise InvalidValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    if lm_head_weight.dim() != 2:
        raise InvalidValueError(f"lm_head_weight must be (V, H), got shape {tuple(lm_head_weight.shape)}")
    vocab, h_dim = lm_head_weight.shape
    if hidden.dim() < 1 or hidden.shape[-1] != h_dim:
        raise InvalidValueError(
            f"hidden must be (..., H={h_dim}) to match lm_head_weight {tuple(lm_head_weight.shape)}, "
            f"got shape {tuple(hidden.shape)}"
        )
    if tuple(targets.shape) != tuple(hidden.shape[:-1]):
        raise InvalidValueError(
            f"targets shape {tuple(targets.shape)} must equal hidden.shape[:-1] = {tuple(hidden.shape[:-1])}"
        )
    if targets.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise InvalidValueError(f"targets must be integer token ids, got dtype {targets.dtype}")
    if hidden.dtype != lm_head_weight.dtype:
        raise InvalidValueError(
            f"hidden dtype {hidden.dtype} differs from lm_head_weight dtype {lm_head_weight.dtype}"
        )
    if lm_head_bias is not None and tuple(lm_head_bias.shape) != (vocab,):
        raise InvalidValueError(f"lm_head_bias must be ({vocab},), got shape {tuple(lm_head_bias.shape)}")
    lead = targets.shape
    flat_h = hidden.reshape(-1, h_dim)
    flat_t = targets.reshape(-1).long()
    if flat_t.numel() and (int(flat_t.min()) < 0 or int(flat_t.max()) >= vocab):
        raise InvalidValueError(
            f"targets must be token ids in [0, {vocab}); got min {int(flat_t.min())}, max {int(flat_t.max())}"
        )
    if not flat_h.is_contiguous():
        flat_h = flat_h.contiguous()
    logp, entropy = _ChunkedTokenLogprobs.apply(
        flat_h, lm_head_weight, lm_head_bias, flat_t, float(temperature), chunk_size
    )
    return logp.view(lead), entropy.view(lead)


def naive_token_logprobs(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    lm_head_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference implementation of `token_logprobs` with full logits: logits -> log_softmax -> gather,
    entropy = −Σ softmax · log_softmax. Materialises (N, V); used by tests and `posttrain bench losses`."""
    logits = hidden @ lm_head_weight.T
    if lm_head_bias is not None:
        logits = logits + lm_head_bias
    logits = logits.to(torch.promote_types(hidden.dtype, torch.float32)) / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(torch.softmax(logits, dim=-1) * logp_all).sum(-1)
    return logp, entropy


def pad_right(
    seqs: list[list[int]], pad_id: int, masks: list[list[int]] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Right-pad token lists to (N, T) ``input_ids`` with their 0/1 ``attention_mask``, and the per-token
    ``masks`` (e.g. a loss mask, each as long as its sequence) padded with 0 the same way (None when
    not given): the layout of :func:`sequence_logprobs` and the model adapters' ``logprobs``. Left
    padding (prompts for generation): ``posttrain.rollout.pad_left``."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = None if masks is None else torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s, dtype=torch.long)
        attn[r, : len(s)] = 1
        if mask is not None:
            mask[r, : len(s)] = torch.tensor(masks[r], dtype=torch.long)
    return ids, attn, mask


def position_ids_from_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """`cumsum(mask) − 1`, 0 at padding: the position ids `transformers` generate uses for padded batches."""
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def _decoder_and_head(model: Any) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
    config = getattr(model, "config", None)
    for attr in ("final_logit_softcapping", "logit_scale"):
        if config is not None and getattr(config, attr, None) not in (None, 1.0):
            raise InvalidValueError(
                f"{type(model).__name__} post-processes logits ({attr}={getattr(config, attr)}); "
                "sequence_logprobs computes plain lm_head logits and does not support it"
            )
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or not hasattr(head, "weight"):
        raise InvalidValueError(f"{type(model).__name__} has no output embedding (lm_head); not a causal LM")
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None or decoder is model:
        decoder = getattr(model, "model", None)
    if decoder is None:
        raise InvalidValueError(
            f"{type(model).__name__}: cannot find the base decoder (get_decoder() / .model)"
        )
    return decoder, head.weight, getattr(head, "bias", None)


class CausalLMHidden(torch.nn.Module):
    """A causal LM whose ``forward`` returns the decoder's final hidden states (B, T, H), not logits.

    This is the module a data-parallel wrapper (``DistributedDataParallel``) wraps: the decoder then
    runs inside the wrapper's forward and the backward goes through it (gradient all-reduce), while
    the LM head is applied by :func:`token_logprobs` chunk by chunk, so the (B, T, V) logits are never
    built. ``lm`` is the wrapped Hugging Face model (its parameters, shared, not copied)."""

    def __init__(self, lm: Any) -> None:
        super().__init__()
        self.lm = lm
        _decoder_and_head(lm)  # fail at wrap time, not at the first forward

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        decoder, _, _ = _decoder_and_head(self.lm)
        out = decoder(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        return out[0] if isinstance(out, tuple) else out.last_hidden_state


def _hidden_and_head(model: Any) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
    """(function (input_ids, attention_mask, position_ids) -> hidden states, head weight, head bias).

    A plain causal LM: its base decoder. A :class:`CausalLMHidden`, or a wrapper of one (any module with
    ``.module``, e.g. ``DistributedDataParallel``): the wrapper's own forward (so DDP sees the forward
    and all-reduces the gradients), with the head of the wrapped LM."""
    inner = getattr(model, "module", None)
    if isinstance(inner, CausalLMHidden) or isinstance(model, CausalLMHidden):
        lm = (inner if isinstance(inner, CausalLMHidden) else model).lm
        _, weight, bias = _decoder_and_head(lm)
        return model, weight, bias
    decoder, weight, bias = _decoder_and_head(model)

    def run(
        input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        out = decoder(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        return out[0] if isinstance(out, tuple) else out.last_hidden_state

    return run, weight, bias


def sequence_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    response_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy), both (B, T) float32, for a Hugging Face causal LM.

    `logp[:, t] = log p(input_ids[:, t] | input_ids[:, :t])` under softmax(logits / temperature), and
    `entropy[:, t]` is the entropy of that same next-token distribution. Position 0 has no context and
    gets 0, as does every position whose token or whose preceding token is padding
    (`attention_mask == 0`).

    Two masks, two meanings: `attention_mask` says which tokens EXIST (the model attends to them and
    position ids count them); `response_mask` (B, T) says which of them to SCORE, e.g. the policy's
    action tokens of a multi-turn episode. Tokens that are attended but not scored (a prompt, an
    environment's reply between two policy turns) condition the scored ones exactly as in one plain
    forward over the whole sequence and get 0; the lm-head work is done for the scored tokens only.
    A scored position must be a real token preceded by a real token; violations raise ValueError
    naming the row and position.

    Works with left or right padding: `position_ids = cumsum(attention_mask) − 1` (0 at padding), the
    same ids `generate` used. Gradients flow to the model through both outputs.

    `model` may also be a :class:`CausalLMHidden` or a data-parallel wrapper of one
    (``DistributedDataParallel(CausalLMHidden(lm))``): the decoder then runs through the wrapper's
    forward, so its backward all-reduces the gradients (docs/distributed.md).
    """
    if input_ids.dim() != 2:
        raise InvalidValueError(f"input_ids must be (B, T), got shape {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise InvalidValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {tuple(input_ids.shape)}"
        )
    b, t = input_ids.shape
    real = attention_mask.bool()
    valid = torch.zeros_like(real)
    valid[:, 1:] = real[:, 1:] & real[:, :-1]
    if response_mask is not None:
        if response_mask.shape != input_ids.shape:
            raise InvalidValueError(
                f"response_mask shape {tuple(response_mask.shape)} != input_ids shape {tuple(input_ids.shape)}"
            )
        resp = response_mask.bool()
        bad = resp & ~valid
        if bad.any():
            row, pos = (int(x) for x in bad.nonzero()[0])
            why = (
                "position 0 has no context"
                if pos == 0
                else "the token is padding"
                if not real[row, pos]
                else "the preceding token is padding"
            )
            raise InvalidValueError(
                f"response_mask marks row {row}, position {pos}, but {why}; response tokens must be real "
                "tokens (attention_mask 1) preceded by a real token"
            )
        valid = resp
    hidden_fn, weight, bias = _hidden_and_head(model)
    if t < 2:  # no position has a context: nothing to score (same output dtype as token_logprobs)
        zeros = torch.zeros(
            b, t, dtype=torch.promote_types(weight.dtype, torch.float32), device=input_ids.device
        )
        return zeros, zeros.clone()
    position_ids = position_ids_from_attention_mask(attention_mask)
    # The last position's hidden state predicts nothing, so the decoder runs on T−1 positions (causal
    # attention: the outputs at 0..T−2 are unchanged); saves 1/T of the forward and backward.
    hidden = hidden_fn(input_ids[:, :-1], attention_mask[:, :-1], position_ids[:, :-1])
    # the head is read again AFTER the forward: under FSDP2 (fully_shard) the wrapper's forward swaps
    # the sharded head weight for the all-gathered one, which stays in place until the backward
    _, weight, bias = _hidden_and_head(model)
    # hidden at position t−1 predicts the token at t
    pred = valid[:, 1:]
    h_sel = hidden[pred]
    y_sel = input_ids[:, 1:][pred]
    low = autocast_dtype(input_ids.device)
    if low is None:
        lp, ent = token_logprobs(
            h_sel.to(weight.dtype),
            weight,
            y_sel,
            temperature=temperature,
            chunk_size=chunk_size,
            lm_head_bias=bias,
        )
    else:  # model.precision bf16 (autocast): the head's matmuls take bf16 operands (the cast is
        # differentiable, so the fp32 master weight gets the gradient); softmax math stays fp32, and
        # forward and backward recompute see the same operands (autocast off inside)
        with torch.autocast(input_ids.device.type, enabled=False):
            lp, ent = token_logprobs(
                h_sel.to(low),
                weight.to(low),
                y_sel,
                temperature=temperature,
                chunk_size=chunk_size,
                lm_head_bias=None if bias is None else bias.to(low),
            )
        lp, ent = lp.float(), ent.float()
    zeros = torch.zeros(b, t, dtype=lp.dtype, device=lp.device)
    return zeros.masked_scatter(valid, lp), zeros.masked_scatter(valid, ent)
