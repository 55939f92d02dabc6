"""CLI end to end through typer's CliRunner: rl (2 steps) -> eval -> plot, sft data errors, demo --quick."""

from __future__ import annotations

import json
import warnings

import pytest
from _train_helpers import CLI_TINY
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.train.rl import DegenerateSettingWarning

runner = CliRunner()

TINY = CLI_TINY


def _invoke(args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        return runner.invoke(app, args, catch_exceptions=False)


def test_rl_eval_plot_end_to_end(tmp_path):
    run = tmp_path / "run"
    res = _invoke(["rl", *TINY, "steps=2", f"out_dir={run}", "--no-progress"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["steps"] == 2 and out["eval_start"] is not None and out["eval_end"] is not None
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "step"] == [1, 2]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert (run / "config.yaml").is_file()

    res = _invoke(
        [
            "eval",
            "--model",
            str(run),
            "--task-params",
            '{"digits": 1, "n_train": 40, "n_heldout": 10}',
            "--n",
            "4",
            "--k",
            "2",
            "--samples",
            "3",
            "--max-new-tokens",
            "3",
            "--out",
            str(tmp_path / "ev.json"),
        ]
    )
    assert res.exit_code == 0, res.output
    ev = json.loads((tmp_path / "ev.json").read_text())
    assert ev["n"] == 4 and 0 <= ev["accuracy"] <= 1 and 0 <= ev["pass@2"] <= 1

    res = _invoke(["plot", str(run)])
    assert res.exit_code == 0, res.output
    png = run / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

    # resume a finished run for 1 more step
    res = _invoke(["rl", *TINY, "steps=3", f"out_dir={run}", "--resume", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.strip().splitlines()[-1])["steps"] == 3


def test_rl_config_error_names_key():
    res = _invoke(["rl", "objective.name=dgpoo"])
    assert res.exit_code == 2
    assert "objective.name" in res.output and "dgpo" in res.output


@pytest.mark.parametrize(("value", "needle"), [("{digits: 1}", "invalid JSON"), ("[1]", "got list")])
def test_eval_bad_task_params_names_the_option(value, needle):
    res = _invoke(["eval", "--model", "tiny", "--task-params", value, "--n", "2"])
    assert res.exit_code == 2
    assert "--task-params" in res.output and needle in res.output


def test_sft_bad_dataset_row_gives_clear_error(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "completion": "2"}\n{"prompt": "2+2=", "answer": "4"}\n')
    res = _invoke(["sft", "model.name=tiny", f"data={data}", "steps=1", f"out_dir={tmp_path / 's'}"])
    assert res.exit_code == 2
    assert f"{data}: line 2: missing key 'completion'" in res.output


def test_sft_from_jsonl_runs_and_saves(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n" for i in range(8))
    )
    res = _invoke(
        [
            "sft",
            "model.name=tiny",
            f"data={data}",
            "steps=2",
            "batch_size=4",
            "threads=1",
            f"out_dir={tmp_path / 's'}",
        ]
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "s" / "model" / "model.safetensors").is_file()


def test_plot_missing_metrics_is_an_error(tmp_path):
    res = _invoke(["plot", str(tmp_path)])
    assert res.exit_code == 2 and "metrics.jsonl" in res.output


@pytest.mark.slow
def test_demo_quick(tmp_path):
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
    res = _invoke(["demo", "--objective", "nope", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "accepted" in res.output
