"""APARL dual-loop curriculum (proposed design): perplexity (of the task's reference completion),
weights, level shifts (a stage is one pass over the current pool; the per-step proficiency signal
against its own baseline), saturation, the sampler's stages, the reverse and frozen controls, and end
to end on the tiny preset (every sampling round reaches the curriculum, the groups DAPO drops too)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posttrain_lab.recipes.aparl.sampler as aparl
from posttrain.hooks import SAMPLERS, GroupOutcome, RunInfo
from posttrain.tasks import Example, get_task
from posttrain_lab.recipes.aparl.sampler import (
    aparl_weights,
    gold_perplexities,
    next_level,
    perplexity,
    quantile_floor,
)


def test_perplexity_worked_example():
    assert perplexity([-0.1, -0.5, -0.3]) == pytest.approx(1.3499, abs=1e-4)


def test_weights_on_a_hand_made_perplexity_table():
    ppl = {"a": 1.2, "b": 2.0, "c": 4.0, "d": 8.0}
    w = aparl_weights(ppl, gamma=1.0, quantile_lo=0.0)
    assert w == pytest.approx({"a": 1.2 / 15.2, "b": 2 / 15.2, "c": 4 / 15.2, "d": 8 / 15.2})
    w2 = aparl_weights(ppl, gamma=2.0, quantile_lo=0.0)
    assert w2["d"] / w2["b"] == pytest.approx(16.0)
    # ranks q = 0, 1/3, 2/3, 1: q_lo = 0.5 keeps c, d
    assert aparl_weights(ppl, gamma=1.0, quantile_lo=0.5) == pytest.approx({"c": 4 / 12, "d": 8 / 12})
    assert aparl_weights(ppl, gamma=0.0, quantile_lo=0.25) == pytest.approx(
        {"b": 1 / 3, "c": 1 / 3, "d": 1 / 3}
    )


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.text("abcdef", min_size=1, max_size=3), st.floats(1.0, 1e3), min_size=1, max_size=20),
    st.floats(0.0, 3.0),
    st.floats(0.0, 1.0),
)
def test_weights_are_a_distribution_monotone_in_perplexity(ppl, gamma, q_lo):
    w = aparl_weights(ppl, gamma=gamma, quantile_lo=q_lo)
    assert w and sum(w.values()) == pytest.approx(1.0)
    for a in w:
        for b in ppl:
            if ppl[b] > ppl[a]:
                assert b in w and w[b] >= w[a] * (1 - 1e-9)  # harder items are never less likely


def test_level_shifts_exactly_at_the_accuracy_threshold():
    assert next_level(0, 0.6, 0.6, 3) == 1
    assert next_level(0, 0.5999, 0.6, 3) == 0
    assert next_level(0, None, 0.6, 3) == 0
    assert next_level(3, 1.0, 0.6, 3) == 3
    assert quantile_floor(2, 0.25, 0.75) == 0.5 and quantile_floor(5, 0.25, 0.75) == 0.75


def _examples(n):
    return [Example(id=f"x{i}", prompt=f"p{i}", answer="a") for i in range(n)]


def test_sampler_curriculum_shifts_when_heldout_accuracy_crosses_threshold(monkeypatch):
    table = {f"x{i}": 1.0 + i for i in range(8)}  # x0 has PPL 1.0: saturated
    seen = []

    def fake(policy, encode, examples, **kw):
        seen.append([e.id for e in examples])
        return [table[e.id] for e in examples], 2 * len(examples)

    monkeypatch.setattr(aparl, "gold_perplexities", fake)
    s = SAMPLERS.get("aparl")(
        _examples(8),
        seed=0,
        stage_steps=1,
        shift_accuracy=0.6,
        quantile_step=0.5,
        max_quantile=0.5,
        min_pool=2,
    )
    s.bind(RunInfo(vocab_size=10, total_steps=10, policy=object(), encode_prompt=list))
    s.plan(0, 2, 4)
    assert s.level == 0 and "x0" in s.dropped and len(s.weights) == 7
    assert s.metrics()["ppl_rows"] == 8 and s.metrics()["ppl_tokens"] == 16
    s.observe_eval({"accuracy": 0.5}, 1)
    s.plan(1, 2, 4)
    assert s.level == 0 and len(s.weights) == 7 and seen[-1] == [f"x{i}" for i in range(1, 8)]
    s.observe_eval({"accuracy": 0.6}, 2)
    s.plan(2, 2, 4)
    assert s.level == 1 and s.metrics()["quantile_lo"] == 0.5
    assert set(s.weights) == {"x4", "x5", "x6", "x7"}  # the upper half of the PPL ranks
    plan = s.plan(2, 2, 4)  # another round of the same step (no new stage)
    assert {e.id for e in plan.examples} <= set(s.weights)
    # an all-correct group saturates its item at the next stage
    s.observe([GroupOutcome(_examples(8)[7], [1.0, 1.0], [True, True], [1, 1])], 2)
    s.plan(3, 2, 4)
    assert "x7" in s.dropped and "x7" not in s.weights


def _fake_ppl(monkeypatch, table):
    def fake(policy, encode, examples, **kw):
        return [table[e.id] for e in examples], len(examples)

    monkeypatch.setattr(aparl, "gold_perplexities", fake)


def test_a_stage_is_one_pass_over_the_current_pool(monkeypatch):
    table = {f"x{i}": (1.0 if i < 8 else 2.0 + i) for i in range(16)}  # x0..x7 saturated at stage 0
    _fake_ppl(monkeypatch, table)
    run = RunInfo(vocab_size=10, total_steps=10, policy=object(), encode_prompt=list)
    s = SAMPLERS.get("aparl")(_examples(16), seed=0, min_pool=2, accuracy_source="train")
    s.bind(run)
    s.plan(0, 4, 2)
    assert len(s.ppl) == 8  # 8 items left
    s.plan(1, 4, 2)
    assert s.stage == 0
    s.plan(2, 4, 2)
    assert s.stage == 1  # the next pass starts after 8 / 4 = 2 steps, not 16 / 4 = 4
    assert s.metrics()["stage_steps"] == 2.0
    o = SAMPLERS.get("aparl")(_examples(16), seed=0, min_pool=2, stage_pool="original")
    o.bind(run)
    o.plan(0, 4, 2)
    assert o.metrics()["stage_steps"] == 4.0


def test_minibatch_proficiency_moves_the_level_every_step_relative_to_its_baseline(monkeypatch):
    _fake_ppl(monkeypatch, {f"x{i}": 1.5 + i for i in range(8)})
    s = SAMPLERS.get("aparl")(
        _examples(8),
        seed=0,
        stage_steps=100,
        accuracy_source="minibatch",
        shift_margin=0.1,
        shift_baseline=0.3,
        quantile_step=0.25,
        max_quantile=0.75,
        min_pool=2,
    )
    s.bind(RunInfo(vocab_size=10, total_steps=10, policy=object(), encode_prompt=list))
    ex = _examples(8)

    def step(i, accs):
        s.plan(i, 2, 4)
        groups = [
            GroupOutcome(ex[j], [0.0] * 4, [k < round(a * 4) for k in range(4)], [1] * 4)
            for j, a in enumerate(accs)
        ]
        s.observe(groups, i)

    step(0, [0.25, 0.5])  # 0.375 < 0.3 + 0.1
    assert s.level == 0
    step(1, [0.5, 0.5])  # 0.5 >= 0.4: up, the baseline is re-taken at the next step
    assert s.level == 1 and s.baseline is None and s.metrics()["quantile_lo"] == 0.25
    assert len(s.weights) == 6  # re-weighted at once, no new stage
    step(2, [0.5, 0.5])  # baseline 0.5
    assert s.level == 1 and s.baseline == 0.5
    step(3, [0.5, 0.75])  # 0.625 >= 0.6
    assert s.level == 2 and s.stage == 0
    with pytest.raises(ValueError, match="accuracy_source"):
        SAMPLERS.get("aparl")(_examples(2), accuracy_source="mc")


def test_reverse_and_frozen_controls():
    ppl = {"a": 1.0, "b": 2.0, "c": 4.0}
    w = aparl.aparl_weights(ppl, gamma=-1.0)
    assert w["a"] > w["b"] > w["c"]  # aparl-reverse: p ∝ 1/PPL
    s = SAMPLERS.get("aparl")(_examples(4), quantile_step=0.0)  # aparl-frozen
    assert s.max_level == 0


def test_gold_perplexities_match_a_direct_forward():
    from posttrain.models import load_adapter

    lm = load_adapter("tiny", device="cpu", seed=0)
    tok = lm.tokenizer
    exs = [
        Example(id="a", prompt="C: hi\nevent:", answer="late"),
        Example(id="b", prompt="x", answer="refund"),
    ]
    ppl, tokens = gold_perplexities(lm, lambda p: tok.encode(p, add_special_tokens=False), exs, batch_size=1)
    assert tokens == len("late") + 1 + len("refund") + 1
    for ex, got in zip(exs, ppl, strict=True):
        p = tok.encode(ex.prompt, add_special_tokens=False)
        a = [*tok.encode(ex.answer, add_special_tokens=False), tok.eos_token_id]
        with torch.no_grad():
            logits = lm.model(torch.tensor([p + a])).logits[0].double()
        lp = torch.log_softmax(logits, -1)
        nll = -sum(lp[len(p) - 1 + j, t] for j, t in enumerate(a)) / len(a)
        assert got == pytest.approx(math.exp(float(nll)), rel=1e-4)


def test_perplexity_scores_the_reference_completion_not_the_bare_answer():
    from posttrain.models import load_adapter

    lm = load_adapter("tiny", device="cpu", seed=0)
    tok = lm.tokenizer
    task = get_task("arithmetic", digits=2, ops="+", n_train=6, n_heldout=2, format="scratchpad")
    exs = task.split("train")
    enc = lambda p: tok.encode(p, add_special_tokens=False)  # noqa: E731
    s = SAMPLERS.get("aparl")(exs, seed=0, stage_steps=1, min_pool=6, reference_style="long")
    s.bind(RunInfo(vocab_size=10, total_steps=2, policy=lm, encode_prompt=enc, task=task))
    s.plan(0, 2, 2)
    refs = [task.reference_completion(e, style="long") for e in exs]
    assert all("####" in r and r != e.answer for r, e in zip(refs, exs, strict=True))
    assert s.metrics()["ppl_tokens"] == sum(len(enc(r)) + 1 for r in refs)
    want, _ = aparl.gold_perplexities(
        lm, enc, exs, target=lambda e: task.reference_completion(e, style="long")
    )
    assert [s.ppl[e.id] for e in exs] == pytest.approx(want)
    # target: answer scores the bare answer
    b = SAMPLERS.get("aparl")(exs, seed=0, stage_steps=1, min_pool=6, target="answer")
    b.bind(RunInfo(vocab_size=10, total_steps=2, policy=lm, encode_prompt=enc, task=task))
    b.plan(0, 2, 2)
    assert b.metrics()["ppl_tokens"] == sum(len(enc(e.answer)) + 1 for e in exs)
    # a task without reference completions is named, with the way out
    s.task = None
    with pytest.raises(ValueError, match="target=answer"):
        s.target_text(exs[0])


def test_bad_params_named():
    with pytest.raises(ValueError, match="accuracy_source"):
        SAMPLERS.get("aparl")(_examples(4), accuracy_source="val")
    with pytest.raises(ValueError, match="stage_steps"):
        SAMPLERS.get("aparl")(_examples(4), stage_steps=0)


@pytest.mark.parametrize(("key", "value"), [("max_rounds", 10), ("oversample", 2.0)])
def test_the_inner_loops_params_are_the_filters_and_say_so(key, value):
    """Until 0.2.0 the sampler owned its DAPO filter; its params now name where they went (an unknown
    param error would not)."""
    from posttrain.train.config import load_rl_config
    from posttrain.utils.config import ConfigError

    with pytest.raises(ConfigError) as err:
        load_rl_config(None, [f"hooks.sampler={{name: aparl, params: {{{key}: {value}}}}}"])
    msg = str(err.value)
    assert f"params: aparl: {key}:" in msg
    assert f"hooks.filter={{name: dynamic-sampling, params: {{{key}: {value}}}}}" in msg


def test_every_filtered_round_reaches_the_curriculum():
    """``observe_round`` (the loop calls it for each round a filter judges) records every group; the
    step's ``observe`` then adds nothing twice; without a filter ``observe`` records the one round."""
    s = SAMPLERS.get("aparl")(_examples(4), accuracy_source="train")
    a = _outcome("q0", [1, 1])  # all correct: the filter drops it, the curriculum must see it
    b = _outcome("q1", [0, 1])
    s.observe_round([a], 0)
    s.observe_round([b], 0)
    s.observe([b], 0)
    assert s._train_acc == [1.0, 0.5] and s.solved == {"q0"}
    s.observe([_outcome("q2", [0, 0])], 1)  # no filter: the step's groups arrive here
    assert s._train_acc == [1.0, 0.5, 0.0]


