"""`posttrain bench reward-pool` (posttrain_lab.benchmarks.perf.reward_pool) through the CLI: one row
in-process, one per worker count with the hang-recovery time (a hanging item times out and the pool
recovers), written as JSON; a worker count below 1 is a usage error."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from posttrain.cli import app

runner = CliRunner()


def test_bench_reward_pool_measures_in_process_and_pool_and_hang_recovery(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    res = runner.invoke(
        app,
        [
            "bench",
            "reward-pool",
            "--batch",
            "16",
            "--workers",
            "1",
            "--repeats",
            "2",
            "--timeout-s",
            "0.5",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    pool_row = data["rows"][1]
    assert data["rows"][0]["mode"] == "in-process" and pool_row["workers"] == 1
    assert pool_row["recovery_timeouts"] == 1 and pool_row["recovery_s"] >= 0
    assert pool_row["median_ms"] > 0
    res = runner.invoke(app, ["bench", "reward-pool", "--workers", "0", "--repeats", "1"])
    assert res.exit_code == 2 and "worker counts must be >= 1" in res.output
