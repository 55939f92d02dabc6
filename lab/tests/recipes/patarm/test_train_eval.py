"""Evaluation metrics, RM-Bench expansion, the Bradley-Terry baseline, PAR through RLTrainer, and the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from posttrain_lab.recipes.patarm.data import PreferencePair, load_preferences
from posttrain_lab.recipes.patarm.evaluate import (
    bootstrap_ci,
    category_of,
    evaluate_pairwise,
    evaluate_pointwise,
    table,
)


def _pairs(n=4, subset="all", task_type="chat"):
    return [PreferencePair(f"q{i}", f"good{i}", f"bad{i}", task_type, subset, str(i)) for i in range(n)]


def test_pointwise_accuracy_ties_unparsable():
    pairs = _pairs(4)
    scores = {"chosen": [9, 5, None, 3], "rejected": [2, 5, 1, 7]}
    res = evaluate_pointwise(pairs, lambda ps, side: scores[side], n_boot=200)
    o = res["overall"]
    assert o["accuracy"] == 0.25 and o["tie"] == 0.25 and o["unparsable"] == 0.25
    assert o["ci95"][0] <= 0.25 <= o["ci95"][1]
    assert "overall" in table({"m": res})


def test_pairwise_both_orders_and_position_bias():
    pairs = _pairs(3)

    def verdicts(items):
        out = []
        for p, chosen_first in items:
            if p.id == "0":  # a good judge
                out.append("A" if chosen_first else "B")
            elif p.id == "1":  # always says A: position bias
                out.append("A")
            else:
                out.append(None)
        return out

    res = evaluate_pairwise(pairs, verdicts, n_boot=100)
    assert res["overall"]["accuracy"] == pytest.approx(1 / 3)
    assert res["overall"]["position_bias"] == pytest.approx(1 / 3)
    assert res["overall"]["unparsable"] == pytest.approx(1 / 3)


def test_rewardbench_sections_and_rmbench_expansion(tmp_path):
    assert category_of(PreferencePair("q", "a", "b", "chat", "llmbar-adver-neighbor")) == "Chat Hard"
    assert category_of(PreferencePair("q", "a", "b", "chat", "xstest-should-refuse")) == "Safety"
    assert category_of(PreferencePair("q", "a", "b", "chat", "hep-python")) == "Reasoning"
    assert category_of(PreferencePair("q", "a", "b", "code", "custom")) == "code"
    f = tmp_path / "rmb.jsonl"
    f.write_text(
        json.dumps(
            {
                "id": 7,
                "prompt": "p",
                "chosen": ["c0", "c1", "c2"],
                "rejected": ["r0", "r1", "r2"],
                "domain": "safety-refuse",
            }
        )
        + "\n"
    )
    pairs = load_preferences(f)
    assert len(pairs) == 9 and {p.task_type for p in pairs} == {"safety"}
    level = {(p.chosen, p.rejected): p.subset for p in pairs}
    assert level[("c0", "r0")] == "normal" and level[("c0", "r2")] == "hard" and level[("c2", "r0")] == "easy"
    assert sum(p.subset == "hard" for p in pairs) == 3
    f.write_text(json.dumps({"prompt": "p", "chosen": ["a"], "rejected": "b"}) + "\n")
    with pytest.raises(ValueError, match=r"rmb.jsonl:1: .*same non-zero length"):
        load_preferences(f)


def test_bootstrap_ci_bounds():
    lo, hi = bootstrap_ci([1.0] * 50 + [0.0] * 50, n_boot=500)
    assert 0.35 < lo < 0.5 < hi < 0.65
    assert bootstrap_ci([1.0] * 10) == (1.0, 1.0)


def test_bt_loss_and_training_learns_a_separable_signal(tmp_path):
    from posttrain_lab.recipes.patarm.bt import BTConfig, BTRewardModel, bt_loss, load_bt_model, train_bt

    assert float(bt_loss(torch.tensor([2.0]), torch.tensor([0.0]))) == pytest.approx(0.126928, abs=1e-5)
    assert float(bt_loss(torch.tensor([2.0]), torch.tensor([0.0]), margin=2.0)) == pytest.approx(
        0.693147, abs=1e-5
    )
    pairs = [PreferencePair(f"{i}", "yes", "no", "chat") for i in range(8)]
    cfg = BTConfig(model="tiny", steps=12, batch_size=8, lr=1e-2, device="cpu", out_dir=str(tmp_path / "bt"))
    summary = train_bt(cfg, pairs)
    assert summary["last"]["accuracy"] == 1.0
    model, tok = load_bt_model(summary["model"], device="cpu")
    s = BTRewardModel(model, tok).score(["5", "5"], ["yes", "no"])
    assert s[0] > s[1]


def test_par_runner_and_source_through_rltrainer(tmp_path):
    from posttrain.train.config import RLConfig
    from posttrain.train.rl import RLTrainer
    from posttrain.utils.config import build_config

    cfg = build_config(
        RLConfig,
        None,
        [
            "task.name=preferences",
            "rollout.runner.name=par",
            "reward.source.name=par",
            "rollout.group_size=3",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=4",
            "reward.num_workers=0",
            "steps=1",
            f"out_dir={tmp_path / 'par'}",
            "eval.at_start=false",
            "eval.at_end=false",
            "checkpoint.final=false",
        ],
    )
    cfg.task.params = {
        "synthetic_task": "arithmetic",
        "synthetic_params": {"digits": 1, "n_train": 20, "n_heldout": 5},
    }
    cfg.rollout.runner.params = {"rubric_style": "none"}
    with RLTrainer(cfg) as tr:
        ro = tr.rollout()
        assert len(ro.episodes) == 2 * 2 * 3  # 2 pairs x 2 sides x 3 judgments
        assert len(torch.unique(ro.episodes.batch.group_ids)) == 4  # grouped per response
        sides = [e.meta["par_side"] for e in ro.episodes.examples]
        assert sides[:3] == ["chosen"] * 3 and sides[3:6] == ["rejected"] * 3
        assert ro.episodes.examples[0].prompt.startswith("<task>math</task>\n<question>")
        res = ro.handle.result()
        assert set(res.components) == {
            "par_parsed",
            "par_truncated",
            "par_score",
            "par_pair_correct",
            "par_unpaired",
        }
        m = tr.step()
        assert "reward/par_parsed" in m


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_rm_eval_and_score(tmp_path):
    from typer.testing import CliRunner

    from posttrain.cli import app

    data = tmp_path / "p.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2), "subset": "mt-bench-easy"}
            )
            + "\n"
            for i in range(4)
        )
    )
    r = CliRunner().invoke(
        app,
        [
            "rm", "eval", "--data", str(data), "-m", "hf:tiny", "-m", "bt:tiny", "--rubric-style", "none",
            "--max-new-tokens", "4", "--out", str(tmp_path / "ev"), "--n-boot", "50",
        ],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert set(res) == {"hf:tiny", "bt:tiny"}
    assert res["hf:tiny"]["categories"]["Chat"]["n"] == 4
    assert (tmp_path / "ev" / "table.txt").is_file()
    r = CliRunner().invoke(app, ["rm", "eval", "--data", str(data), "-m", "bt:tiny", "--mode", "pairwise"])
    assert r.exit_code == 2 and "pairwise mode needs a generative judge" in r.output
    r = CliRunner().invoke(app, ["rm", "eval", "--data", str(data), "-m", "tiny"])
    assert r.exit_code == 2 and "expected hf:<model>" in r.output

    rows = tmp_path / "r.jsonl"
    rows.write_text(json.dumps({"prompt": "1+1=", "response": "2", "task_type": "math"}) + "\n")
    out = tmp_path / "s.jsonl"
    r = CliRunner().invoke(app, ["rm", "score", "--data", str(rows), "-m", "bt:tiny", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert isinstance(json.loads(out.read_text())["score"], float)
    rows.write_text('{"prompt": "x"}\n')
    r = CliRunner().invoke(app, ["rm", "score", "--data", str(rows), "-m", "bt:tiny"])
    assert r.exit_code == 2 and "r.jsonl:1: expected 'response'" in r.output


def test_cli_rm_bad_preference_file(tmp_path):
    from typer.testing import CliRunner

    from posttrain.cli import app

    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "q", "chosen": "a"}\n')
    r = CliRunner().invoke(app, ["rm", "eval", "--data", str(data), "-m", "bt:tiny"])
    assert r.exit_code == 2 and "bad.jsonl:1: missing field 'rejected'" in r.output


def test_bt_and_judge_take_the_precision_setting():
    """The PaTaRM judges run in ``precision`` (the real-model demo's bf16): the BT scores are fp32 but
    computed under bf16 autocast (they differ from fp32's), the HF judge's engine and the ``judge`` reward
    source carry the setting, and a wrong value is rejected with the key's name."""
    from pydantic import ValidationError

    from posttrain.rollout.registry import RewardSourceContext
    from posttrain_lab.recipes.patarm.bt import BTConfig, BTRewardModel, load_bt_model
    from posttrain_lab.recipes.patarm.judge import HFJudge
    from posttrain_lab.recipes.patarm.sources import judge_reward_source

    model, tok = load_bt_model("tiny", device="cpu", seed=0)
    prompts, responses = ["1+1=", "2+3=", "9+9="], ["2", "6", "18"]
    with torch.no_grad():
        s32 = BTRewardModel(model, tok).forward(prompts, responses)
        s16 = BTRewardModel(model, tok, precision="bf16").forward(prompts, responses)
    assert s32.dtype == s16.dtype == torch.float32
    assert 1e-5 < float((s16 - s32).abs().max()) < 0.1
    with pytest.raises(ValidationError, match="precision"):
        BTConfig(precision="fp8")
    from posttrain.models import load_model_and_tokenizer

    lm, ltok = load_model_and_tokenizer("tiny", seed=0)
    assert HFJudge(model_obj=lm, tokenizer=ltok, precision="bf16").engine.precision == "bf16"
    import inspect

    ctx_params = inspect.signature(RewardSourceContext).parameters
    ctx = RewardSourceContext(**{k: None for k in ctx_params if k not in {"seed"}}, seed=0)
    src = judge_reward_source(ctx, judge="hf", model="tiny", device="cpu", precision="bf16")
    try:
        assert src.judge.engine.precision == "bf16"
    finally:
        src.close()


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_hf_judge_groups_repeated_prompts_and_keeps_their_order(engine):
    """k judgments of one response reach the engine as one prompt with n = k (the fast engine then
    prefills it once); every prompt still gets its own judgment, in order."""
    from posttrain.models import load_model_and_tokenizer
    from posttrain_lab.recipes.patarm.judge import HFJudge

    lm, tok = load_model_and_tokenizer("tiny", seed=0, padding_side="left")
    j = HFJudge(model_obj=lm, tokenizer=tok, temperature=0.0, max_new_tokens=3, engine=engine)
    calls = []
    real = j.engine.generate

    def spy(ids, ns, params):
        calls.append(list(ns))
        return real(ids, ns, params)

    j.engine.generate = spy
    prompts = ["12+3=", "7+1=", "12+3=", "12+3=", "5+5=", "7+1="]
    out = j.generate(prompts)
    assert calls == [[3, 2, 1]]
    one = [j.generate([p])[0] for p in ("12+3=", "7+1=", "5+5=")]
    assert out == [one[0], one[1], one[0], one[0], one[2], one[1]]  # greedy: the same judgment
