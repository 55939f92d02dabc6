"""`posttrain bench generate` on a micro configuration (tiny preset): every cell measured, exactly
new_tokens tokens per completion, ratios and limits computed from the recorded figures, load recorded,
llama.cpp skipped visibly when not installed or no GGUF exists."""

from __future__ import annotations

import json
import statistics

import pytest

from posttrain_lab.benchmarks.perf import generate as gb


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
    with pytest.raises(ValueError, match=r"unknown engine 'sglang'.*known: hf, fast, vllm"):
        gb.EngineSpec.parse("sglang:fp32")
    assert gb.EngineSpec.parse("vllm:fp32").label == "vllm:fp32"
    with pytest.raises(ValueError, match="unknown precision"):
        gb.EngineSpec.parse("fast:fp8")


def test_llama_cpp_version_does_not_import_it(monkeypatch):
    """Asking whether llama-cpp-python is installed must not load llama.cpp into the bench's process."""
    import sys

    from posttrain_lab.benchmarks.perf.llama_cpp import llama_cpp_version

    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    llama_cpp_version()
    assert "llama_cpp" not in sys.modules


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


# ------------------------------------------------------------------ llama.cpp worker (fake C API)
FAKE = str(__import__("pathlib").Path(__file__).parent / "fake_llama_cpp")


@pytest.fixture
def fake_llama_cpp(monkeypatch):
    """lab/tests/benchmarks/perf/fake_llama_cpp first on sys.path (the spawned worker inherits it), so the worker
    drives the stand-in that checks llama.cpp's batched-decoding protocol."""
    import sys

    monkeypatch.syspath_prepend(FAKE)
    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    monkeypatch.setattr(gb, "llama_cpp_version", lambda: "0.0-fake")
    yield
    sys.modules.pop("llama_cpp", None)  # the stand-in must not stay imported (test_models_builtin checks)


def test_llama_cpp_runner_protocol(fake_llama_cpp, tmp_path):
    """The runner's calls follow llama.cpp's batched decoding (the fake asserts positions, sequences
    and requested logits): prompt once as sequence 0, copied to the B-1 others, then one token per
    sequence per decode; every completion has exactly new_tokens tokens, none EOS."""
    import importlib
    import sys

    sys.modules.pop("llama_cpp", None)
    L = importlib.import_module("llama_cpp")
    assert L.__version__ == "0.0-fake"
    from posttrain_lab.benchmarks.perf.llama_cpp import LlamaCppRunner

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    r = LlamaCppRunner(model, threads=1, max_batch=4, max_len=9)
    L.CALLS["decode"].clear(), L.CALLS["seq_cp"].clear()
    out = r.generate([5, 6, 7, 8], 4, 5)
    assert [len(o) for o in out] == [5] * 4 and all(L.EOS not in o for o in out)
    assert L.CALLS["seq_cp"] == [(0, 1), (0, 2), (0, 3)]
    assert L.CALLS["decode"] == [4, 4, 4, 4, 4]  # the prompt, then 4 steps (the 5th token needs no decode)
    out1 = r.generate([5, 6], 1, 3)  # the cache is cleared between calls
    assert [len(o) for o in out1] == [3]
    with pytest.raises(ValueError, match="sized for 4 x 9"):
        r.generate([5, 6, 7, 8, 9], 4, 5)
    r.close()


def test_llama_cpp_cells_beside_the_engines(fake_llama_cpp, tmp_path):
    """With llama.cpp present, the bench measures its cell in the same rounds and every torch row gets
    its ratio to llama.cpp at the same batch; llama.cpp's weight bytes are the GGUF file's size."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"G" * 1000)
    res = _micro(engines=["fast:fp32"], gguf=str(model), greedy_check_tokens=0)
    assert res["llama_cpp_skipped_reason"] is None
    rows = {(r["engine"], r["batch"]): r for r in res["rows"]}
    assert set(rows) == {("fast:fp32", 1), ("fast:fp32", 3), ("llama.cpp", 1), ("llama.cpp", 3)}
    for b in (1, 3):
        ref, r = rows[("llama.cpp", b)], rows[("fast:fp32", b)]
        assert ref["weight_bytes"] == 1000 == res["gguf_bytes"] and len(ref["tok_s_all"]) == 2
        assert r["over_llama_cpp"] == pytest.approx(r["tok_s_median"] / ref["tok_s_median"])
        pairs = [a / c for a, c in zip(r["tok_s_all"], ref["tok_s_all"], strict=True)]
        assert r["paired_over_llama_cpp"] == pytest.approx(statistics.median(pairs))
        assert ref["over_llama_cpp"] == pytest.approx(1.0)


def test_llama_cpp_crash_is_reported_not_fatal(fake_llama_cpp, tmp_path):
    """A segfault inside llama.cpp (as its AMX kernel did) ends the worker process only: the torch cells
    are still measured and the skip reason names the signal and what the worker was doing."""
    model = tmp_path / "crash.gguf"
    model.write_bytes(b"GGUF")
    res = _micro(engines=["fast:fp32"], gguf=str(model), greedy_check_tokens=0)
    assert {r["engine"] for r in res["rows"]} == {"fast:fp32"}
    reason = res["llama_cpp_skipped_reason"]
    assert "died (signal 11)" in reason and "generating" in reason and "left out" in reason


def test_vllm_column_only_where_vllm_is_installed(monkeypatch):
    monkeypatch.setattr(gb, "vllm_installed", lambda: False)
    assert gb.default_engines() == gb.DEFAULT_ENGINES
    monkeypatch.setattr(gb, "vllm_installed", lambda: True)
    assert gb.default_engines() == (*gb.DEFAULT_ENGINES, "vllm:fp32")
    with pytest.raises(ValueError, match="one vllm cell at a time"):
        gb.run_generate_bench(model="tiny", engines=["vllm:fp32", "vllm:bf16"], batches=[1])
