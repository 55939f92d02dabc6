"""E3, ASRR and DAPO hooks end to end through the real RL loop on the tiny preset (1-4 steps), their
config-time checks, the shipped configs, and resume with their state."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from _train_helpers import Constant, FirstCharDigit

from posttrain.hooks import DynamicSamplingWarning
from posttrain.models import sequence_logprobs
from posttrain.rollout import FunctionRewardSource
from posttrain.train.config import load_rl_config
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer
from posttrain_lab.recipes.asrr.hooks import NO_THINKING_PREFIX, NO_THINKING_TEMPLATE, ASRRShaper
from posttrain_lab.recipes.dapo.hooks import DAPOOverlongShaper
from posttrain_lab.recipes.e3.hooks import e3_temperature_step

RECIPES = Path(__file__).resolve().parents[2] / "posttrain_lab" / "recipes"
BASE = [
    "model.name=tiny",
    "model.device=cpu",
    'task.params={digits: 1, ops: "+", n_train: 8, n_heldout: 8}',
    "reward.num_workers=0",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=4",
    "eval.n=4",
    "eval.at_start=false",
    "optimizer.lr=1e-2",
    "threads=1",
]
E3 = [
    "hooks.sampler={name: e3, params: {g_min: 2, g_max: 6, widen: 2}}",
    "hooks.controllers=[{name: e3-temperature}]",
]


def cfg(tmp_path, *extra, config=None):
    return load_rl_config(config, [*BASE, f"out_dir={tmp_path / 'run'}", *extra])


def trainer(tmp_path, *extra, reward=None, config=None):
    src = FunctionRewardSource(reward or FirstCharDigit(), num_workers=0)
    return RLTrainer(cfg(tmp_path, *extra, config=config), reward_source=src)


def steps(tr, n):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        return [tr.step() for _ in range(n)]


# -------------------------------------------------------------------------------------------- E3
def test_e3_ranks_at_epoch_end_widen_bounds_and_vary_group_sizes(tmp_path):
    tr = trainer(tmp_path, *E3)
    ms = steps(tr, 3)  # 8 questions, 4 per step: epoch 0 = steps 1-2; step 3 uses ranks and 2/6 bounds
    assert [m["sampler/g_min"] for m in ms] == [4, 4, 2] and [m["sampler/g_max"] for m in ms] == [4, 4, 6]
    assert ms[0]["group_size_min"] == ms[0]["group_size_max"] == 4
    assert len(tr.collector.sampler.ranks) == 8 and all(
        0 <= r < 1 for r in tr.collector.sampler.ranks.values()
    )
    assert ms[2]["num_sequences"] == 16  # the rollout budget is unchanged
    # step 3's groups follow the ranks: harder (lower mean reward) questions got at least as many
    stats = tr.collector.sampler.stats
    sizes = {}
    plan = tr.collector.sampler.plan(99, 4, 4)
    for ex, n in zip(plan.examples, plan.n_per_prompt, strict=True):
        sizes[ex.id] = n
    means = {k: v[0] / v[1] for k, v in stats.items()}
    for a in sizes:
        for b in sizes:
            if means[a] < means[b]:
                assert sizes[a] >= sizes[b]


def test_e3_temperature_targets_the_first_entropy_and_drives_sampling_and_training(tmp_path):
    tr = trainer(tmp_path, *E3)
    m1, m2, m3 = steps(tr, 3)
    assert m1["temperature"] == m2["temperature"] == 1.0  # step 1 sets the target: α = 1
    assert m1["controller/target_entropy"] == pytest.approx(m1["entropy_pre_update"])
    expected = e3_temperature_step(1.0, m2["entropy_pre_update"], m1["entropy_pre_update"], 357)
    assert m3["temperature"] == pytest.approx(expected) and m3["temperature"] != 1.0
    # the training log-probs use the same τ as sampling (sampling log-probs match)
    assert m3["rollout_logp_diff"] < 1e-4


@pytest.mark.parametrize("extra", [[], ["minibatches=2"]])
def test_entropy_pre_update_is_the_no_grad_entropy_of_the_sampling_policy(tmp_path, extra):
    tr = trainer(tmp_path, *extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        ro = tr.rollout()
        with torch.no_grad():
            _, ent = sequence_logprobs(
                tr.model,
                ro.input_ids,
                ro.attention_mask,
                response_mask=ro.score_mask,
                temperature=ro.temperature,
            )
        ent = ent[:, ro.prompt_width :]
        expected = float((ent * ro.actions).sum() / ro.actions.sum())
        fw = tr.forward_without_rewards(ro)
        sc = tr.score(ro)
        m = tr.report(ro, fw, sc, tr.update(ro, fw, sc), t_start=0.0)
    assert m["entropy_pre_update"] == pytest.approx(expected, rel=1e-5)


def test_e3_group_size_outside_bounds_is_an_error_naming_the_keys(tmp_path):
    tr = trainer(tmp_path, "hooks.sampler={name: e3, params: {g_min: 5, g_max: 6}}")
    with pytest.raises(ValueError, match=r"rollout\.group_size=4.*g_min"):
        tr.step()


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("hooks.sampler={name: e3, params: {g_min: 8, g_max: 4}}", "g_max"),
        ("hooks.sampler={name: e3, params: {widen: -1}}", "widen"),
        ("hooks.controllers=[{name: e3-temperature, params: {eta: 1.5}}]", "eta"),
        ("hooks.shapers=[{name: asrr, params: {tau: 1.5}}]", "tau"),
        ("hooks.shapers=[{name: asrr, params: {window: -5}}]", "window"),
        ("hooks.shapers=[{name: asrr, params: {markers: wait}}]", "markers"),
        ("hooks.filter={name: dynamic-sampling, params: {max_rounds: 0}}", "max_rounds"),
        ("hooks.shapers=[{name: dapo-overlong, params: {max_length: 8, buffer: 16}}]", "buffer"),
    ],
)
def test_bad_hook_settings_are_config_errors_naming_the_key(tmp_path, override, key):
    with pytest.raises(ValueError, match=rf"hooks\.(sampler|controllers|shapers|filter)[\s\S]*{key}"):
        cfg(tmp_path, override)


# ------------------------------------------------------------------------------------------ ASRR
def test_asrr_shaper_penalises_long_correct_rollouts_only_in_solved_groups():
    sh = ASRRShaper(beta=0.5, window=4, tau=1.0)
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    gids = torch.tensor([0, 0, 0, 1, 1, 1])
    out = sh.shape(
        rewards,
        gids,
        correct=rewards > 0.5,
        lengths=torch.tensor([2, 4, 8, 2, 9, 3]),
        truncated=torch.zeros(6),
    )
    assert out.tolist() == pytest.approx([1.0, 0.75, 0.5, 1.0, 1.0, 0.0])


def test_asrr_no_thinking_template_is_used_in_rollout_and_evaluation(tmp_path):
    tr = trainer(
        tmp_path, f"task.assistant_prefix={json.dumps(NO_THINKING_PREFIX)}", "hooks.shapers=[{name: asrr}]"
    )
    assert tr.formatter.full_text("1+1=?\n").endswith(NO_THINKING_PREFIX)
    assert NO_THINKING_TEMPLATE.endswith(NO_THINKING_PREFIX)  # the deprecated user-text form
    ms = steps(tr, 1)
    assert ms[0]["reward_shaped_mean"] <= ms[0]["reward_mean"] + 1e-9
    ev = tr.evaluate()
    prompt_ids = tr.formatter.encode(tr.task.split("heldout")[0].prompt)
    assert tr.tokenizer.decode(prompt_ids).endswith(NO_THINKING_PREFIX) and "accuracy" in ev
    assert "continue_thinking" in ev and "continue_thinking_frac" in ms[0]


# ------------------------------------------------------------------------------------------ DAPO
def test_dapo_overlong_shaper_adds_the_soft_penalty():
    sh = DAPOOverlongShaper(max_length=8, buffer=4)
    out = sh.shape(
        torch.ones(4),
        torch.zeros(4, dtype=torch.long),
        correct=None,
        lengths=torch.tensor([3, 4, 6, 8]),
        truncated=None,
    )
    assert out.tolist() == pytest.approx([1.0, 1.0, 0.5, 0.0])


DAPO_FILTER = "hooks.filter={name: dynamic-sampling, params: {max_rounds: %d}}"


def test_dapo_dynamic_sampling_trains_only_on_groups_with_reward_variance(tmp_path):
    tr = trainer(tmp_path, DAPO_FILTER % 20)
    (m,) = steps(tr, 1)
    assert m["zero_var_frac"] == 0.0 and m["num_groups"] == 4
    assert m["sampling_rounds"] == m["filter/rounds"] and m["filter/cap_hit"] == 0.0
    # every round samples group_size completions for each still-missing group: more than the 16 kept
    assert m["filter/rollouts_generated"] >= 16 + 4 * (m["filter/rounds"] - 1)
    assert not [k for k in m if k.startswith("sampler/")]  # the uniform sampler reports nothing


def test_dapo_dynamic_sampling_warns_when_the_round_cap_is_hit(tmp_path):
    tr = trainer(tmp_path, DAPO_FILTER % 2, reward=Constant())
    with pytest.warns(DynamicSamplingWarning, match="max_rounds=2"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    assert m["filter/cap_hit"] == 1.0 and m["sampling_rounds"] == 2 and m["filter/rollouts_generated"] == 32


# ------------------------------------------------------------------------------- configs + resume
@pytest.mark.parametrize(
    ("recipe", "name"), [("e3", "e3"), ("asrr", "asrr"), ("dapo", "dapo"), ("e3", "e3-asrr-dgpo")]
)
def test_shipped_config_runs_one_step(tmp_path, recipe, name):
    # the overlong penalty's max_length must follow rollout.max_new_tokens (checked at config time)
    shaper = "hooks.shapers=[{name: dapo-overlong, params: {max_length: 6, buffer: 2}}]"
    overlong = [shaper] if name == "dapo" else []
    tr = trainer(
        tmp_path,
        'task.params={digits: 1, ops: "+", n_train: 8, n_heldout: 8, format: scratchpad}',
        "rollout.max_new_tokens=6",
        "rollout.group_size=8",
        *overlong,
        config=RECIPES / recipe / f"{name}.yaml",
    )
    (m,) = steps(tr, 1)
    assert m["num_sequences"] >= 8


def test_resume_with_e3_asrr_dapo_state_gives_identical_weights(tmp_path):
    extra = [
        *E3,
        "hooks.shapers=[{name: asrr, params: {window: 2}}]",
        "checkpoint.every=2",
        "checkpoint.final=false",
        "eval.at_end=false",
    ]

    def run(sub, n, resume=False):
        t = RLTrainer(cfg(tmp_path / sub, f"steps={n}", *extra), resume=resume)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateSettingWarning)
            t.train(progress=False)
        t.close()
        return t

    full = run("a", 4)
    run("b", 2)
    resumed = run("b", 4, resume=True)
    rs, fs = resumed.collector.sampler, full.collector.sampler
    assert rs.ranks == fs.ranks and rs.stats == fs.stats
    assert resumed.controllers[0].tau == full.controllers[0].tau
    for (n, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert torch.equal(a, b), n
