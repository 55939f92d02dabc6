"""`posttrain eval --out`: a path the result cannot be written to is refused before the evaluation
runs (naming the path), and a write that still fails afterwards prints the finished result on stdout
before the error, instead of a traceback that loses it. (Tests run as root, which ignores permission
bits, so the unwritable paths here go through a regular file.)"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import posttrain.train.evaluate as evaluate_mod
import posttrain.utils.io as io_mod
from posttrain.cli import app

cli = CliRunner()
QUICK = ["eval", "--model", "tiny", "--n", "2", "--max-new-tokens", "2"]


@pytest.fixture
def no_evaluation(monkeypatch):
    """Fails the test if the evaluation starts."""

    def refuse(*args, **kwargs):
        raise AssertionError("the evaluation ran although --out cannot be written")

    monkeypatch.setattr(evaluate_mod, "evaluate_run", refuse)


@pytest.mark.parametrize("where", ["inside_a_file", "below_a_file", "a_folder"])
def test_an_unwritable_out_is_refused_before_evaluating(tmp_path, no_evaluation, where):
    (tmp_path / "somefile").write_text("x", encoding="utf-8")
    out = {
        "inside_a_file": tmp_path / "somefile" / "e.json",
        "below_a_file": tmp_path / "somefile" / "sub" / "e.json",
        "a_folder": tmp_path,
    }[where]
    res = cli.invoke(app, [*QUICK, "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 2, res.output
    assert f"--out {out}" in res.stderr
    assert "Traceback" not in res.output


def test_an_out_in_folders_still_to_be_made_is_written(tmp_path):
    out = tmp_path / "new" / "deeper" / "e.json"
    res = cli.invoke(app, [*QUICK, "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text(encoding="utf-8"))["n"] == 2


def test_a_write_that_fails_after_evaluating_prints_the_result_first(tmp_path, monkeypatch):
    def disk_full(path, obj, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(io_mod, "atomic_write_json", disk_full)
    out = tmp_path / "e.json"
    res = cli.invoke(app, [*QUICK, "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 2, res.output
    printed = json.loads(res.stdout.strip().splitlines()[-1])
    assert printed["n"] == 2 and "accuracy" in printed
    assert f"could not write --out {out}" in res.stderr
    assert "No space left on device" in res.stderr
