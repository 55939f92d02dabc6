"""`bench rl-step --async`: the arms' settings (same rollouts and seeds, the threads each arm gets), the
paired comparison, and resuming per arm and seed (no training: finished arms' JSON are reused)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from posttrain.train.config import load_rl_config
from posttrain_lab.benchmarks.perf.async_rl import (
    ARMS,
    PRESET_TASK,
    AsyncBenchSpec,
    arm_overrides,
    compare,
    run_comparison,
)


def test_arms_share_the_budget_and_differ_only_in_threads_and_staleness(tmp_path):
    spec = AsyncBenchSpec(steps=4, num_prompts=2, group_size=2, new_tokens=3)
    cfgs = {arm: load_rl_config(None, arm_overrides(spec, arm, 3, tmp_path / arm)) for arm in ARMS}
    for c in cfgs.values():
        assert (c.steps, c.seed, c.rollout.prompts_per_step, c.rollout.group_size) == (4, 3, 2, 2)
    assert (cfgs["sync"].threads, cfgs["sync"].rollout.max_staleness) == (2, 0)
    assert (cfgs["sync_1t"].threads, cfgs["sync_1t"].rollout.max_staleness) == (1, 0)
    a = cfgs["async"]
    assert (a.threads, a.rollout.max_staleness, a.rollout.generators.num, a.rollout.generators.threads) == (
        1,
        1,
        1,
        1,
    )


def test_real_model_preset_uses_a_task_the_warm_start_scores_on(tmp_path):
    """smol: a question, the chat template and the answer's last number (the plain prompt with exact
    match scored 0/64 on SmolLM2); every arm evaluates the warm start too (the gate), the tiny default is unchanged."""
    smol = AsyncBenchSpec(model="smollm2-135m", **PRESET_TASK["smol"])
    for arm in ARMS:
        c = load_rl_config(None, arm_overrides(smol, arm, 0, tmp_path / arm))
        assert (c.task.chat_template, c.reward.name, c.optimizer.lr, c.eval.n) == (
            True,
            "last_number",
            2e-5,
            64,
        )
        assert c.task.prompt_template.format(prompt="12+34=") == "What is 12+34=? Reply with the number only."
        assert c.eval.at_start and c.eval.at_end
    tiny = load_rl_config(None, arm_overrides(AsyncBenchSpec(), "sync", 0, tmp_path / "t"))
    assert (tiny.task.chat_template, tiny.task.prompt_template, tiny.reward.name) == (
        False,
        "{prompt}",
        "exact_match",
    )


def _arm(wall, acc):
    return {"wall_per_100_rollouts_s": wall, "heldout_accuracy": acc}


def test_compare_pairs_seeds():
    spec = AsyncBenchSpec(seeds=2)
    res = {
        "sync": {0: _arm(2.0, 0.5), 1: _arm(3.0, 0.4)},
        "sync_1t": {0: _arm(1.0, 0.5), 1: _arm(1.0, 0.4)},
        "async": {0: _arm(1.0, 0.6), 1: _arm(1.0, 0.4)},
    }
    out = compare(spec, res)
    assert out["throughput_ratio"] == pytest.approx(2.5)
    assert out["throughput_ratio_se"] == pytest.approx(0.5)
    assert out["throughput_ratio_vs_1t"] == pytest.approx(1.0)
    assert out["accuracy_diff"] == pytest.approx(0.05)


def test_finished_arms_are_not_run_again(tmp_path, monkeypatch):
    import posttrain_lab.benchmarks.perf.async_rl as bench

    spec = AsyncBenchSpec(steps=2)
    ran = []

    def fake_run_arm(spec_, arm, seed, out):
        ran.append(arm)
        return {**_arm(1.0, 0.0), "arm": arm, "seed": seed, "spec": asdict(spec_)}

    (tmp_path / "sync-seed0.json").write_text(json.dumps({**_arm(2.0, 0.0), "spec": asdict(spec)}))
    monkeypatch.setattr(bench, "run_arm", fake_run_arm)
    out = run_comparison(spec, tmp_path)
    assert ran == ["sync_1t", "async"]
    assert (tmp_path / "async-seed0.json").is_file() and out["throughput_ratio"] == pytest.approx(2.0)
    ran.clear()
    run_comparison(spec, tmp_path)
    assert ran == []
