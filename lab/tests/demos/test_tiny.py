"""`posttrain demo` (the tiny RL demo, posttrain_lab.demos.tiny) end to end through the CLI: ``--quick``
with another objective writes its summary and curves, an unknown objective is a usage error, and the
demo saves its RL policy (which `posttrain eval` and `posttrain plot` read) and refuses a rerun into
the same folder. The dispatch by demo name: test_demo_registry.py."""

from __future__ import annotations

import json
import warnings

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.train.rl import DegenerateSettingWarning

runner = CliRunner()


def _invoke(args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _ok(res):
    assert res.exit_code == 0, res.output
    return res


@pytest.mark.slow
def test_quick_demo_with_another_objective_writes_its_summary_and_curves(tmp_path):
    res = _invoke(
        ["demo", "--quick", "--out", str(tmp_path / "demo"), "--objective", "cispo", "--no-progress"]
    )
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "demo" / "summary.json").read_text())
    for k in ("before", "after", "rl_steps", "wall_s", "objective"):
        assert k in s
    assert (
        s["objective"] == "cispo" and 0 <= s["before"]["accuracy"] <= 1 and 0 <= s["after"]["accuracy"] <= 1
    )
    assert (tmp_path / "demo" / "curves.png").is_file()
    # the figures depend on the CPU's kernels (issue 41 item 11): the summary names the level it ran with
    import torch

    assert s["cpu_capability"].startswith(torch.backends.cpu.get_cpu_capability())
    assert "CPU kernels" in res.output
    res = _invoke(["demo", "--objective", "nope", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "accepted" in res.output


@pytest.mark.slow
def test_demo_saves_its_rl_policy_and_refuses_a_rerun(tmp_path):
    out = tmp_path / "demo"
    args = [
        "demo",
        "--quick",
        "--sft-steps",
        "2",
        "--rl-steps",
        "1",
        "--out",
        out,
        "--no-progress",
        "eval.n=2",
    ]
    _ok(_invoke(args))
    assert (out / "rl" / "model" / "config.json").is_file() and (out / "rl" / "metrics.jsonl").is_file()
    assert json.loads((out / "summary.json").read_text())["rl_model"] == str(out / "rl" / "model")
    res = _ok(_invoke(["eval", "--model", out / "rl", "--n", "2", "--max-new-tokens", "2"]))
    assert json.loads(res.output.strip().splitlines()[-1])["n"] == 2
    assert _ok(_invoke(["plot", out])).output.strip() == str(out / "curves.png")
    res = _invoke(args)  # refused before anything is loaded
    assert res.exit_code == 2 and "already holds a run" in res.output and "--overwrite" in res.output
