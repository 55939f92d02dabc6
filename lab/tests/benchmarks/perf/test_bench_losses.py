"""`posttrain bench losses` on tiny sizes through the real path (fresh child processes, CLI, JSON)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain_lab.benchmarks.perf.common import PeakMemory, run_isolated, summarize_times, time_fn
from posttrain_lab.benchmarks.perf.losses import TABLE_COLUMNS, _child_run, compare_with_verl, table_rows

TINY = dict(tokens=64, hidden=16, chunk_size=16, repeats=1, device="cpu", check_verl=False)


def _check_result(res, vocabs):
    assert res["bench"] == "losses"
    assert res["config"]["vocabs"] == list(vocabs) and res["config"]["chunk_size"] == 16
    assert [r["vocab"] for r in res["rows"]] == list(vocabs)
    for r in res["rows"]:
        for variant in ("naive", "chunked"):
            v = r[variant]
            assert set(v) == {"median_s", "min_s", "times_s", "cpu_median_s", "cpu_times_s", "peak_bytes"}
            assert v["median_s"] > 0 and v["peak_bytes"] >= 0
        assert r["time_ratio"] > 0 and r["cpu_time_ratio"] > 0
        assert r["time_pass"] == (r["time_ratio"] <= r["time_target"])
        # same seeded inputs in both processes: the two implementations agree
        assert r["max_abs_diff_logp"] < 1e-4 and r["max_abs_diff_entropy"] < 1e-4
        assert r["rel_diff_grad_hidden_norm"] < 1e-4 and r["rel_diff_grad_weight_norm"] < 1e-4
    assert res["memory_method"]


def test_cli_writes_json(tmp_path):
    out = tmp_path / "bl.json"
    r = CliRunner().invoke(
        app,
        [
            *("bench", "losses", "--tokens", "64", "--hidden", "16", "--vocab", "200", "--chunk-size", "16"),
            *("--repeats", "1", "--device", "cpu", "--json", str(out)),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "time ratio" in r.output and "verl" in r.output
    res = json.loads(out.read_text())
    _check_result(res, [200])
    assert "verl" in res and isinstance(res["verl"]["available"], bool)
    row = res["rows"][0]
    assert row["memory_target"] is None and row["memory_pass"] is None  # below 151,936: no target
    assert len(table_rows(res)[0]) == len(TABLE_COLUMNS)


def test_cli_bad_sizes():
    r = CliRunner().invoke(app, ["bench", "losses", "--tokens", "0", "--no-verl"])
    assert r.exit_code != 0
    assert "tokens must be >= 1" in r.output
    r = CliRunner().invoke(app, ["bench", "losses", "--chunk-size", "0", "--no-verl"])
    assert r.exit_code != 0
    assert "chunk_size must be >= 1" in r.output


def test_memory_probe_sees_a_large_allocation_and_its_absence():
    """In a fresh process: an empty probe sees < 64 MiB; allocating and touching 256 MiB inside the
    next probe shows up as >= 240 MiB."""
    small, big = run_isolated("posttrain_lab.benchmarks.perf.common:probe_allocation", {"mibs": [0, 256]})
    assert big["peak_bytes"] >= 240 * 2**20
    assert small["peak_bytes"] < 64 * 2**20


def test_child_run_in_process_and_bad_variant():
    res = _child_run("chunked", 32, 8, 50, 8, 1, "float32", "cpu", 0)
    assert len(res["logp_sample"]) == 32 and res["grad_weight_norm"] > 0
    with pytest.raises(ValueError, match="unknown variant"):
        _child_run("fused", 32, 8, 50, 8, 1, "float32", "cpu", 0)


def test_timing_helpers():
    t = time_fn(lambda: torch.ones(10).sum(), repeats=3, warmup=1)
    s = summarize_times(t)
    assert len(s["times_s"]) == 3 and s["min_s"] <= s["median_s"]
    with pytest.raises(ValueError, match="repeats"):
        time_fn(lambda: None, repeats=0)
    with PeakMemory("cpu") as pm:
        pass
    assert pm.peak_bytes >= 0 and pm.method


def test_run_isolated_rejects_foreign_targets():
    with pytest.raises(ValueError, match=r"posttrain\[_lab\]\.module:function"):
        run_isolated("os:system", {"command": "true"})


def test_verl_comparison_reports_a_missing_verl(monkeypatch):
    """Without verl the comparison says so (it is optional and not an extra)."""
    import sys

    monkeypatch.setitem(sys.modules, "verl", None)  # makes `import verl...` raise ImportError
    res = compare_with_verl()
    assert res["available"] is False and "verl is not importable" in res["reason"]


def test_verl_cross_check_agrees():
    """ppo/gspo/cispo/sapo losses and gradients equal verl's. verl is not a posttrain extra, so CI does
    not install it: this test is SKIPPED there (visibly, with the reason); run it where verl imports.
    (The old test returned early, silently passing, when verl was missing.)"""
    res = compare_with_verl()
    if not res["available"]:
        pytest.skip(f"verl cross-check not run: {res['reason']}; `pip install verl` to run it")
    for name in ("ppo", "gspo", "cispo", "sapo"):
        r = res["losses"][name]
        assert "error" not in r, r
        assert r["max_abs_diff"] < 1e-8 and r["max_abs_diff_grad"] < 1e-8
