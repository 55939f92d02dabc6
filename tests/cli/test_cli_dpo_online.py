"""`posttrain dpo` with online pairs end to end on the tiny preset: the shipped online config runs 3
steps, each logging the pair counts (kept + skipped = sampled groups, one pair per kept group) and
TRL's reward metrics; the same run from the default config with ``online.enabled=true``."""

from __future__ import annotations

import json
from importlib.resources import files

from typer.testing import CliRunner

from posttrain.cli import app

runner = CliRunner()
CONFIG = str(files("posttrain") / "configs" / "preference" / "online-dpo-tiny.yaml")


def _steps(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "step"]


def _check(steps):
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        assert s["pairs/groups"] == 8 and s["pairs/completions"] == 32
        assert s["pairs/groups_kept"] + s["pairs/groups_skipped_no_margin"] == s["pairs/groups"]
        assert s["pairs/n"] == s["pairs/groups_kept"]  # batch_size 8 >= kept: every kept group trains
        if s["pairs/n"]:
            assert s["pairs/margin_mean"] == 1.0  # the format reward is 0 or 1: best 1, worst 0
            assert {"rewards/margins", "rewards/accuracies", "logps/chosen", "logps/rejected"} <= set(s)
    assert sum(s["pairs/n"] for s in steps) > 0


def test_online_dpo_config_runs_three_steps_and_logs_pair_counts(tmp_path):
    run = tmp_path / "run"
    res = runner.invoke(
        app, ["dpo", "--config", CONFIG, f"out_dir={run}", "--no-progress"], catch_exceptions=False
    )
    assert res.exit_code == 0, res.output
    _check(_steps(run))
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3
    assert (run / "model").is_dir() and (run / "checkpoints" / "latest").exists()


def test_online_enabled_from_the_command_line(tmp_path):
    run = tmp_path / "run"
    args = [
        "dpo",
        "model.name=tiny",
        "online.enabled=true",
        "online.max_new_tokens=8",
        "online.reward.name=format",
        "online.reward.params={pattern: '[0-9]'}",
        "online.reward.num_workers=0",
        "steps=3",
        "optimizer.lr=1e-3",
        f"out_dir={run}",
        "--no-progress",
    ]
    res = runner.invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    _check(_steps(run))


def test_online_with_a_data_file_is_refused_naming_the_key(tmp_path):
    res = runner.invoke(app, ["dpo", "--config", CONFIG, "data=x.jsonl", f"out_dir={tmp_path / 'r'}"])
    assert res.exit_code != 0
    assert "data: set together with online.enabled=true" in res.output
