"""Tiny and small randomly initialised causal LMs (Llama or Qwen2 architecture) for CPU experiments.

| preset        | arch  | hidden | layers | heads (kv) | MLP  | params (char vocab 357) |
|---------------|-------|--------|--------|------------|------|-------------------------|
| `tiny`        | llama | 128    | 4      | 4 (4)      | 384  | 0.94 M                  |
| `tiny-qwen2`  | qwen2 | 128    | 4      | 4 (4)      | 384  | 0.95 M                  |
| `small`       | llama | 512    | 8      | 8 (8)      | 1536 | 27.6 M                  |
| `small-qwen2` | qwen2 | 512    | 8      | 8 (8)      | 1536 | 27.6 M                  |

Weights are drawn with the architecture's own initialiser (normal, std `initializer_range` = 0.02)
under a private, seeded RNG (the global torch RNG state is left untouched), so the same seed gives the
same model on any machine. Input and output embeddings are untied, as in Llama-2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.utils.errors import InvalidValueError


@dataclass(frozen=True)
class Preset:
    name: str
    arch: str  # "llama" | "qwen2"
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int = 4096

    def describe(self) -> str:
        return (
            f"{self.arch}, hidden {self.hidden_size}, {self.num_layers} layers, {self.num_heads} heads, "
            f"MLP {self.intermediate_size}"
        )


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("tiny", "llama", 128, 4, 4, 384),
        Preset("tiny-qwen2", "qwen2", 128, 4, 4, 384),
        Preset("small", "llama", 512, 8, 8, 1536),
        Preset("small-qwen2", "qwen2", 512, 8, 8, 1536),
    )
}


def list_presets() -> list[str]:
    """Names accepted by `load_model_and_tokenizer` besides local model directories."""
    return sorted(PRESETS)


def preset_config(name: str, tokenizer: Any) -> Any:
    """The `transformers` config of preset `name`, sized to `tokenizer` and carrying its special ids."""
    from transformers import LlamaConfig, Qwen2Config

    if name not in PRESETS:
        raise InvalidValueError(f"unknown model preset {name!r}; known presets: {', '.join(list_presets())}")
    p = PRESETS[name]
    common: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads,
        num_key_value_heads=p.num_heads,
        max_position_embeddings=p.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    if p.arch == "llama":
        return LlamaConfig(**common)
    return Qwen2Config(**common)


def build_preset_model(name: str, tokenizer: Any, *, seed: int = 0, dtype: Any = None) -> Any:
    """Randomly initialised `AutoModelForCausalLM` of preset `name`, deterministic in `seed`."""
    import torch
    from transformers import AutoModelForCausalLM

    config = preset_config(name, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    if dtype is not None:
        model = model.to(dtype=dtype)
    gc = model.generation_config
    gc.pad_token_id, gc.eos_token_id, gc.bos_token_id = (
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        tokenizer.bos_token_id,
    )
    return model
