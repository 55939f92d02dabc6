"""APARL fixes (issue 26; every rule is a proposed design): perplexity of the task's reference
completion, every sampling round reaches the curriculum inside the trainer (drop_solved and the
training-accuracy signal see the groups DAPO drops), a stage is one pass over the current pool, and
the per-step Monte-Carlo proficiency signal with a threshold relative to its own baseline."""

from __future__ import annotations

import warnings

import pytest

import posttrain_lab.recipes.aparl.sampler as aparl
from posttrain.hooks import SAMPLERS, GroupOutcome, RunInfo
from posttrain.tasks import Example, get_task


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
    # target: answer keeps the bare-answer score (the behaviour before the fix)
    b = SAMPLERS.get("aparl")(exs, seed=0, stage_steps=1, min_pool=6, target="answer")
    b.bind(RunInfo(vocab_size=10, total_steps=2, policy=lm, encode_prompt=enc, task=task))
    b.plan(0, 2, 2)
    assert b.metrics()["ppl_tokens"] == sum(len(enc(e.answer)) + 1 for e in exs)
    # a task without reference completions is named, with the way out
    s.task = None
    with pytest.raises(ValueError, match="target=answer"):
        s.target_text(exs[0])


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
            "saturated_ppl: 0.0, min_pool: 1, max_rounds: 3}}",
            f"out_dir={tmp_path / 'run'}",
        ],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = RLTrainer(cfg, reward=reward)
    ids = {e.id for e in tr.task.split("train")}
    assert solved <= ids  # the test's id pattern matches the task's
    seen: dict[int, list[GroupOutcome]] = {}
    decide = tr.group_filter.decide

    def spy(outcomes, need):
        seen.setdefault(tr.step_idx, []).extend(outcomes)
        return decide(outcomes, need)

    tr.group_filter.decide = spy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tr:
            tr.train(progress=False)
    first = seen[0]
    solved_seen = {o.example.id for o in first if o.example.id in solved}
    assert solved_seen, "no always-solved item was sampled in step 0"
    assert solved_seen <= tr.sampler.dropped  # drop_solved fired at the stage boundary of step 1
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r.get("kind") == "step"]
    every = sum(o.accuracy for o in first) / len(first)
    kept = [o.accuracy for o in first if 0 < o.accuracy < 1]
    assert rows[1]["sampler/accuracy_signal"] == pytest.approx(every)
    assert len(first) > len(kept) and any(o.accuracy == 1.0 for o in first)  # dropped groups counted


def _examples(n):
    return [Example(id=f"x{i}", prompt=f"p{i}", answer="a") for i in range(n)]


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
