"""Presets, seeding, local-directory loading, error messages, pad fallback, generation."""

from __future__ import annotations

import pytest
import torch

from posttrain.models import (
    ModelSpecError,
    build_char_tokenizer,
    list_presets,
    load_model_and_tokenizer,
    pick_device,
    preset_config,
    resolve_dtype,
)


def test_list_presets():
    assert list_presets() == ["small", "small-qwen2", "tiny", "tiny-qwen2"]


@pytest.mark.parametrize(
    ("name", "arch", "hidden", "layers", "heads", "mlp"),
    [
        ("tiny", "llama", 128, 4, 4, 384),
        ("tiny-qwen2", "qwen2", 128, 4, 4, 384),
        ("small", "llama", 512, 8, 8, 1536),
        ("small-qwen2", "qwen2", 512, 8, 8, 1536),
    ],
)
def test_preset_configs(name, arch, hidden, layers, heads, mlp):
    tok = build_char_tokenizer()
    cfg = preset_config(name, tok)
    assert cfg.model_type == arch
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size) == (
        hidden,
        layers,
        heads,
        mlp,
    )
    assert cfg.vocab_size == len(tok)
    assert (cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id) == (0, 2, 1)


def test_unknown_preset_config():
    with pytest.raises(ValueError, match="known presets: small, small-qwen2, tiny, tiny-qwen2"):
        preset_config("huge", build_char_tokenizer())


def test_tiny_loads_with_seed_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    m1, tok = load_model_and_tokenizer("tiny", seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    m2, _ = load_model_and_tokenizer("tiny", seed=5)
    m3, _ = load_model_and_tokenizer("tiny", seed=6)
    p1, p2, p3 = (dict(m.named_parameters()) for m in (m1, m2, m3))
    assert all(torch.equal(p1[k], p2[k]) for k in p1)
    assert not torch.equal(p1["lm_head.weight"], p3["lm_head.weight"])
    assert not m1.training
    assert type(m1).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in m1.parameters()) == 944_512
    assert tok.pad_token_id == m1.generation_config.pad_token_id == 0


def test_qwen2_preset_and_dtype_and_padding_side():
    m, tok = load_model_and_tokenizer("tiny-qwen2", dtype="bf16", padding_side="left")
    assert type(m).__name__ == "Qwen2ForCausalLM"
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    assert tok.padding_side == "left"


def test_resolve_dtype():
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        resolve_dtype("int3")


def test_missing_path_names_path_and_presets(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ModelSpecError) as e:
        load_model_and_tokenizer(str(missing))
    assert str(missing) in str(e.value) and "tiny-qwen2" in str(e.value)


def test_hub_id_is_not_downloaded():
    with pytest.raises(ModelSpecError, match="not a known preset"):
        load_model_and_tokenizer("Qwen/Qwen3-0.6B-does-not-exist-locally")


def test_dir_without_config_and_file_path(tmp_path):
    with pytest.raises(ModelSpecError, match=r"has no config\.json"):
        load_model_and_tokenizer(str(tmp_path))
    f = tmp_path / "weights.bin"
    f.write_bytes(b"")
    with pytest.raises(ModelSpecError, match="is a file"):
        load_model_and_tokenizer(str(f))


def test_bad_padding_side():
    with pytest.raises(ValueError, match="padding_side"):
        load_model_and_tokenizer("tiny", padding_side="up")  # type: ignore[arg-type]


def test_saved_preset_loads_back_through_the_path_code(tmp_path):
    model, tok = load_model_and_tokenizer("tiny-qwen2", seed=3)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, ltok = load_model_and_tokenizer(str(tmp_path))
    assert type(loaded).__name__ == "Qwen2ForCausalLM"
    ids = torch.tensor([tok.encode("12+30=42")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert ltok.encode("abc\n") == tok.encode("abc\n")
    assert ltok.pad_token_id == 0


def test_tokenizer_without_pad_uses_eos(tmp_path):
    model, tok = load_model_and_tokenizer("tiny")
    model.generation_config.pad_token_id = None
    model.save_pretrained(tmp_path)
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    loaded, ltok = load_model_and_tokenizer(str(tmp_path))
    assert ltok.pad_token == "<eos>" and ltok.pad_token_id == ltok.eos_token_id == 2
    assert loaded.generation_config.pad_token_id == 2


def test_pick_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device() == "cuda"


def test_left_padded_batched_generation_runs():
    model, tok = load_model_and_tokenizer("tiny", padding_side="left")
    batch = tok(["1+1=", "10+20="], padding=True, return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=4, do_sample=False)
    assert out.shape == (2, batch["input_ids"].shape[1] + 4)
    assert torch.equal(out[:, : batch["input_ids"].shape[1]], batch["input_ids"])


def test_corrupt_tokenizer_config_names_the_file(tmp_path):
    model, tok = load_model_and_tokenizer("tiny")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelSpecError, match=r"tokenizer_config\.json: not valid JSON"):
        load_model_and_tokenizer(str(tmp_path))


@pytest.fixture
def transformers_warnings():
    """The messages transformers' tokenizer logger emits while the test runs."""
    import logging

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    log = logging.getLogger("transformers.tokenization_utils_base")
    handler = Keep(level=logging.WARNING)
    log.addHandler(handler)
    yield seen
    log.removeHandler(handler)


def test_a_loaded_tokenizer_leaves_overlong_inputs_to_posttrains_own_check(transformers_warnings):
    """Issue 58 item 9: transformers' "Token indices sequence length is longer than ... indexing errors"
    printed before posttrain's own refusal of an overlong prompt (rl, eval, serve); the tokenizers
    load_model_and_tokenizer gives are marked as having warned (posttrain checks lengths itself)."""
    text = "9" * 5000  # the character tokenizer's model_max_length is 4096
    build_char_tokenizer().encode(text)  # a bare tokenizer warns: the capture works
    assert any("Token indices sequence length is longer" in m for m in transformers_warnings)
    transformers_warnings.clear()
    _, tok = load_model_and_tokenizer("tiny")
    assert len(tok.encode(text)) == 5000
    assert not transformers_warnings, transformers_warnings
