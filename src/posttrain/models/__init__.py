"""Model layer: tokenizer and model loading (tiny presets or local HF directories), memory-lean
token log-probabilities / entropies (`token_logprobs`, `sequence_logprobs`), and the model adapter
(`ModelAdapter`, `CausalLMAdapter`, `load_adapter`) through which trainers load, score, sample and save.

Importing this package imports torch; `transformers` is imported lazily by the loaders.
"""

from __future__ import annotations

from posttrain.models.adapter import ADAPTERS, CausalLMAdapter, ModelAdapter, load_adapter
from posttrain.models.loading import (
    ModelSpecError,
    ensure_pad_token,
    load_model_and_tokenizer,
    pick_device,
    resolve_dtype,
)
from posttrain.models.logprobs import (
    DEFAULT_CHUNK_SIZE,
    naive_token_logprobs,
    pad_right,
    position_ids_from_attention_mask,
    sequence_logprobs,
    token_logprobs,
)
from posttrain.models.precision import PRECISIONS, check_precision, precision_autocast
from posttrain.models.presets import PRESETS, Preset, build_preset_model, list_presets, preset_config
from posttrain.models.seq2seq import Seq2SeqAdapter
from posttrain.models.tokenizer import CHAT_TEMPLATE, build_char_tokenizer, char_vocab

__all__ = [
    "ADAPTERS",
    "CHAT_TEMPLATE",
    "DEFAULT_CHUNK_SIZE",
    "PRECISIONS",
    "PRESETS",
    "CausalLMAdapter",
    "ModelAdapter",
    "ModelSpecError",
    "Preset",
    "Seq2SeqAdapter",
    "build_char_tokenizer",
    "build_preset_model",
    "char_vocab",
    "check_precision",
    "ensure_pad_token",
    "list_presets",
    "load_adapter",
    "load_model_and_tokenizer",
    "naive_token_logprobs",
    "pad_right",
    "pick_device",
    "position_ids_from_attention_mask",
    "precision_autocast",
    "preset_config",
    "resolve_dtype",
    "sequence_logprobs",
    "token_logprobs",
]
