"""GGUF files as models: conversion into the cache, reuse, atomicity and the errors for bad files."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from tiny_gguf import write_tiny_llama_gguf

from posttrain.models import gguf as pgguf
from posttrain.models import load_model_and_tokenizer
from posttrain.models.gguf import GGUFError, cache_root, convert_gguf


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "src").mkdir()
    return write_tiny_llama_gguf(tmp_path / "src" / "tiny.gguf")


def test_cache_root_env_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path))
    assert cache_root() == tmp_path / "models"
    monkeypatch.delenv("POSTTRAIN_CACHE")
    assert cache_root() == Path.home() / ".cache" / "posttrain" / "models"


def test_gguf_loads_with_same_logits_as_transformers(cache, tiny):
    import torch
    from transformers import AutoModelForCausalLM

    model, tok = load_model_and_tokenizer(str(tiny))
    ref = AutoModelForCausalLM.from_pretrained(str(tiny.parent), gguf_file=tiny.name, dtype=torch.float32)
    ids = tok("he a bad cafe", return_tensors="pt")["input_ids"]
    assert ids.shape[1] > 3
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits)
    # the tokenizer and chat template come from the GGUF metadata
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token is not None
    out = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] == ids.shape[1] + 3
    dirs = list(cache.glob("gguf-*"))
    assert len(dirs) == 1 and (dirs[0] / "model.safetensors").is_file()
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temp dir left


def test_conversion_happens_once_and_is_keyed_by_content(cache, tiny, monkeypatch, tmp_path):
    first = convert_gguf(tiny)
    calls = []
    real = pgguf._convert_into
    monkeypatch.setattr(pgguf, "_convert_into", lambda *a: (calls.append(a), real(*a)))
    copy = tmp_path / "renamed.GGUF"
    shutil.copy(tiny, copy)
    assert convert_gguf(copy) == first and calls == []  # same bytes: the cached conversion
    other = write_tiny_llama_gguf(tmp_path / "other.gguf", seed=1)
    second = convert_gguf(other)
    assert second != first and len(calls) == 1
    assert pgguf.remove_cached(other) == second and not second.exists()
    assert pgguf.remove_cached(other) is None


def test_failed_conversion_leaves_nothing(cache, tiny, monkeypatch):
    def boom(p, out, arch):
        (out / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(pgguf, "_convert_into", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        convert_gguf(tiny)
    assert list(cache.iterdir()) == []


def test_not_a_gguf_file(cache, tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_text("hello, I am text")
    with pytest.raises(GGUFError, match=r"model\.gguf.*not a GGUF file.*expected b'GGUF'"):
        load_model_and_tokenizer(str(bad))


def test_missing_file(cache, tmp_path):
    with pytest.raises(GGUFError, match=r"nope\.gguf.*no such GGUF file"):
        load_model_and_tokenizer(str(tmp_path / "nope.gguf"))


def test_truncated_file(cache, tiny, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[: tiny.stat().st_size // 2])
    with pytest.raises(GGUFError, match=r"cut\.gguf.*corrupt or truncated"):
        load_model_and_tokenizer(str(cut))
    assert not cache.exists() or list(cache.iterdir()) == []


def test_unsupported_architecture(cache, tmp_path):
    odd = write_tiny_llama_gguf(tmp_path / "odd.gguf", arch="tinyfoo")
    with pytest.raises(GGUFError, match=r"odd\.gguf.*architecture 'tinyfoo' is not supported.*llama"):
        load_model_and_tokenizer(str(odd))


def test_missing_gguf_package_names_the_extra(cache, tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(GGUFError, match=r'tiny\.gguf.*gguf is not installed: pip install -e "\.\[gguf\]"'):
        load_model_and_tokenizer(str(tiny))


def test_missing_accelerate_is_named_before_the_conversion_starts(cache, tiny, monkeypatch):
    """transformers refuses a GGUF file without accelerate (issue 41 item 14): the error came from inside
    the conversion, after the file was read, and named `pip install accelerate` only; now both packages
    are checked first, in one line naming the extra as it installs (there is no posttrain on PyPI)."""
    monkeypatch.setitem(sys.modules, "accelerate", None)
    reads = []
    monkeypatch.setattr(pgguf, "read_architecture", lambda p: reads.append(p) or "llama")
    with pytest.raises(GGUFError) as err:
        load_model_and_tokenizer(str(tiny))
    msg = str(err.value)
    assert "\n" not in msg and "`gguf` and `accelerate`" in msg and "accelerate is not installed" in msg
    assert 'pip install -e ".[gguf]" (or pip install accelerate)' in msg and "posttrain[" not in msg
    assert reads == [] and not list(cache.glob("gguf-*"))


def test_a_converted_file_loads_without_gguf_or_accelerate(cache, tiny, monkeypatch):
    """A prepared model (`posttrain models prepare`) needs neither package again: the cached conversion
    of the same bytes is used before the file is read (reading it needed `gguf` every time)."""
    model, _ = load_model_and_tokenizer(str(tiny))
    monkeypatch.setitem(sys.modules, "gguf", None)
    monkeypatch.setitem(sys.modules, "accelerate", None)
    again, _ = load_model_and_tokenizer(str(tiny))
    assert sum(p.numel() for p in again.parameters()) == sum(p.numel() for p in model.parameters())