def _outcome(qid, correct):
    return GroupOutcome(
        Example(id=qid, prompt=qid, answer="a"),
        [float(c) for c in correct],
        [bool(c) for c in correct],
        [3] * len(correct),
    )


def test_end_to_end_pool_changes_over_time_and_is_logged(tmp_path):
    from posttrain.train.config import load_rl_config
    from posttrain.train.rl import RLTrainer
    from posttrain.utils.io import read_jsonl

    cfg = load_rl_config(
        None,
        [
            "model.name=tiny",
            "model.device=cpu",
            "task.name=dialogue-events",
            "task.params={n_train: 24, n_heldout: 4, n_ood: 4}",
            "reward.num_workers=0",
            "rollout.prompts_per_step=4",
            "rollout.group_size=4",
            "rollout.max_new_tokens=3",
            "steps=3",
            "eval.at_start=false",
            "eval.at_end=false",
            "checkpoint.final=false",
            "logging.progress=false",
            "threads=1",
            "hooks.sampler={name: aparl, params: {stage_steps: 1, accuracy_source: train, shift_accuracy: 0.0, "
            "quantile_step: 0.25, max_quantile: 0.5, min_pool: 8}}",
            "hooks.filter={name: dynamic-sampling, params: {max_rounds: 1}}",
            f"out_dir={tmp_path / 'run'}",
        ],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with RLTrainer(cfg) as tr:
            tr.train(progress=False)
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r.get("kind") == "step"]
    assert [r["sampler/level"] for r in rows] == [0.0, 1.0, 2.0]
    assert [r["sampler/quantile_lo"] for r in rows] == [0.0, 0.25, 0.5]
    sampled = [r["sampler/pool_sampled"] for r in rows]
    assert sampled[0] > sampled[1] > sampled[2]  # the sampled pool narrows to higher perplexity
    assert all(r["sampler/ppl_seconds"] > 0 and r["sampler/ppl_rows"] >= 8 for r in rows)


