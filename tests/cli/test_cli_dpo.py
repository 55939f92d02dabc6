"""`posttrain dpo` end to end on the tiny preset with the shipped config: 3 steps on the standard
preference file and on the conversational (TRL chat format) file, each logging TRL's reward metrics
and a held-out preference accuracy; a kill-free resume to more steps; a too-long row is refused
naming its file and line."""

from __future__ import annotations

import json
from importlib.resources import files

import pytest
from typer.testing import CliRunner

from posttrain.cli import app

runner = CliRunner()
HERE = files("posttrain") / "configs" / "preference"
CONFIG = str(HERE / "dpo-tiny.yaml")


def _dpo(*args):
    return runner.invoke(
        app, ["dpo", "--config", CONFIG, *map(str, args), "--no-progress"], catch_exceptions=False
    )


def _steps(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "step"], [r for r in rows if r["kind"] == "eval"]


@pytest.mark.parametrize(
    ("data", "extra"),
    [("preferences-arithmetic.jsonl", []), ("preferences-chat.jsonl", ["eval_holdout=4"])],
)
def test_dpo_runs_three_steps_and_logs_reward_margins_and_accuracies(tmp_path, data, extra):
    run = tmp_path / "run"
    res = _dpo(f"data={HERE / data}", f"out_dir={run}", *extra)
    assert res.exit_code == 0, res.output
    steps, evals = _steps(run)
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        assert {
            "rewards/margins",
            "rewards/accuracies",
            "rewards/chosen",
            "rewards/rejected",
            "logps/chosen",
            "logps/rejected",
        } <= set(s)
    assert steps[0]["rewards/margins"] == 0.0  # step 1: the policy is the reference
    assert any(s["rewards/margins"] != 0.0 for s in steps[1:])
    assert len(evals) == 1 and 0.0 <= evals[0]["preference_accuracy"] <= 1.0
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and "rewards/margins" in summary
    assert "held-out preference accuracy" in res.output
    assert (run / "model").is_dir() and (run / "checkpoints" / "latest").exists()


def test_dpo_resume_continues_and_refuses_a_fresh_run_in_the_same_folder(tmp_path):
    run = tmp_path / "run"
    assert _dpo(f"out_dir={run}", "loss.name=ipo").exit_code == 0
    res = _dpo(f"out_dir={run}", "loss.name=ipo")
    assert res.exit_code == 2 and "--resume" in res.output
    res = runner.invoke(
        app,
        [
            "dpo",
            "--config",
            CONFIG,
            f"out_dir={run}",
            "loss.name=ipo",
            "steps=5",
            "--resume",
            "--no-progress",
        ],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    steps, _ = _steps(run)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]


def test_dpo_refuses_a_too_long_row_naming_file_and_line(tmp_path):
    res = _dpo(f"out_dir={tmp_path / 'run'}", "max_completion_length=1")
    assert res.exit_code == 2
    assert "preferences-arithmetic.jsonl: line 1: a completion is" in res.output
    assert "overlong=truncate" in res.output


def test_dpo_interrupted_says_where_it_stopped(tmp_path, monkeypatch):
    from posttrain.train.preference import PreferenceTrainer

    def stop(self, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(PreferenceTrainer, "train", stop)
    res = _dpo(f"out_dir={tmp_path / 'run'}")
    assert res.exit_code == 130
    assert "interrupted at step 0 of 3" in res.output and "nothing to resume" in res.output
