"""`posttrain bench losses`: a child killed for memory is reported as such, not as a crash."""

from __future__ import annotations

import subprocess

import pytest
from typer.testing import CliRunner

import posttrain_lab.benchmarks.perf.common as common
from posttrain.cli import app
from posttrain_lab.benchmarks.perf.losses import memory_need


def test_a_child_killed_by_sigkill_is_reported_as_out_of_memory(monkeypatch):
    monkeypatch.setattr(
        common.subprocess,
        "run",
        lambda *a, **k: subprocess.CompletedProcess(a, -9, stdout="", stderr=""),
    )
    with pytest.raises(
        common.ChildKilled, match=r"killed by SIGKILL \(most likely the kernel.s out-of-memory"
    ):
        common.run_isolated("posttrain_lab.benchmarks.perf.losses:_child_run", {})
    res = CliRunner().invoke(app, ["bench", "losses", "--tokens", "4096", "--vocab", "151936", "--no-verl"])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "the naive variant at V=151936 was killed by SIGKILL: it ran out of memory" in out
    assert "It needs about 12.8 GiB" in out
    assert "--tokens 1024" in out and "--vocab 32000" in out
    assert "Traceback" not in out and "exit -9" not in out


def test_memory_need_scales_with_tokens_and_vocab():
    a = memory_need(4096, 1024, 151_936)
    b = memory_need(1024, 1024, 151_936)
    assert a["naive"] > 3 * b["naive"] and a["chunked"] < a["naive"] / 3
    assert memory_need(4096, 1024, 151_936, "bfloat16")["naive"] * 2 == a["naive"]
