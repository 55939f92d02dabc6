"""`posttrain rl --config duca-sales.yaml` end to end (tiny preset, 2 steps): duca and both GRPO
baselines run from the same config; evaluation reports the multi-turn metrics and transcripts."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.train.rl import DegenerateSettingWarning

CONFIG = Path(__file__).resolve().parents[4] / "lab/posttrain_lab/recipes/duca/duca-sales.yaml"
SMALL = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "rollout.runner.params.env_params={max_turns: 2}",
    "eval.n=3",
    "steps=2",
    "--no-progress",
]
BASELINES = {
    "duca": [],
    "grpo-sum": [
        "advantage.name=grpo",
        "advantage.params={}",
        "rollout.runner.params.reward=sum",
        "rollout.runner.params.turn_inputs=false",
    ],
    "grpo-session": ["advantage.name=grpo", "advantage.params={}", "rollout.runner.params.turn_inputs=false"],
}


@pytest.mark.parametrize("variant", sorted(BASELINES))
def test_duca_sales_config_runs(tmp_path, variant):
    run = tmp_path / variant
    args = ["rl", "--config", str(CONFIG), *SMALL, *BASELINES[variant], f"out_dir={run}"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert len(evals) == 2
    for ev in evals:
        for key in (
            "conversion_rate",
            "repetition_rate",
            "ai_disclosure_rate",
            "avg_turns",
            "truncated_rate",
        ):
            assert 0 <= ev[key] <= (2 if key == "avg_turns" else 1), key
        assert 1 <= ev["avg_turns"] <= 2
        assert len(ev["transcripts"]) == 2
        t = ev["transcripts"][0]
        assert t["messages"][0]["role"] == "system" and t["messages"][2]["role"] == "assistant"
        assert set(t["messages"][2]["turn_rewards"]) == {
            "repetition",
            "ai_disclosure",
            "forbidden_claim",
            "format",
        }


def test_duca_without_the_multiturn_runner_is_a_clear_error(tmp_path):
    args = [
        "rl",
        "model.name=tiny",
        "model.device=cpu",
        "advantage.name=duca",
        'task.params={digits: 1, ops: "+", n_train: 8, n_heldout: 2}',
        "reward.num_workers=0",
        "rollout.prompts_per_step=1",
        "rollout.group_size=2",
        "rollout.max_new_tokens=2",
        "eval.at_start=false",
        "steps=1",
        f"out_dir={tmp_path / 'run'}",
        "--no-progress",
    ]
    # the CLI prints a posttrain error as one line (exit 1), no traceback
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 1 and "error:" in res.output and "needs the per-turn inputs" in res.output
    assert "Traceback" not in res.output
