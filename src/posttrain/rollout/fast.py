"""A leaner in-process rollout engine for CPU (``rollout.engine: {name: fast}``).

Same contract and sampler as :class:`~posttrain.rollout.hf.HFEngine` (the reference): the engine's own
``torch.Generator``, EOS suppression, temperature, top-p, the inverse-CDF draw
(:func:`posttrain.rollout.hf._draw`) and the log-prob of the sampled token under the distribution
actually sampled from. What it removes is overhead the compute does not need (profile in
docs/bench-generate.md):

* **its own decode loop** over the model's ``forward`` (no ``generate``: no logits-processor /
  stopping-criteria machinery, no per-step ``prepare_inputs_for_generation``), with
  ``logits_to_keep=1`` so the LM head runs on the last position only;
* **a pre-allocated KV cache** (:class:`PreallocLayer`): one buffer per layer sized for prompt + new
  tokens, written in place, instead of ``DynamicCache``'s ``torch.cat`` of the whole cache every step;
* **group prefill**: each prompt is prefilled once and its KV rows copied to its ``n`` completions
  (GRPO's G completions share the prompt), so the prefill costs P, not P x G, sequences;
* **finished rows dropped**: rows that sampled EOS leave the batch (their cache rows are compacted
  in place once a quarter of the batch has finished), so later steps run on live rows only.

Under greedy decoding in fp32 it produces the same tokens as the HF engine (tested); sampling log-probs
equal the training side's ``sequence_logprobs`` (tested: fp32 within 1e-4; bf16 measured, see docs).
``precision="bf16"`` runs the loop under ``torch.autocast(bfloat16)`` like the trainer does.

Limits: decoder-only models whose cache layers are all full attention (Llama, Qwen2/3, SmolLM2, ...);
a model with sliding-window or linear-attention layers falls back to ``DynamicCache``.
"""

from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from posttrain.models.precision import check_precision, precision_autocast
from posttrain.rollout.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    GeneratorStateMixin,
    RolloutBatch,
    RolloutEngine,
    SamplingParams,
    check_generate_args,
    eos_and_pad,
    pad_left,
)
from posttrain.rollout.hf import _draw, _nucleus
from posttrain.utils.errors import InvalidValueError, PosttrainRuntimeError


class PreallocLayer(DynamicLayer):
    """One layer's KV cache in a buffer pre-allocated for ``capacity`` positions; ``update`` writes
    the new positions in place and returns views of the filled part."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        b, h, _, d = key_states.shape
        self._k = key_states.new_empty((b, h, self.capacity, d))
        self._v = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def _views(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, s = key_states.shape[-2], self.length
        if s + n > self.capacity:
            raise PosttrainRuntimeError(
                f"PreallocLayer: {s + n} positions exceed the capacity {self.capacity}"
            )
        self._k[:, :, s : s + n] = key_states
        self._v[:, :, s : s + n] = value_states
        self.length = s + n
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` (may repeat rows: a prompt's cache copied to its completions)."""
        if not self.is_initialized:
            return
        n, L = len(indices), self.length
        if n <= self._k.shape[0] and bool((indices[1:] > indices[:-1]).all()):
            # compaction (ascending, no repeats): in place, filled part only
            self._k[:n, :, :L] = self._k[indices, :, :L]
            self._v[:n, :, :L] = self._v[indices, :, :L]
            self._k, self._v = self._k[:n], self._v[:n]
        else:
            self._k = self._k.index_select(0, indices)
            self._v = self._v.index_select(0, indices)
        self._views()


def _full_attention_only(config) -> bool:
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    return types is None or all(t == "full_attention" for t in types)


def _num_layers(config) -> int:
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return int(text.num_hidden_layers)