def test_trainer_loop_reports_every_round_so_drop_solved_fires_and_the_signal_counts_all_groups(tmp_path):
    """Through the real trainer: items whose groups are always all correct are dropped by DAPO's filter,
    yet they reach the curriculum (drop_solved removes them at the next stage) and the training
    accuracy signal averages EVERY sampled group, not only the kept ones (0 < acc < 1)."""
    from posttrain.train.config import load_rl_config
    from posttrain.train.rl import RLTrainer
    from posttrain.utils.io import read_jsonl

    solved = {f"dialogue-events-train-{i}" for i in range(0, 24, 2)}

    def reward(text: str, ex: Example) -> float:
        if ex.id in solved:
            return 1.0
        return float(sum(map(ord, text)) % 2)  # the rest: mixed groups (mostly)

    cfg = load_rl_config(
        None,
        [
            "model.name=tiny",
            "model.device=cpu",
            "task.name=dialogue-events",
            "task.params={n_train: 24, n_heldout: 4, n_ood: 4}",
            "reward.num_workers=0",
            "rollout.prompts_per_step=6",
            "rollout.group_size=4",
            "rollout.max_new_tokens=4",
            "steps=2",
            "eval.at_start=false",
            "eval.at_end=false",
            "checkpoint.final=false",
            "logging.progress=false",
            "threads=1",
            "hooks.sampler={name: aparl, params: {stage_steps: 1, accuracy_source: train, shift_accuracy: 1.0, "
            "saturated_ppl: 0.0, min_pool: 1}}",
            "hooks.filter={name: dynamic-sampling, params: {max_rounds: 3}}",
            f"out_dir={tmp_path / 'run'}",
        ],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = RLTrainer(cfg, reward=reward)
    ids = {e.id for e in tr.task.split("train")}
    assert solved <= ids  # the test's id pattern matches the task's
    seen: dict[int, list[GroupOutcome]] = {}
    decide = tr.collector.group_filter.decide

    def spy(outcomes, need):
        seen.setdefault(tr.step_idx, []).extend(outcomes)
        return decide(outcomes, need)

    tr.collector.group_filter.decide = spy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tr:
            tr.train(progress=False)
    first = seen[0]
    solved_seen = {o.example.id for o in first if o.example.id in solved}
    assert solved_seen, "no always-solved item was sampled in step 0"
    assert solved_seen <= tr.collector.sampler.dropped  # drop_solved fired at the stage boundary of step 1
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r.get("kind") == "step"]
    every = sum(o.accuracy for o in first) / len(first)
    kept = [o.accuracy for o in first if 0 < o.accuracy < 1]
    assert rows[1]["sampler/accuracy_signal"] == pytest.approx(every)
    assert len(first) > len(kept) and any(o.accuracy == 1.0 for o in first)  # dropped groups counted
    assert rows[0]["filter/rounds"] == rows[0]["sampling_rounds"]  # the inner loop is the filter slot's


