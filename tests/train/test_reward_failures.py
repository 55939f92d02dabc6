"""Reward failures are shown, counted and stop a run (issue 30, item 2), through the real CLI."""

from __future__ import annotations

import io
import json
import warnings

import pytest
from _train_helpers import CLI_TINY
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.rewards import RewardPool
from posttrain.rewards.failures import RewardFailureError, RewardFailureMonitor
from posttrain.rollout.reward_source import ScoredBatch
from posttrain.train.rl import DegenerateSettingWarning

runner = CliRunner()
QUICK = [*CLI_TINY, "eval.at_start=false", "eval.at_end=false", "--no-progress"]


def _invoke(args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_reward_that_raises_stops_the_run_with_its_traceback(tmp_path, workers):
    run = tmp_path / "run"
    res = _invoke(
        [
            "rl",
            *QUICK,
            f"out_dir={run}",
            "steps=3",
            "reward.name=_train_helpers:Broken",
            f"reward.num_workers={workers}",
        ]
    )
    assert res.exit_code == 2, res.output
    out = res.output
    assert "reward failure (step 1; first of kind 'KeyError'" in out
    assert "Traceback" in out and "_train_helpers.py" in out and "no-such-key" in out  # the real cause
    assert (
        "error: step 1: 4 of 4 rewards failed (4 errors; scored 0), more than reward.max_failed_frac=0.5"
        in out
    )
    assert "too easy/hard" not in out


def test_nan_rewards_are_counted_and_shown_not_silently_zero(tmp_path):
    run = tmp_path / "run"
    res = _invoke(
        [
            "rl",
            *QUICK,
            f"out_dir={run}",
            "steps=2",
            "reward.name=_train_helpers:NaNReward",
            "reward.max_failed_frac=1",
        ]
    )
    assert res.exit_code == 0, res.output
    assert res.output.count("first of kind 'NonFiniteReward'") == 1  # shown once, not every step
    assert "reward is not finite (nan); scored 0" in res.output
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward_errors" in r]
    assert [r["reward_errors"] for r in steps] == [4.0, 4.0]


def test_monitor_stops_only_above_the_configured_share():
    out = io.StringIO()
    mon = RewardFailureMonitor(0.5, stream=out)
    half = ScoredBatch(
        rewards=[0.0, 1.0, 0.0, 1.0], errors=2, failures={"ValueError": "item 0: ValueError: x"}
    )
    mon.check(half, "step 1")  # exactly half: not more than 0.5
    mon.check(half, "step 2")
    assert out.getvalue().count("first of kind 'ValueError'") == 1
    assert (mon.errors, mon.timeouts) == (4, 0)
    with pytest.raises(RewardFailureError, match=r"step 3: 3 of 4 rewards failed \(2 errors, 1 timeout"):
        mon.check(ScoredBatch(rewards=[0.0] * 4, errors=2, timeouts=1), "step 3")
    RewardFailureMonitor(1.0).check(ScoredBatch(rewards=[0.0] * 4, errors=4), "never stops")
    with pytest.raises(ValueError):
        RewardFailureMonitor(1.5)


def test_pool_keeps_the_first_failure_of_each_kind_with_its_traceback():
    from _train_helpers import HalfBroken

    with RewardPool(HalfBroken(), num_workers=1, timeout_s=10) as pool:
        res = pool.score(["a", "bb", "ccc", "dddd"], [None] * 4)
    assert res.errors == 2 and res.rewards == [0.0, 1.0, 0.0, 1.0]
    assert list(res.failures) == ["ZeroDivisionError"]
    assert res.failures["ZeroDivisionError"].startswith("item 0: ZeroDivisionError: odd length\nTraceback")
    assert res.messages[0] == "item 0: ZeroDivisionError: odd length"  # messages stay one line


def test_eval_warns_when_rewards_failed(tmp_path):
    res = _invoke(
        [
            "eval",
            "--model",
            "tiny",
            "--n",
            "3",
            "--max-new-tokens",
            "2",
            "reward.name=_train_helpers:Broken",
            "reward.num_workers=0",
            'task.params={digits: 1, ops: "+", n_train: 10, n_heldout: 5}',
        ]
    )
    assert res.exit_code == 0, res.output
    assert "warning: 3 of 3 rewards failed (3 errors, 0 timeouts) and scored 0" in res.output
    assert "KeyError" in res.output


def _heldout_breaking_reward(task):
    """Right on training items, raises on every held-out item (a reward broken where only eval looks)."""
    held = {e.id for e in task.split("heldout")}

    def reward(completion, example):
        if example.id in held:
            raise KeyError("held-out field missing")
        return 1.0

    return reward


def test_failed_heldout_rewards_stop_training_instead_of_reading_as_accuracy_0(tmp_path, capsys):
    from posttrain import RLConfig, RLTrainer
    from posttrain.tasks import get_task

    task = get_task("arithmetic", digits=1, ops="+", n_train=40, n_heldout=10)
    cfg = RLConfig.model_validate(
        {
            "model": {"name": "tiny", "device": "cpu"},
            "steps": 1,
            "reward": {"num_workers": 0},
            "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 3},
            "eval": {"at_start": True, "at_end": False, "n": 10},
            "checkpoint": {"final": False},
            "out_dir": str(tmp_path / "run"),
        }
    )
    with (
        RLTrainer(cfg, task=task, reward=_heldout_breaking_reward(task)) as tr,
        pytest.raises(RewardFailureError, match=r"evaluation at step 0: 10 of 10 held-out rewards failed"),
    ):
        tr.train(progress=False)
    assert "warning: evaluation at step 0: 10 of 10 rewards failed" in capsys.readouterr().err


def test_failed_heldout_rewards_warn_when_the_run_allows_them(tmp_path, capsys):
    from posttrain import RLConfig, RLTrainer
    from posttrain.tasks import get_task

    task = get_task("arithmetic", digits=1, ops="+", n_train=40, n_heldout=10)
    cfg = RLConfig.model_validate(
        {
            "model": {"name": "tiny", "device": "cpu"},
            "steps": 1,
            "reward": {"num_workers": 0, "max_failed_frac": 1.0},
            "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 3},
            "eval": {"at_start": True, "at_end": False, "n": 10},
            "checkpoint": {"final": False},
            "out_dir": str(tmp_path / "run"),
        }
    )
    with RLTrainer(cfg, task=task, reward=_heldout_breaking_reward(task)) as tr:
        summary = tr.train(progress=False)
    assert summary["steps"] == 1
    err = capsys.readouterr().err
    assert "warning: evaluation at step 0: 10 of 10 rewards failed (10 errors, 0 timeouts)" in err
