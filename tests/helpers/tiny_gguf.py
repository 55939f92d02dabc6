"""Write a tiny Llama GGUF file (2 layers, hidden 16, 40-token byte-level BPE vocabulary with its
tokenizer and chat template in the metadata) with the `gguf` package's writer, for the GGUF tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def tiny_vocab() -> tuple[list[str], list[str]]:
    """Tokens (specials, 'Ġ' for space, letters, digits, merges) and BPE merges."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    base = ["Ġ", "Ċ", *LETTERS, *"0123456789"]
    merges = ["Ġ a", "h e"]
    return [*specials, *base, "Ġa", "he"], merges


def write_tiny_llama_gguf(path: str | Path, *, arch: str = "llama", seed: int = 0, layers: int = 2) -> Path:
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, merges = tiny_vocab()
    vocab, hidden, ff, heads, kv = len(tokens), 16, 32, 2, 2
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test-llama")
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (vocab - 3))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)

    def t(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    t("token_embd.weight", vocab, hidden)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", hidden, hidden)
        t(f"blk.{i}.attn_k.weight", hidden * kv // heads, hidden)
        t(f"blk.{i}.attn_v.weight", hidden * kv // heads, hidden)
        t(f"blk.{i}.attn_output.weight", hidden, hidden)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        t(f"blk.{i}.ffn_gate.weight", ff, hidden)
        t(f"blk.{i}.ffn_up.weight", ff, hidden)
        t(f"blk.{i}.ffn_down.weight", hidden, ff)
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    t("output.weight", vocab, hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
