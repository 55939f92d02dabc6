"""The gated DuCA experiment module (posttrain.recipes.duca.experiment): its gate rule and the refusal to
reuse a warm start made with other settings."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from posttrain.recipes.duca import experiment as ex


def _metrics(conv=0.4, mixed=0.5, viol=0.1):
    return {"conversion": conv, "mixed_groups": mixed, "violations": dict.fromkeys(ex.CRITERIA, viol)}


def test_gate_bands():
    assert ex.gate_check(_metrics())
    assert not ex.gate_check(_metrics(conv=0.19))
    assert not ex.gate_check(_metrics(conv=0.81))
    assert not ex.gate_check(_metrics(mixed=0.39))
    m = _metrics()
    m["violations"]["format"] = 0.047  # the 2026-12-02 warm start: format alone below the band
    assert not ex.gate_check(m)
    m["violations"]["format"] = 0.51
    assert not ex.gate_check(m)


def test_a_warm_start_made_with_other_settings_is_not_reused(tmp_path):
    from posttrain.models import load_model_and_tokenizer

    d = tmp_path / "s0"
    d.mkdir()
    model, _ = load_model_and_tokenizer("tiny", device="cpu", seed=0)
    torch.save(model.state_dict(), d / "warm.pt")
    (d / "gate.json").write_text(json.dumps({"sft_steps": 300, "passes": True}))  # made before p_format
    a = argparse.Namespace(
        out=tmp_path, steps=1, max_turns=2, lr=None, accept_prob=0.4, gate_n=1, gate_g=2,
        sft_steps=300, p_format=0.15, force=False, arms=["duca"],
    )  # fmt: skip
    with pytest.raises(SystemExit, match=r"p_format': 0.0.*p_format=0.15"):
        ex.run_seed(a, 0, print)
    assert not (d / "duca.json").exists()
