"""Hook slots compose through the real loop: E3's sampler + the DAPO group filter + NexGRPO replay +
two shapers (ASRR, then the DAPO overlong penalty) in one run.

Contracts checked (``posttrain.hooks.base``): the replay buffer's ``mix`` and ``draw`` run exactly once
per step, before the first rollout round, even when the filter samples more rounds; the shapers apply
in list order and each one changes the rewards the advantage estimator receives; a shaper's own metric
(ASRR's Continue-Thinking ratio) reaches the step's metrics beside the others'."""

from __future__ import annotations

import warnings

import pytest
import torch

from posttrain.hooks import GROUP_FILTERS, DynamicSamplingFilter, KeepAll
from posttrain.rollout import FunctionRewardSource
from posttrain.train.config import load_rl_config
from posttrain.train.rl import RLTrainer
from posttrain.utils.config import ConfigError
from posttrain_lab.recipes.asrr.hooks import ASRRShaper
from posttrain_lab.recipes.dapo.hooks import DAPOOverlongShaper
from posttrain_lab.recipes.e3.hooks import E3Sampler
from posttrain_lab.recipes.nexgrpo.replay import NexGRPOReplay


class EvenFirstCharPartial:
    """0.8 when the first character's code point is even (about half of a random policy's samples),
    else 0: partially solved groups, and a raw reward that ASRR's 1[correct] visibly changes."""

    name = "even_first_char_partial"

    def __call__(self, completion, example):
        return 0.8 if completion and ord(completion[0]) % 2 == 0 else 0.0


COMPOSED = [
    "hooks.sampler={name: e3, params: {g_min: 2, g_max: 6, widen: 2}}",
    "hooks.filter={name: dynamic-sampling, params: {max_rounds: 4}}",
    "hooks.replay={name: nexgrpo, params: {start_accuracy: 0.0, start_step: 0, ratio: 0.5, gate: none}}",
    "hooks.shapers=[{name: asrr, params: {tau: 0.0, window: 2}}, "
    "{name: dapo-overlong, params: {max_length: 6, buffer: 4}}]",
]


def _trainer(tmp_path, *extra):
    cfg = load_rl_config(
        None,
        [
            "model.name=tiny",
            "model.device=cpu",
            "task.name=dialogue-events",
            "task.params={n_train: 16, n_heldout: 4, n_ood: 4}",
            "reward.num_workers=0",
            "reward.success_threshold=0.5",
            "rollout.prompts_per_step=4",
            "rollout.group_size=4",
            "rollout.max_new_tokens=6",
            "optimizer.lr=1e-2",
            "eval.at_start=false",
            "eval.at_end=false",
            "checkpoint.final=false",
            "threads=1",
            f"out_dir={tmp_path / 'run'}",
            *extra,
        ],
    )
    tr = RLTrainer(cfg, reward_source=FunctionRewardSource(EvenFirstCharPartial(), num_workers=0))
    # the tiny preset almost never samples EOS, so every completion would be max_new_tokens long and
    # ASRR's length penalty (relative to the shortest correct answer) could not act: a policy with a
    # +4 bias on the EOS logit stops early at random (generation and training log-probs alike)
    eos = tr.tokenizer.eos_token_id

    def eos_bias(module, inputs, out):
        out = out.clone()
        out[..., eos] += 4.0
        return out

    tr.model.get_output_embeddings().register_forward_hook(eos_bias)
    return tr


