"""Model adapters: the one object through which a trainer touches a model.

A trainer needs three things from a model: load it, score tokens (per-token log-probs and entropies under
a loss mask) and save it; sampling completions is the rollout layer's job (its engines take the
adapter's model and tokenizer). :class:`ModelAdapter` is that interface;
:class:`CausalLMAdapter` implements it for decoder-only Hugging Face models (every preset and every
local ``AutoModelForCausalLM`` directory). SFT goes through it, so another kind of model plugs in by
implementing the protocol and registering a loader, without forking the training loop::

    from posttrain.models import CausalLMAdapter, load_adapter

    lm = load_adapter("tiny", seed=0)                      # == CausalLMAdapter.load("tiny", seed=0)
    logp, entropy = lm.logprobs(input_ids, attention_mask, loss_mask)   # (B, T) each
    lm.save("runs/x/model")
    # sampling is the rollout layer's: posttrain.rollout.generate_completions(lm, [[5, 6, 7]], params)

Data layout (shared by every adapter)
------------------------------------
A batch is one token grid per row: ``input_ids`` (B, T), ``attention_mask`` (B, T) with 1 on real
tokens (what the model may attend to), and ``loss_mask`` (B, T) with 1 on the tokens whose
log-probabilities are wanted (completion tokens, assistant turns, a policy's actions). ``logprobs``
returns ``logp[b, t] = log p(input_ids[b, t] | row b's tokens before t)`` on that same grid, 0 where
``loss_mask`` is 0.

A sequence-to-sequence adapter (:class:`posttrain.models.seq2seq.Seq2SeqAdapter`, kind ``seq2seq``) keeps
the same grid and splits each row itself: the tokens before the row's first ``loss_mask`` position are
the encoder input, the rest the decoder sequence (teacher forcing), and the decoder's per-token
log-probs are written back at their grid positions, so SFT trains it unchanged. It decodes with beam
search; RL rollouts are decoder-only for now. Multi-turn rows (several loss
spans per row) are refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from posttrain.models.loading import load_model_and_tokenizer, pick_device
from posttrain.models.logprobs import DEFAULT_CHUNK_SIZE, sequence_logprobs
from posttrain.models.saving import save_model_dir
from posttrain.utils.errors import InvalidValueError
from posttrain.utils.registry import Registry


@runtime_checkable
class ModelAdapter(Protocol):
    """What trainers need from a model. ``model`` is the trainable ``torch.nn.Module`` (parameters,
    ``train()``/``eval()``, optimizer construction); ``tokenizer`` encodes and decodes text."""

    kind: str
    model: torch.nn.Module
    tokenizer: Any

    @property
    def device(self) -> torch.device: ...

    def logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp, entropy), each (B, T), nonzero only where ``loss_mask`` is 1; differentiable."""
        ...

    def save(self, path: str | Path) -> Path:
        """Write the model and tokenizer (safetensors, Hugging Face layout) atomically to ``path``."""
        ...


ADAPTERS: Registry[type] = Registry("model adapter", group="posttrain.model_adapters")
"""Adapter classes by kind; each has a ``load(spec, *, dtype, device, seed)`` class method. A plug-in
(``model.adapter: package.module:MyAdapter``) is any class with that ``load`` class method."""


def _adapter_class(obj: Any) -> type | None:
    return obj if isinstance(obj, type) and callable(getattr(obj, "load", None)) else None


ADAPTERS.accept(_adapter_class, "a model adapter class with a load(spec, *, dtype, device, seed) classmethod")


@ADAPTERS.register("causal-lm")
class CausalLMAdapter:
    """Decoder-only language model (``AutoModelForCausalLM``): log-probs by
    :func:`~posttrain.models.sequence_logprobs`; sampled by the rollout engines (``rollout.engine``)."""

    kind = "causal-lm"

    def __init__(self, model: torch.nn.Module, tokenizer: Any) -> None:
        if tokenizer is None:
            raise InvalidValueError("CausalLMAdapter: pass the tokenizer together with the model")
        self.model = model
        self.tokenizer = tokenizer

    @classmethod
    def load(
        cls, spec: str, *, dtype: Any = "float32", device: str = "auto", seed: int = 0
    ) -> CausalLMAdapter:
        """A preset name or a local Hugging Face model directory (see
        :func:`~posttrain.models.load_model_and_tokenizer`); ``device="auto"`` picks cuda when present."""
        dev = pick_device() if device == "auto" else device
        model, tokenizer = load_model_and_tokenizer(spec, dtype=dtype, device=dev, seed=seed)
        return cls(model, tokenizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return sequence_logprobs(
            self.model,
            input_ids,
            attention_mask,
            response_mask=loss_mask,
            temperature=temperature,
            chunk_size=chunk_size,
        )

    def save(self, path: str | Path) -> Path:
        return save_model_dir(self.model, self.tokenizer, path)


def load_adapter(
    spec: str, *, kind: str = "causal-lm", dtype: Any = "float32", device: str = "auto", seed: int = 0
) -> ModelAdapter:
    """Load ``spec`` with the adapter registered as ``kind`` (``ADAPTERS.names()``)."""
    return ADAPTERS.get(kind).load(spec, dtype=dtype, device=device, seed=seed)