def sample_next(
    scores: torch.Tensor,
    params: SamplingParams,
    step: int,
    eos: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token (B,), logp (B,)) for next-token scores (B, V): the HF engine's sampler (EOS suppression,
    greedy or temperature + top-p, inverse-CDF draw), log-prob under the distribution sampled from
    (0 under greedy, as the HF engine records)."""
    scores = scores.float()
    if len(eos) and (params.suppress_eos or step < params.min_new_tokens):
        scores = scores.index_fill(1, eos, float("-inf"))
    if params.greedy:
        return scores.argmax(dim=-1), torch.zeros(scores.shape[0], device=scores.device)
    z = scores / params.temperature
    if params.top_p < 1.0:
        z = _nucleus(z, params.top_p)
    logp_all = torch.log_softmax(z, dim=-1)
    tok = _draw(logp_all.exp(), generator)
    return tok.squeeze(1), logp_all.gather(1, tok).squeeze(1)


class FastEngine(GeneratorStateMixin, RolloutEngine):
    """In-process decode loop over a ``transformers`` causal LM (see module docstring).

    max_batch_size: at most this many sequences per decode batch (whole prompt groups where they fit);
    max_batch_tokens: None, or at most this many padded positions per decode batch (rows x (its longest
    prompt + ``max_new_tokens``), at least one row); prompts are then batched shortest first, so one
    long prompt no longer pads a whole batch to its length (IFBench: one prompt of 2,561 SmolLM2
    tokens among a median of 63), and the batch comes back in the caller's order;
    precision: "fp32" or "bf16" (autocast); drop_finished: remove finished rows from the batch;
    compact_fraction: compact the cache once this fraction of the rows in it have finished.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        seed: int = 0,
        max_batch_size: int | None = None,
        eos_token_ids: list[int] | None = None,
        precision: str = "fp32",
        drop_finished: bool = True,
        compact_fraction: float = 0.25,
        max_batch_tokens: int | None = None,
    ) -> None:
        if not 0 < compact_fraction <= 1:
            raise InvalidValueError(f"FastEngine: compact_fraction must be in (0, 1], got {compact_fraction}")
        if max_batch_tokens is not None and not (isinstance(max_batch_tokens, int) and max_batch_tokens >= 1):
            raise InvalidValueError(
                f"FastEngine: max_batch_tokens must be None or an int >= 1, got {max_batch_tokens!r}"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.precision = check_precision(precision)
        self.drop_finished = drop_finished
        self.compact_fraction = compact_fraction
        self.eos_token_ids, self._pad_token_id = eos_and_pad(tokenizer, eos_token_ids, "FastEngine")
        device = next(model.parameters()).device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self._prealloc = _full_attention_only(model.config)
        self._layers = _num_layers(model.config)
        # transformers >= 5.2x names the cache argument `cache` (`past_key_values` deprecated)
        self._cache_kw = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )

    @property
    def pad_token_id(self) -> int:
        return self._pad_token_id

    def _chunks(self, n_per_prompt: list[int], widths: list[int]) -> list[list[tuple[int, int]]]:
        """Split (prompt index, copies) into decode batches of at most max_batch_size rows, whole prompt
        groups where they fit; with max_batch_tokens, prompts shortest first and at most that many
        padded positions per batch (``widths[i]``: prompt i's length plus the new tokens)."""
        cap = self.max_batch_size or sum(n_per_prompt)
        budget = self.max_batch_tokens
        order = list(range(len(n_per_prompt)))
        if budget is not None:
            order.sort(key=widths.__getitem__)
        out: list[list[tuple[int, int]]] = [[]]
        used = width = 0
        for i in order:
            n = n_per_prompt[i]
            while n > 0:
                rows = cap if budget is None else max(1, min(cap, budget // max(width, widths[i])))
                take = min(n, rows)
                if used + take > rows and out[-1]:
                    out.append([])
                    used = width = 0
                    continue
                out[-1].append((i, take))
                used, width, n = used + take, max(width, widths[i]), n - take
        return [c for c in out if c]

    def generate(
        self, prompt_ids: list[list[int]], n_per_prompt: list[int], params: SamplingParams
    ) -> RolloutBatch:
        check_generate_args(prompt_ids, n_per_prompt)
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        if not sum(n_per_prompt):
            raise InvalidValueError("generate: no sequences requested (all n_per_prompt are 0)")
        parts, groups = [], []
        widths = [len(p) + params.max_new_tokens for p in prompt_ids]
        for chunk in self._chunks(list(n_per_prompt), widths):
            chunk = [(i, n) for i, n in chunk if n > 0]
            parts.append(
                self._generate_chunk([prompt_ids[i] for i, _ in chunk], [n for _, n in chunk], params)
            )
            groups += [i for i, n in chunk for _ in range(n)]
        batch = RolloutBatch.concat(parts)
        if self.max_batch_tokens is not None:  # batched by length: back to the caller's order
            order = sorted(range(len(groups)), key=groups.__getitem__)
            batch, groups = batch.select(order), [groups[r] for r in order]
        batch.group_ids = torch.tensor(groups, dtype=torch.long)
        return batch

    def _new_cache(self, capacity: int) -> Cache:
        if self._prealloc:
            return Cache(layers=[PreallocLayer(capacity) for _ in range(self._layers)])
        return DynamicCache(config=self.model.config)

    @torch.no_grad()
    def _generate_chunk(
        self, prompts: list[list[int]], ns: list[int], params: SamplingParams
    ) -> RolloutBatch:
        model = self.model
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        try:
            with precision_autocast(device, self.precision):
                return self._decode(model, device, prompts, ns, params)
        finally:
            model.train(was_training)

    def _decode(self, model, device, prompts, ns, params: SamplingParams) -> RolloutBatch:
        p_ids, p_mask = pad_left(prompts, self.pad_token_id)
        p_ids, p_mask = p_ids.to(device), p_mask.to(device)
        width, t_max = p_ids.shape[1], params.max_new_tokens
        rep = torch.repeat_interleave(
            torch.arange(len(prompts), device=device), torch.tensor(ns, device=device)
        )
        n = len(rep)
        eos = torch.tensor(self.eos_token_ids, dtype=torch.long, device=device)
        # prefill each prompt once, then copy its cache rows to its completions
        cache = self._new_cache(width + t_max)
        pos = (p_mask.cumsum(-1) - 1).clamp_(min=0)
        out = model(
            input_ids=p_ids,
            attention_mask=p_mask,
            position_ids=pos,
            **{self._cache_kw: cache},
            use_cache=True,
            logits_to_keep=1,
        )
        scores = out.logits[:, -1][rep]
        cache.batch_select_indices(rep)
        attn = torch.ones((n, width + t_max), dtype=p_mask.dtype, device=device)
        attn[:, :width] = p_mask[rep]
        next_pos = pos[rep, -1] + 1
        tokens = torch.full((n, t_max), self.pad_token_id, dtype=torch.long, device=device)
        logps = torch.zeros((n, t_max), dtype=torch.float32, device=device)
        lengths = torch.full((n,), t_max, dtype=torch.long, device=device)
        stopped = torch.zeros(n, dtype=torch.bool, device=device)
        rows = torch.arange(n, device=device)  # original row of each batch row
        done = torch.zeros(n, dtype=torch.bool, device=device)  # finished but still in the batch
        steps = 0
        for t in range(t_max):
            tok, lp = sample_next(scores, params, t, eos, self.generator)
            tok = torch.where(done, torch.full_like(tok, self.pad_token_id), tok)
            tokens[rows, t] = tok
            logps[rows, t] = torch.where(done, torch.zeros_like(lp), lp)
            steps = t + 1
            if len(eos):
                fin = torch.isin(tok, eos) & ~done
                if bool(fin.any()):
                    lengths[rows[fin]] = t + 1
                    stopped[rows[fin]] = True
                    done = done | fin
            if bool(done.all()) or t + 1 == t_max:
                break
            if self.drop_finished and int(done.sum()) >= max(1.0, self.compact_fraction * len(rows)):
                keep = (~done).nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                rows, tok, next_pos, attn = rows[keep], tok[keep], next_pos[keep], attn[keep]
                done = done[keep]
            out = model(
                input_ids=tok[:, None],
                attention_mask=attn[:, : width + t + 1],
                position_ids=next_pos[:, None],
                **{self._cache_kw: cache},
                use_cache=True,
                logits_to_keep=1,
            )
            scores = out.logits[:, -1]
            next_pos = next_pos + 1
        completion = tokens[:, :steps]
        mask = (torch.arange(steps, device=device)[None, :] < lengths[:, None]).long()
        completion = completion.masked_fill(mask == 0, self.pad_token_id)
        reasons = [FINISH_STOP if s else FINISH_LENGTH for s in stopped.tolist()]
        return RolloutBatch(
            prompt_ids=p_ids[rep],
            prompt_mask=p_mask[rep],
            completion_ids=completion,
            completion_mask=mask,
            logprobs=(logps[:, :steps] * mask) if params.logprobs else None,
            finish_reasons=reasons,
            group_ids=torch.zeros(n, dtype=torch.long),
            pad_token_id=self.pad_token_id,
        )
