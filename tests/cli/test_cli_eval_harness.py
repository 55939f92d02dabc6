"""`posttrain eval --harness lm-eval --tasks ...` through the real CLI: lm-eval's scores as one JSON line
(and --out), the Hub task refused naming its dataset, posttrain-eval options refused beside --harness;
and `python -m posttrain.integrations.lm_eval`, lm-eval's own command line with --model posttrain."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed: pip install -e '.[lm-eval]'")

from typer.testing import CliRunner

from posttrain.cli import app

cli = CliRunner()


def test_eval_harness_prints_and_writes_lm_evals_scores(tmp_path):
    out = tmp_path / "harness.json"
    args = ["eval", "--model", "tiny", "--harness", "lm-eval", "--tasks", "posttrain_arithmetic_mc"]
    res = cli.invoke(app, [*args, "--n", "3", "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    line = json.loads(res.stdout.strip().splitlines()[-1])
    scores = line["results"]["posttrain_arithmetic_mc"]
    assert scores["sample_len"] == 3 and 0.0 <= scores["acc,none"] <= 1.0
    assert json.loads(out.read_text())["results"] == line["results"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tasks", "arc_easy"], "allenai/ai2_arc"),
        (["--tasks", "posttrain_arithmetic", "--task", "arithmetic"], "--task"),
        (["--harness", "helm", "--tasks", "posttrain_arithmetic"], "lm-eval"),
        ([], "needs --tasks"),
    ],
)
def test_eval_harness_refusals_are_one_line(extra, message):
    args = [
        "eval",
        "--model",
        "tiny",
        *(["--harness", "lm-eval"] if "--harness" not in extra else []),
        *extra,
    ]
    res = cli.invoke(app, [*args, "--n", "2"], catch_exceptions=False)
    assert res.exit_code != 0
    assert message in res.output and "Traceback" not in res.output


def test_python_m_is_lm_evals_command_line_with_posttrain_registered():
    cmd = [sys.executable, "-m", "posttrain.integrations.lm_eval", "--model", "posttrain"]
    cmd += [
        "--model_args",
        "name=tiny",
        "--tasks",
        "posttrain_arithmetic_mc",
        "--limit",
        "2",
        "--device",
        "cpu",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "posttrain_arithmetic_mc" in done.stdout and "acc" in done.stdout
