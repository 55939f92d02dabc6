"""The real-model PaTaRM demo's stages (``posttrain_lab.recipes.patarm.real_demo``), end to end on the tiny
preset with arithmetic (the real model is too slow for the suite): pairs from the policy's own samples,
five judge arms, RLHF arms, per-arm result files, resume."""

from __future__ import annotations

import json

import pytest

from posttrain.tasks.base import Example
from posttrain_lab.recipes.patarm.real_demo import (
    RealRMSettings,
    mean_se,
    near_miss_index,
    pairs_from_samples,
    run_real_rm_demo,
)


def test_near_miss_is_the_failing_completion_closest_to_chosen():
    assert near_miss_index("#### 42", ["no idea at all", "#### 43", "#### 7"]) == 1
    with pytest.raises(ValueError):
        near_miss_index("a", [])


def test_pairs_from_samples_policy_then_reference_and_counts():
    class Ref:
        def reference_completion(self, ex):
            return f"ref {ex.answer}"

    exs = [Example(id=str(i), prompt=f"p{i}", answer=str(i)) for i in range(4)]
    texts = [["good 0", "bad 0", "goo 0"], ["x", "y"], ["ok", "ok2"], ["a", "b"]]
    passed = [[True, False, False], [False, False], [True, True], [False, False]]
    pairs, st = pairs_from_samples(exs, texts, passed, task_name="t", task=Ref(), task_type="math")
    assert [(p.chosen, p.rejected) for p in pairs[:1]] == [("good 0", "goo 0")]  # the nearer failure
    assert pairs[1].chosen == "ref 1" and pairs[1].subset == "t:reference"
    assert st["all_pass"] == 1 and st["policy_chosen"] == 1 and st["reference_chosen"] == 2
    assert all(p.task_type == "math" for p in pairs)
    none, st2 = pairs_from_samples(exs[1:2], texts[1:2], passed[1:2], task_name="t", task=None)
    assert none == [] and st2["no_chosen"] == 1


def test_mean_se_over_seeds():
    r = mean_se([0.2, 0.4])
    assert r["mean"] == pytest.approx(0.3) and r["se"] == pytest.approx(0.1)


def test_real_demo_stages_write_results_and_resume(tmp_path):
    s = RealRMSettings.quick(
        model="tiny",
        chat_template=False,
        pair_task="arithmetic",
        pair_task_params={"digits": 1, "ops": "+", "n_train": 20, "n_heldout": 10, "seed": 0},
        heldout_task="arithmetic",
        heldout_task_params={"digits": 1, "ops": "-", "n_train": 10, "n_heldout": 10, "seed": 1},
        rubric_style="none",
        ifbench=False,
        seeds=(0,),
        judge_max_new_tokens=8,
        base_judge_max_new_tokens=8,
    )
    out = tmp_path / "real"
    summary = run_real_rm_demo(out, settings=s)
    assert set(summary["judges"]) == {"base", "sft", "par_indicator", "par_antisymmetric", "bt"}
    assert set(summary["judges"]["sft"]) >= {"rubric=none,k=1", "rubric=none,k=2"}
    one = summary["judges"]["par_antisymmetric"]["rubric=none,k=2"]
    assert 0.0 <= one["strict"] <= one["tie_half"] <= 1.0
    assert set(summary["rlhf"]) == {"before", "judge", "random", "verifiable"}
    assert "heldout/accuracy" in summary["rlhf"]["judge"]
    train = [json.loads(x) for x in (out / "pairs" / "train.jsonl").read_text().splitlines()]
    held = [json.loads(x) for x in (out / "pairs" / "eval.jsonl").read_text().splitlines()]
    assert train and held and not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    par = json.loads((out / "judges" / "par_indicator.json").read_text())
    assert par["rule"] == "indicator"
    # resume: finished arms are not rerun; a deleted result is
    stamp = {p: p.stat().st_mtime_ns for p in (out / "judges").glob("*.json")}
    (out / "rlhf" / "random-s0.json").unlink()
    run_real_rm_demo(out, settings=s)
    assert {p: p.stat().st_mtime_ns for p in (out / "judges").glob("*.json")} == stamp
    assert (out / "rlhf" / "random-s0.json").is_file()
    with pytest.raises(ValueError, match="other settings"):
        run_real_rm_demo(out, settings=RealRMSettings.quick(model="tiny", seeds=(5,)))


def test_paired_judge_differences_score_ties_half_and_match_pairs():
    from posttrain_lab.recipes.patarm.real_demo import paired_vs

    def ev(points):
        return {"per_pair": [{"correct": p == 1, "tie": p == 0.5, "unparsable": p is None} for p in points]}

    evals = {
        "sft": {"rubric=full,k=1": ev([1, 0, 0.5, 0])},
        "par": {"rubric=full,k=1": ev([1, 1, 1, None])},
        "bt": {"scalar": ev([0, 0, 1, 1])},
    }
    d = paired_vs(evals)
    par = d["par - sft [rubric=full,k=1]"]
    assert par["mean"] == pytest.approx((0 + 1 + 0.5 + 0) / 4) and par["n"] == 4
    diffs = [0, 1, 0.5, 0]
    sd = (sum((x - 0.375) ** 2 for x in diffs) / 3) ** 0.5
    assert par["se"] == pytest.approx(sd / 2)
    assert d["bt - sft [rubric=full,k=1]"]["mean"] == pytest.approx((-1 + 0 + 0.5 + 1) / 4)
    assert paired_vs({"par": evals["par"]}) == {}
