"""The gated DuCA experiment module (posttrain_lab.recipes.duca.experiment): its gate rule and the refusal to
reuse a warm start made with other settings."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from posttrain_lab.recipes.duca import experiment as ex


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


def _args(out, **kw):
    base = dict(
        out=out, steps=1, max_turns=2, lr=None, accept_prob=0.4, gate_n=1, gate_g=2, sft_steps=300,
        p_format=0.15, force=False, arms=["duca"], model="tiny", customer="rule", customer_model=None,
        customer_tokens=8, max_new_tokens=16,
    )  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_a_warm_start_made_with_other_settings_is_not_reused(tmp_path):
    from posttrain.models import load_model_and_tokenizer

    d = tmp_path / "s0"
    d.mkdir()
    model, _ = load_model_and_tokenizer("tiny", device="cpu", seed=0)
    torch.save(model.state_dict(), d / "warm.pt")
    (d / "gate.json").write_text(json.dumps({"sft_steps": 300, "passes": True}))  # made before p_format
    a = _args(tmp_path, p_format=0.15)
    with pytest.raises(SystemExit, match=r"p_format': 0.0}.*p_format': 0.15}"):
        ex.run_seed(a, 0, print)
    assert not (d / "duca.json").exists()


def test_llm_customer_end_to_end_through_posttrain_serve(tmp_path, capsys):
    """The real-model mode's path with the tiny preset on both sides: the seller against ``sales-llm``
    whose customer is served by ``posttrain serve`` on 127.0.0.1, started and stopped by the run; the
    gate and one arm are written, no endpoint failure, and the server is gone afterwards."""
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    import urllib.request

    n = torch.get_num_threads()
    try:
        ex.main(
            [
                "--out", str(tmp_path), "--seeds", "0", "--arms", "duca", "--steps", "1", "--sft-steps", "2",
                "--gate-n", "1", "--gate-g", "2", "--max-turns", "2", "--customer", "llm",
                "--customer-tokens", "6", "--force",
            ]
        )  # fmt: skip
    finally:
        torch.set_num_threads(n)
    out = capsys.readouterr().out
    url = next(w for w in out.split() if w.startswith("http://127.0.0.1:"))
    gate = json.loads((tmp_path / "s0" / "gate.json").read_text())
    assert gate["customer"] == "llm" and gate["model"] == "tiny"
    res = json.loads((tmp_path / "s0" / "duca.json").read_text())
    assert res["metrics"]["endpoint_failed_rate"] == 0.0
    assert res["metrics"]["samples"] == 2
    with pytest.raises(OSError):  # stopped at the end
        urllib.request.urlopen(url.rstrip("/") + "/models", timeout=2)


def test_llm_customer_overrides_need_the_served_url(tmp_path):
    """The served customer's URL is passed to the overrides explicitly (not stored on the CLI args):
    without one, ``--customer llm`` is refused; the rule customer needs none."""
    a = _args(tmp_path, customer="llm")
    with pytest.raises(ValueError, match="served customer's URL"):
        ex.env_params(a, None)
    over = " ".join(ex.env_params(a, "http://127.0.0.1:9/v1"))
    assert "env=sales-llm" in over and 'base_url: "http://127.0.0.1:9/v1"' in over
    assert ex.env_params(_args(tmp_path), None) == ex.env_params(_args(tmp_path), "ignored")
    with ex.customer_server(_args(tmp_path)) as url:
        assert url is None
    assert not hasattr(a, "customer_url")
