"""`posttrain bench dpo-step` on the tiny preset: both sides really train (their weights move), the
timings and ratios come from the same interleaved steps, memory is measured per side in a fresh
process; the CLI prints the ratios. Skipped with the reason when TRL is not installed."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("trl", reason='TRL is not installed (pip install -e "./lab[bench]")')

from posttrain.cli import app
from posttrain_lab.benchmarks.perf.dpo_step import (
    bench_rows,
    get_preset,
    memory_child,
    run_dpo_step_bench,
)


def test_bench_rows_repeat_the_shipped_file():
    rows = bench_rows(70)
    assert len(rows) == 70 and rows[0] == rows[32] and set(rows[0]) == {"prompt", "chosen", "rejected"}


def test_presets_and_unknown_preset():
    assert get_preset("tiny").model == "tiny" and get_preset("smol").model == "smollm2-135m"
    with pytest.raises(ValueError, match="unknown dpo-step preset 'huge'"):
        get_preset("huge")


def test_interleaved_steps_give_the_ratio_of_the_medians():
    p = dataclasses.replace(get_preset("tiny"), batch=4, pairs=16)
    r = run_dpo_step_bench(p, repeats=3, warmup=1, threads=1, memory=False)
    assert [len(r["step_times_s"][k]) for k in ("posttrain", "trl")] == [3, 3]
    assert r["posttrain_over_trl"] == pytest.approx(r["median_s"]["posttrain"] / r["median_s"]["trl"])
    m = r["posttrain_last_metrics"]
    assert m["step"] == 4 and "rewards/margins" in m  # posttrain ran every step, the real call path
    assert r["versions"]["trl"] and r["cpu_capability"]


@pytest.mark.parametrize("side", ["posttrain", "trl"])
def test_memory_child_measures_one_step(side):
    p = dataclasses.replace(get_preset("tiny"), batch=4, pairs=8)
    out = memory_child(side, dataclasses.asdict(p), 0, 1, "cpu")
    assert out["peak_bytes"] >= 0 and out["method"]


def test_cli_prints_the_ratios(tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "dpo-step",
            "--batch",
            "4",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--no-memory",
            "--json",
            str(out),
        ],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    assert "posttrain / TRL: time" in res.output
    assert json.loads(out.read_text())["preset"]["batch"] == 4