def test_ablation_arms_build_valid_configs_on_dialogue_events(tmp_path):
    """The bench's new arms and its dialogue-events task option give valid trainer configs (the bench
    itself is measured with ``posttrain bench ablation``, docs/replay-and-curriculum.md)."""
    from importlib.resources import files

    from posttrain.train.config import RLConfig
    from posttrain.utils.config import build_config
    from posttrain_lab.benchmarks.ablation import AblationSettings, arm_overrides

    s = AblationSettings(arms=["nexgrpo", "random-failure", "success", "aparl"], task="dialogue-events")
    base = str(files("posttrain_lab.demos") / "demo.yaml")
    for arm in s.arms:
        cfg = build_config(RLConfig, base, arm_overrides(s, arm, 0, tmp_path / arm))
        assert cfg.task.name == "dialogue-events" and cfg.rollout.max_new_tokens == 12
    assert cfg.hooks.sampler.name == "aparl"
    with pytest.raises(ValueError, match="--task must be one of"):
        AblationSettings(task="nope")


def test_experiment_arms_build_and_baseline_choice(tmp_path):
    """The APARL experiment's arms are valid configs; the level-0 threshold base is the arm's own
    first signal (``shift_baseline: null``) or the warm-start gate's accuracy, as chosen."""
    from posttrain.train.config import load_rl_config
    from posttrain_lab.recipes.aparl.experiment import ARMS, CONFIG, arm_overrides

    for arm in ARMS:
        for base in (None, 0.31):
            ov = arm_overrides(arm, baseline=base, margin=0.05, stage_steps=4, drop_solved=base is None)
            cfg = load_rl_config(str(CONFIG), [*ov, f"out_dir={tmp_path / arm}"])
            p = cfg.hooks.sampler.params
            assert cfg.hooks.filter.name == "dynamic-sampling" and cfg.hooks.filter.params["max_rounds"] == 10
            if arm == "dapo":
                assert cfg.hooks.sampler.name == "uniform"
                continue
            assert p["shift_baseline"] == base and p["shift_margin"] == 0.05 and p["stage_steps"] == 4
            assert p["drop_solved"] is (base is None)
            assert p["gamma"] == (-1.0 if arm == "aparl-reverse" else 1.0)
            assert p["quantile_step"] == (0.0 if arm == "aparl-frozen" else 0.25)


def test_experiment_counts_the_rollouts_dapo_drew():
    """Both arms draw extra rounds with the group filter (``filter/``); logs written before 0.2.0 hold
    APARL's under ``sampler/`` (its sampler owned the filter), and counting only ``sampler/`` gave the
    dapo arm its kept batch (10240) instead of what it drew."""
    from posttrain.train.rl import step_rollouts

    assert step_rollouts({"filter/rollouts_generated": 152.0, "num_sequences": 128.0}) == 152.0
    assert step_rollouts({"sampler/rollouts_generated": 184.0, "num_sequences": 128.0}) == 184.0
    assert step_rollouts({"num_sequences": 128.0}) == 128.0
