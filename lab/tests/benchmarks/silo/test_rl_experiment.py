"""`posttrain silo rl-experiment` end to end on the tiny preset (issue 39 item 3): the warm start's rows
are the scripted agents' conversations, the pre-check, every arm evaluated by the benchmark's own
engine on both held-out splits, resumable per arm and seed."""

from __future__ import annotations

import json
import warnings

import pytest

from posttrain.tasks import get_task
from posttrain.train.rl import DegenerateSettingWarning
from posttrain_lab.benchmarks.silo.rl import experiment as ex

TINY = [
    "model.name=tiny",
    "task.params.tasks=[I-01]",
    "task.params.n_train=1",
    "task.params.n_heldout=1",
    "rollout.group_size=2",
    "rollout.prompts_per_step=1",
    "rollout.max_new_tokens=8",
    "rollout.runner.params.env_params.max_rounds=2",
    "threads=1",
    "micro_batch_size=2",
]


def test_warm_start_rows_are_every_seats_scripted_conversation_ending_with_its_reply():
    task = get_task("silo", tasks=["I-01"], agents=[3], n_train=1, n_heldout=0)
    rows, rounds = ex.warm_start_rows(task.split("train"), {"max_rounds": 2})
    assert len(rows) == 3 and rounds == 5  # P2P star with N = 3: round 5 (never cut by the RL budget)
    for i, r in enumerate(rows):
        msgs = r["messages"]
        assert msgs[0]["role"] == "system" and f"agent ID is: {i}" in msgs[0]["content"]
        assert msgs[-1]["role"] == "assistant" and "submit_result" in msgs[-1]["content"]


@pytest.mark.slow
def test_the_experiment_runs_every_arm_on_tiny_and_resumes(tmp_path):
    out = tmp_path / "x"
    kw = {
        "arms": ("sft", "grpo", "duca"),
        "seeds": (0,),
        "steps": 1,
        "sft_steps": 1,
        "precheck_n": 1,
        "sft_overlong": "truncate",  # the tiny preset's characters: a seat's chat is longer than 4096
        "overrides": TINY,
        "progress": False,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        s = ex.run_silo_experiment(out, **kw)
        pre = json.loads((out / "precheck.json").read_text())
        assert pre["n"] == 1 and set(pre["by_task"]) == {"I-01"} and "in_range" in pre
        for arm in ("sft", "grpo", "duca"):
            ev = json.loads((out / arm / "seed0" / "eval.json").read_text())
            held, ood = ev["splits"]["heldout"], ev["splits"]["ood"]
            assert [r["task_id"] for r in held["rows"]] == ["I-01"] and held["rows"][0]["num_agents"] == 2
            assert [r["task_id"] for r in ood["rows"]] == ["I-05"] and ood["rows"][0]["num_agents"] == 3
            for r in held["rows"] + ood["rows"]:
                assert {"S", "P", "C_code", "D_code", "premature_submission"} <= set(r)
            if arm != "sft":
                assert ev["gate"]["steps"] == 1 and 0.0 <= ev["gate"]["mixed_groups_mean"] <= 1.0
        assert set(s["paired"]) == {"grpo-sft/heldout", "grpo-sft/ood", "duca-sft/heldout", "duca-sft/ood"}
        # DuCA's run got its turn inputs and estimator
        cfg = json.loads(
            json.dumps(
                __import__("yaml").safe_load((out / "duca" / "seed0" / "rl" / "config.yaml").read_text())
            )
        )
        assert (
            cfg["advantage"]["name"] == "duca" and cfg["rollout"]["runner"]["params"]["turn_inputs"] is True
        )
        # resume keeps what finished
        (out / "duca" / "seed0" / "eval.json").unlink()
        stamp = (out / "grpo" / "seed0" / "eval.json").stat().st_mtime_ns
        ex.run_silo_experiment(out, resume=True, **kw)
        assert (out / "grpo" / "seed0" / "eval.json").stat().st_mtime_ns == stamp
        assert (out / "duca" / "seed0" / "eval.json").is_file()
        with pytest.raises(ValueError, match="already holds a silo rl-experiment"):
            ex.run_silo_experiment(out, **kw)
