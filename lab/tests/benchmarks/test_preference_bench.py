"""`posttrain bench preference` at tiny scale (the tiny preset on demo smol's instruction task, a
"contains a digit" reward so that the tiny model's groups have margins): every arm trains from the one
warm start and generates the same number of completions; the table and JSON are written; a second call
with --resume keeps every finished arm; a resume with other settings and a warm start without margins
are refused; the paired comparison names the winner only beyond 2 SE."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.train.run_dir import RunDirError
from posttrain_lab.benchmarks import preference as bench
from posttrain_lab.benchmarks.preference import NoMarginError, compare, run_preference_bench, summarise

runner = CliRunner()
TINY = [
    "task.params.n_train=16",
    "task.params.n_heldout=8",
    "task.params.n_ood=4",
    "eval.n=8",
    "eval.max_batch_size=8",
    "rollout.max_new_tokens=12",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_batch_size=16",
    "rollout.engine={name: hf}",
    "micro_batch_size=8",
    "reward.num_workers=0",
    "threads=1",
    "model.precision=fp32",
    "hooks.shapers=[{name: dapo-overlong, params: {max_length: 12, buffer: 4, factor: 0.5}}]",
]
DIGIT = ["reward.name=format", 'reward.params={pattern: "[0-9]"}']


def test_tiny_bench_runs_every_arm_on_the_same_budget_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "bench"
    args = dict(model="tiny", steps=2, seeds=1, dpo_lr=1e-3, overrides=[*TINY, *DIGIT])
    s = run_preference_bench(out, **args)
    assert s["precheck"]["with_margin"] > 0
    assert set(s["arms"]) == {"grpo", "online-dpo", "offline-dpo"}
    for arm, a in s["arms"].items():
        assert a["generated_per_seed"] == [2 * 4 * 4], arm  # steps x prompts x group size, every arm
        assert a["trained_all_seeds"], arm
        assert 0.0 <= a["accuracy"] <= 1.0 and a["length_mean"] > 0
        res = json.loads((out / f"{arm}-s0" / "result.json").read_text())
        assert len(res["after"]["items"]) == s["before"]["n"] == 8  # the same held-out prompts
    offline = json.loads((out / "offline-dpo-s0" / "result.json").read_text())
    assert 0 < offline["pairs"] <= 2 * 4  # at most one pair per warm-start group
    online_steps = [
        json.loads(line) for line in (out / "online-dpo-s0" / "metrics.jsonl").read_text().splitlines()
    ]
    assert all(r["pairs/completions"] == 16 for r in online_steps if r["kind"] == "step")
    assert set(s["differences"]) == {"grpo - online-dpo", "grpo - offline-dpo", "online-dpo - offline-dpo"}
    assert "| online-dpo |" in (out / "summary.md").read_text()
    assert (out / "warm_start" / "config.json").is_file()

    def no_rerun(*a, **k):
        raise AssertionError("a finished arm ran again")

    monkeypatch.setattr(bench, "run_arm", no_rerun)
    again = run_preference_bench(out, resume=True, **args)
    assert again["arms"] == s["arms"]
    with pytest.raises(RunDirError, match="other settings"):
        run_preference_bench(out, resume=True, **{**args, "dpo_lr": 1e-4})
    with pytest.raises(RunDirError, match="already holds a preference bench; continue it with"):
        run_preference_bench(out, **args)


def test_a_warm_start_without_margins_is_refused(tmp_path):
    never = ["reward.name=format", 'reward.params={pattern: "^NEVER$"}']
    with pytest.raises(NoMarginError, match="no group sampled from the warm start has a reward margin"):
        run_preference_bench(tmp_path / "b", model="tiny", steps=1, seeds=1, overrides=[*TINY, *never])


def test_paired_comparison_names_a_winner_only_beyond_two_se():
    before = [0.0] * 10
    better = [1.0] * 6 + [0.0] * 4
    c = compare(better, before)
    assert c["diff"] == pytest.approx(0.6) and c["se"] == pytest.approx((0.24 * 10 / 9 / 10) ** 0.5)
    assert c["resolved"]
    assert not compare([1.0] + [0.0] * 9, before)["resolved"]  # 0.1 with SE 0.1: within 2 SE

    def ev(v):
        return {"items": [{"strict": x} for x in v], "hacked_frac": 0.0, "length_mean": 5.0}

    run = lambda v: {"after": ev(v), "generated": 32, "seed": 0, "gates": {"trained": True}}  # noqa: E731
    s = summarise(ev(before), {"a": [run(better)], "b": [run(before)]})
    assert s["differences"]["a - b"]["winner"] == "a" and s["arms"]["a"]["gain"] == pytest.approx(0.6)
    s = summarise(ev(before), {"a": [run(before)], "b": [run(better)]})
    assert s["differences"]["a - b"]["winner"] == "b" and s["differences"]["a - b"]["diff"] < 0


def test_cli_refuses_an_unknown_arm(tmp_path):
    res = runner.invoke(app, ["bench", "preference", "--out", str(tmp_path / "x"), "--arms", "grpo,ppo"])
    assert res.exit_code != 0 and "ppo" in res.output and "online-dpo" in res.output


def test_arms_run_seed_by_seed_and_a_partial_table_follows_each_seed(tmp_path, monkeypatch, capsys):
    """Every arm of seed 0 runs before any arm of seed 1, and the table of the finished seeds is printed
    (and written to summary_partial.md, removed once the bench ends) after each seed but the last."""
    order, partial_seen = [], []

    def fake_arm(arm, seed, rl, *, evaluate, **_):
        if seed == 1 and not partial_seen:
            partial_seen.append((tmp_path / "b" / "summary_partial.md").read_text())
        order.append((arm, seed))
        items = [{"strict": float(i % 2)} for i in range(8)]
        return {
            "arm": arm,
            "seed": seed,
            "generated": 32,
            "gates": {"trained": True},
            "after": {"items": items, "hacked_frac": 0.0, "length_mean": 5.0},
        }

    monkeypatch.setattr(bench, "run_arm", fake_arm)
    s = run_preference_bench(tmp_path / "b", model="tiny", steps=1, seeds=2, overrides=[*TINY, *DIGIT])
    assert order == [(a, 0) for a in bench.ARMS] + [(a, 1) for a in bench.ARMS]
    assert (
        partial_seen
        and partial_seen[0].startswith("seeds 0..0 of 0..1")
        and "| offline-dpo |" in partial_seen[0]
    )
    assert "[preference] after seed 0:" in capsys.readouterr().out
    assert not (tmp_path / "b" / "summary_partial.md").exists()
    assert s["arms"]["grpo"]["seeds"] == [0, 1]


def test_the_grpo_arm_learns_from_the_dpo_arms_reward_unless_a_shaper_is_asked_for():
    """demo smol's overlong shaper is an RL hook the DPO arms lack: the bench drops it by default, and an
    override puts it back; everything else is demo smol's RL stage."""
    rl = bench.rl_config(None, 10, [])
    assert rl.hooks.shapers == [] and rl.steps == 10
    assert rl.reward.name == "instructions_guarded" and rl.model.name == "smollm2-135m"
    back = bench.rl_config(
        None, 10, ["hooks.shapers=[{name: dapo-overlong, params: {max_length: 64, buffer: 16}}]"]
    )
    assert [s.name for s in back.hooks.shapers] == ["dapo-overlong"]


