"""`posttrain bench generate` on a micro configuration (tiny preset): every cell measured, exactly
new_tokens tokens per completion, ratios and limits computed from the recorded figures, load recorded,
llama.cpp skipped visibly when not installed or no GGUF exists."""

from __future__ import annotations

import json
import statistics

import pytest

from posttrain.benchmarks.perf import generate as gb


def _micro(**kw):
    args = dict(
        model="tiny",
        engines=["hf:fp32", "fast:bf16"],
        batches=[1, 3],
        new_tokens=3,
        repeats=2,
        warmup=0,
        threads=1,
        llama_cpp=True,
    )
    args.update(kw)
    return gb.run_generate_bench(**args)


def test_generate_bench_micro():
    res = _micro()
    rows = {(r["engine"], r["batch"]): r for r in res["rows"]}
    assert set(rows) == {("hf:fp32", 1), ("hf:fp32", 3), ("fast:bf16", 1), ("fast:bf16", 3)}
    for (eng, b), r in rows.items():
        assert len(r["tok_s_all"]) == 2
        assert r["tok_s_median"] == pytest.approx(statistics.median(r["tok_s_all"]))
        per_param = 4 if eng.endswith("fp32") else 2
        assert r["weight_bytes"] == res["parameters"] * per_param
        assert r["bandwidth_limit_tok_s"] == pytest.approx(
            b * res["bandwidth_gb_s"] * 1e9 / r["weight_bytes"]
        )
        rate = res["matmul_gflops"][eng.split(":")[1]]
        assert r["flop_limit_tok_s"] == pytest.approx(rate * 1e9 / res["decode_flops_per_token"])
        assert r["limit_tok_s"] == min(r["bandwidth_limit_tok_s"], r["flop_limit_tok_s"])
        assert r["over_llama_cpp"] is None  # no llama.cpp cell for the tiny preset
    # tiny has no GGUF: llama.cpp is skipped with a reason, not silently
    assert res["llama_cpp_skipped_reason"]
    assert len(res["loadavg_start"]) == 3 and len(res["loadavg_end"]) == 3
    assert res["greedy_same_as_hf"] is True  # fast vs hf, greedy fp32, two prompt lengths


def test_generate_bench_rejects_unknown_engine():
    with pytest.raises(ValueError, match="unknown engine 'vllm'"):
        gb.EngineSpec.parse("vllm:fp32")
    with pytest.raises(ValueError, match="unknown precision"):
        gb.EngineSpec.parse("fast:fp8")


def test_skip_reason_names_the_install_when_llama_cpp_is_absent(monkeypatch, tmp_path):
    monkeypatch.setattr(gb, "llama_cpp_version", lambda: None)
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF")
    res = _micro(engines=["fast:fp32"], batches=[1], repeats=1, gguf=str(fake))
    assert "llama-cpp-python is not installed" in res["llama_cpp_skipped_reason"]
    assert "pip install" in res["llama_cpp_skipped_reason"]


def test_cli_generate_writes_json(tmp_path):
    from typer.testing import CliRunner

    from posttrain.cli import app

    out = tmp_path / "g.json"
    r = CliRunner().invoke(
        app,
        [
            "bench",
            "generate",
            "--model",
            "tiny",
            "--engines",
            "fast:fp32",
            "--batches",
            "2",
            "--new-tokens",
            "2",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--no-llama-cpp",
            "--quiet",
            "--json",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert data["rows"][0]["engine"] == "fast:fp32" and data["rows"][0]["batch"] == 2
    assert data["llama_cpp_skipped_reason"] == "disabled (--no-llama-cpp)"
    assert "llama.cpp skipped" in r.output