def test_e3_sampler_dapo_filter_nexgrpo_replay_and_two_shapers_compose(tmp_path):
    tr = _trainer(tmp_path, *COMPOSED)
    c = tr.collector
    assert isinstance(c.sampler, E3Sampler) and isinstance(c.group_filter, DynamicSamplingFilter)
    assert isinstance(c.replay, NexGRPOReplay)
    assert [type(s) for s in tr.shapers] == [ASRRShaper, DAPOOverlongShaper]

    calls: list[tuple[str, int]] = []
    for name in ("mix", "draw"):
        orig = getattr(c.replay, name)

        def spy(plan, step, _orig=orig, _name=name):
            calls.append((_name, step))
            return _orig(plan, step)

        setattr(c.replay, name, spy)
    seen: list[torch.Tensor] = []
    adv_fn = tr.adv_fn

    class AdvSpy:
        def __getattr__(self, k):
            return getattr(adv_fn, k)

        def __call__(self, rewards, group_ids, **kw):
            seen.append(rewards.clone())
            return adv_fn(rewards, group_ids, **kw)

    tr.adv_fn = AdvSpy()
    scores = []
    orig_score = tr.score
    tr.score = lambda ro: scores.append(orig_score(ro)) or scores[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ms = [tr.step() for _ in range(4)]

    # replay mix + draw exactly once per step, mix before draw, whatever the number of rounds
    assert calls == [(k, s) for s in range(4) for k in ("mix", "draw")]
    rounds = [m["sampling_rounds"] for m in ms]
    assert sum(rounds) > len(ms), rounds  # the filter did sample extra rounds in some step
    assert [m["filter/rounds"] for m in ms] == rounds
    assert all(m["zero_var_frac"] == 0.0 or m["filter/cap_hit"] == 1.0 for m in ms)
    assert any(m["replayed"] > 0 for m in ms)  # NexGRPO put stored failures into groups
    assert all(0.0 <= m["continue_thinking_frac"] <= 1.0 for m in ms)  # ASRR's own metric, via its hook

    # each shaper changed the rewards, in order, and the advantage saw the composition
    for m, sc, adv_in in zip(ms, scores, seen, strict=True):
        assert m["shaping/0_asrr_abs_change"] > 0 and m["shaping/1_dapo-overlong_abs_change"] > 0
        assert torch.equal(adv_in, sc.shaped)
        assert not torch.equal(sc.shaped, sc.raw)


def test_composition_is_the_shapers_applied_in_order(tmp_path):
    """The rewards the advantage sees are overlong(asrr(raw)), not one shaper alone (both are additive
    penalties, so their order does not change the sum)."""
    tr = _trainer(tmp_path, *COMPOSED)
    rollouts = []
    orig = tr.rollout
    tr.rollout = lambda: rollouts.append(orig()) or rollouts[-1]
    scores = []
    orig_score = tr.score
    tr.score = lambda ro: scores.append(orig_score(ro)) or scores[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr.step()
    (ro,), (sc,) = rollouts, scores
    b = ro.episodes.batch
    kw = dict(correct=sc.correct, lengths=b.action_lengths.cpu(), truncated=b.truncated)
    asrr, overlong = tr.shapers
    in_order = overlong.shape(asrr.shape(sc.raw.clone(), b.group_ids, **kw), b.group_ids, **kw)
    assert torch.allclose(sc.shaped, in_order)
    assert not torch.allclose(sc.shaped, asrr.shape(sc.raw.clone(), b.group_ids, **kw))
    assert not torch.allclose(sc.shaped, overlong.shape(sc.raw.clone(), b.group_ids, **kw))


def test_the_shapers_list_is_the_one_way_to_compose_shapers():
    cfg = load_rl_config(
        None,
        [
            "rollout.max_new_tokens=6",  # the overlong max_length must equal the length limit
            "hooks.shapers=[{name: asrr}, {name: dapo-overlong, params: {max_length: 6, buffer: 4}}]",
        ],
    )
    assert [s.name for s in cfg.hooks.shapers] == ["asrr", "dapo-overlong"]
    assert load_rl_config(None, []).hooks.shapers == []
    with pytest.raises(ConfigError, match=r"hooks\.shaper was removed in 0\.2\.0; use hooks\.shapers"):
        load_rl_config(None, ["hooks.shaper={name: asrr}"])


def test_filter_registry_and_noop_default():
    assert GROUP_FILTERS.get("dapo") is DynamicSamplingFilter  # alias
    assert GROUP_FILTERS.get("none") is KeepAll and not KeepAll.active
    with pytest.raises(ValueError, match="max_rounds"):
        load_rl_config(None, ["hooks.filter={name: dynamic-sampling, params: {max_rounds: 0}}"])