def test_a_difference_the_seeds_disagree_on_is_not_resolved():
    """Seed-averaged verdicts can differ by far more than their prompt SE while the seeds disagree:
    arm a wins on two seeds and loses on the third. Paired over seeds, the SE is large and no winner is
    named; with the seeds agreeing, the same mean difference is resolved."""
    n = 100

    def ev(k):  # k of n prompts passed
        return {"items": [{"strict": float(i < k)} for i in range(n)], "hacked_frac": 0.0, "length_mean": 5.0}

    def runs(ks):
        return [
            {"after": ev(k), "generated": 32, "seed": s, "gates": {"trained": True}} for s, k in enumerate(ks)
        ]

    base = runs([40, 40, 40])
    s = summarise(ev(40), {"a": runs([70, 70, 10]), "b": base})
    d = s["differences"]["a - b"]
    assert d["diff"] == pytest.approx(0.10) and d["diff"] > 2 * d["se"]  # prompt SE alone would name a
    assert d["seed_se"] == pytest.approx(0.20) and not d["resolved"] and d["winner"] is None
    assert s["arms"]["a"]["accuracy_per_seed"] == [0.7, 0.7, 0.1] and not s["arms"]["a"]["gain_resolved"]
    agree = summarise(ev(40), {"a": runs([50, 50, 50]), "b": base})["differences"]["a - b"]
    assert agree["resolved"] and agree["winner"] == "a" and agree["seed_se"] == pytest.approx(0.0)
    assert "(SE prompts, SE seeds)" in bench.table(s)
