"""The RL loop end to end with the tiny preset: learning, every objective, variable groups, KL,
entropy bonus, gradient accumulation, off-policy updates, hooks, timeouts, warnings, resume."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

from posttrain.algos import agg_loss, list_policy_losses
from posttrain.models import sequence_logprobs
from posttrain.rollout import EpisodeRunner, FunctionRewardSource, RewardSource, ScoredBatch
from posttrain.rollout.reward_source import _Ready
from posttrain.sampling import (
    CONTROLLERS,
    REPLAY_BUFFERS,
    SAMPLERS,
    Controller,
    PromptPlan,
    PromptSampler,
    ReplayBuffer,
    Trajectory,
)
from posttrain.train.config import load_rl_config
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer

# reward-pool workers unpickle rewards by module path: keep them in a plain module on sys.path
sys.path.insert(0, str(Path(__file__).parent))
from _train_helpers import Constant, FirstCharDigit, SleepyReward

BASE = [
    "model.name=tiny",
    "model.device=cpu",
    'task.params={digits: 1, ops: "+", n_train: 60, n_heldout: 20}',
    "reward.num_workers=0",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=3",
    "eval.n=8",
    "eval.at_start=false",
    "optimizer.lr=1e-3",
]


def cfg(tmp_path, *extra):
    return load_rl_config(None, [*BASE, f"out_dir={tmp_path / 'run'}", *extra])


def trainer(tmp_path, *extra, reward=None, **kw):
    src = FunctionRewardSource(reward, num_workers=0) if reward is not None else None
    return RLTrainer(cfg(tmp_path, *extra), reward_source=src, **kw)


def test_reward_rises_on_a_learnable_reward(tmp_path):
    tr = trainer(
        tmp_path,
        "rollout.prompts_per_step=8",
        "rollout.group_size=8",
        "rollout.max_new_tokens=2",
        "optimizer.lr=5e-3",
        "objective.name=ppo",
        reward=FirstCharDigit(),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        rewards = [tr.step()["reward_mean"] for _ in range(14)]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.3, rewards


@pytest.mark.parametrize("objective", list_policy_losses())
def test_every_objective_runs_one_step(tmp_path, objective):
    tr = trainer(tmp_path, f"objective.name={objective}", reward=FirstCharDigit())
    before = [p.detach().clone() for p in tr.model.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    for k in (
        "reward_mean",
        "accuracy",
        "zero_var_frac",
        "length_mean",
        "length_max",
        "truncated_frac",
        "entropy",
        "clipfrac_low",
        "clipfrac_high",
        "approx_kl",
        "grad_norm",
        "tokens_per_s",
        "time_generation",
        "time_reward_wait",
        "time_update",
    ):
        assert k in m and m[k] == m[k], k
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # one on-policy update: ratio exactly 1
    if m["advantage_abs_mean"] > 0:
        assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters(), strict=True))


def test_single_on_policy_update_does_no_extra_forward(tmp_path, monkeypatch):
    import posttrain.train.rl as rl

    calls = []
    real = rl.sequence_logprobs
    monkeypatch.setattr(rl, "sequence_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    tr = trainer(tmp_path, reward=FirstCharDigit())
    tr.step()
    assert len(calls) == 1 and tr.ref_model is None  # kl.coef = 0: no reference model at all
    calls.clear()
    tr = trainer(tmp_path, "ppo_epochs=2", reward=FirstCharDigit())
    tr.step()
    assert len(calls) == 3  # old log-probs + one forward per epoch


class _VariableSampler(PromptSampler):
    SIZES = [1, 2, 5, 3]

    def __init__(self, examples, *, seed=0):
        self.examples = examples

    def plan(self, step, num_prompts, group_size):
        return PromptPlan(self.examples[:4], list(self.SIZES))


SAMPLERS.register("test-variable")(_VariableSampler)


def test_variable_group_sizes(tmp_path):
    tr = trainer(tmp_path, "hooks.sampler.name=test-variable", reward=FirstCharDigit())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    assert m["num_sequences"] == 11 and m["num_groups"] == 4
    assert (m["group_size_min"], m["group_size_max"]) == (1, 5)


def test_kl_to_reference_model(tmp_path):
    tr = trainer(tmp_path, "kl.coef=0.5", "kl.kind=k3", "optimizer.lr=1e-2", reward=FirstCharDigit())
    assert tr.ref_model is not None and not any(p.requires_grad for p in tr.ref_model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m1 = tr.step()
        m2 = tr.step()
    assert m1["kl"] == pytest.approx(0.0, abs=1e-6) and m1["kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert m2["kl"] != 0.0  # the policy moved away from the frozen reference


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_entropy_bonus_gradient_is_minus_coef_times_entropy_gradient(tmp_path):
    # constant reward -> all advantages 0 -> the policy-gradient term vanishes; what is left is the bonus
    coef = 0.3
    tr = trainer(tmp_path, f"entropy_coef={coef}", "optimizer.lr=1e-12", reward=Constant())
    model = tr.model
    snapshot = {n: p.detach().clone() for n, p in model.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    g = _grads(model)
    assert m["advantage_abs_mean"] == 0.0
    # recompute d/dθ[−coef · token-mean entropy] at the pre-step weights on the same rollout
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(snapshot[n])
    tr2 = trainer(tmp_path, reward=Constant())
    tr2.model.load_state_dict(model.state_dict())
    from posttrain.rollout import SamplingParams

    eps, _, _ = tr2._rollout(SamplingParams(max_new_tokens=3))
    ids, am, rm = eps.batch.model_inputs()
    _, ent = sequence_logprobs(tr2.model, ids, am, response_mask=rm)
    p = eps.batch.prompt_ids.shape[1]
    loss = -coef * agg_loss(ent[:, p:], eps.batch.completion_mask, "token-mean")
    tr2.model.zero_grad()
    loss.backward()
    ref = _grads(tr2.model)
    assert g.keys() == ref.keys()
    for n in g:
        torch.testing.assert_close(g[n], ref[n], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("objective", ["ppo", "gspo"])
def test_gradient_accumulation_equals_one_big_batch(tmp_path, objective):
    grads = []
    for micro in ("null", "3"):
        tr = trainer(
            tmp_path,
            f"micro_batch_size={micro}",
            f"objective.name={objective}",
            "entropy_coef=0.01",
            "kl.coef=0.1",
            reward=FirstCharDigit(),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateSettingWarning)
            tr.step()
        grads.append(_grads(tr.model))
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-7)


def test_off_policy_minibatches_and_epochs(tmp_path):
    tr = trainer(tmp_path, "minibatches=2", "ppo_epochs=2", "optimizer.lr=1e-2", reward=FirstCharDigit())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    assert m["grad_norm"] >= 0 and m["approx_kl"] == m["approx_kl"]


def test_reward_timeouts_are_counted_and_score_zero(tmp_path):
    src = FunctionRewardSource(SleepyReward(30.0), num_workers=1, timeout_s=0.2)
    try:
        tr = RLTrainer(cfg(tmp_path, "rollout.prompts_per_step=2", "rollout.group_size=2"), reward_source=src)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateSettingWarning)
            m = tr.step()
    finally:
        src.close()
    assert m["reward_timeouts"] == 4 and m["reward_mean"] == 0.0


def test_degenerate_settings_warn_loudly(tmp_path):
    with pytest.warns(DegenerateSettingWarning, match="group_size=1"):
        trainer(tmp_path, "rollout.group_size=1", reward=Constant())
    with pytest.warns(DegenerateSettingWarning, match="not divisible by minibatches"):
        trainer(tmp_path, "minibatches=3", reward=Constant())
    tr = trainer(tmp_path, "rollout.max_new_tokens=1", "rollout.suppress_eos=true", reward=Constant())
    with pytest.warns(DegenerateSettingWarning) as rec:
        tr.step()
    text = " ".join(str(w.message) for w in rec)
    assert "hit rollout.max_new_tokens" in text and "identical rewards" in text


class _HalfTemperature(Controller):
    def __init__(self, value=0.5):
        self.value = value
        self.seen = []

    def apply(self, knobs, step):
        knobs.temperature = self.value

    def update(self, metrics, step):
        self.seen.append(metrics["entropy"])
        return {"temperature": self.value}

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self.seen = state["seen"]


CONTROLLERS.register("test-half")(_HalfTemperature)


class _ReplayFirst(ReplayBuffer):
    """Replays the first fresh completion of the previous step into the first group."""

    needs_logprobs = True

    def __init__(self):
        self.stored = None

    def draw(self, plan, step):
        out = [[] for _ in plan.examples]
        if self.stored is not None:
            out[0] = [self.stored]
        return out

    def observe(self, episodes, rewards, correct, step):
        b = episodes.batch
        n = int(b.lengths[0])
        self.stored = Trajectory(
            b.completion_ids[0, :n].tolist(), b.logprobs[0, :n].tolist(), b.finish_reasons[0]
        )


REPLAY_BUFFERS.register("test-first")(_ReplayFirst)


def test_controller_temperature_drives_rollout_and_training(tmp_path):
    tr = trainer(tmp_path, "hooks.controllers=[{name: test-half}]", reward=FirstCharDigit())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    assert m["temperature"] == 0.5 and m["controller/temperature"] == 0.5
    # sampling log-probs (T = 0.5) match the training log-probs computed at the same T
    assert m["rollout_logp_diff"] < 1e-4


def test_replay_buffer_trajectories_join_groups_with_is_weights(tmp_path):
    tr = trainer(tmp_path, "hooks.replay.name=test-first", reward=FirstCharDigit())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m1 = tr.step()
        m2 = tr.step()
    assert m1["replayed"] == 0 and m2["replayed"] == 1
    assert m2["num_sequences"] == m1["num_sequences"]  # replayed slot replaces one fresh sample


def test_resume_gives_identical_weights(tmp_path):
    extra = [
        "checkpoint.every=2",
        "checkpoint.final=false",
        "eval.at_end=false",
        "minibatches=2",
        "reward.num_workers=0",
        "optimizer.lr=1e-2",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        full = RLTrainer(cfg(tmp_path / "a", "steps=4", *extra))
        full.train(progress=False)
        part = RLTrainer(cfg(tmp_path / "b", "steps=2", *extra))
        part.train(progress=False)
        del part
        resumed = RLTrainer(cfg(tmp_path / "b", "steps=4", *extra), resume=True)
        assert resumed.step_idx == 2
        resumed.train(progress=False)
    for (n, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert torch.equal(a, b), n
    from posttrain.utils.io import read_jsonl

    steps = [r["step"] for r in read_jsonl(tmp_path / "b" / "run" / "metrics.jsonl") if r["kind"] == "step"]
    assert steps == [1, 2, 3, 4]


class _KeepMixed(PromptSampler):
    """DAPO-style dynamic sampling through the hook: keep only groups with reward variance, resample."""

    filters_groups = True
    max_rounds = 3

    def __init__(self, examples, *, seed=0):
        self.examples, self.i = examples, 0
        self.rounds_seen = 0

    def plan(self, step, num_prompts, group_size):
        picked = [self.examples[(self.i + j) % len(self.examples)] for j in range(num_prompts)]
        self.i += num_prompts
        self.rounds_seen += 1
        return PromptPlan(picked, [group_size] * num_prompts)

    def keep_groups(self, outcomes):
        return [not o.zero_variance for o in outcomes]


SAMPLERS.register("test-keep-mixed")(_KeepMixed)


def test_group_filtering_sampler_resamples_and_keeps_only_informative_groups(tmp_path):
    tr = trainer(tmp_path, "hooks.sampler.name=test-keep-mixed", reward=Constant())
    with pytest.warns(DegenerateSettingWarning, match="kept no group"):
        m = tr.step()
    # a constant reward never gives variance: 3 rounds, then the last round is used as is
    assert m["sampling_rounds"] == 3 and tr.sampler.rounds_seen == 3 and m["num_groups"] == 4
    tr = trainer(
        tmp_path, "hooks.sampler.name=test-keep-mixed", "rollout.max_new_tokens=2", reward=FirstCharDigit()
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    assert 1 <= m["sampling_rounds"] <= 3
    if m["num_groups"] and m["zero_var_frac"] < 1:
        assert m["zero_var_frac"] == 0.0  # every kept group is informative


class _ParityWithComponents(RewardSource):
    """Rows of a group are contiguous, so alternating 0/1 gives every group of 4 reward variance."""

    def submit(self, completions, examples):
        r = [float(i % 2) for i in range(len(completions))]
        return _Ready(ScoredBatch(rewards=r, components={"parity": r, "one": [1.0] * len(r)}))


def test_group_filtering_sampler_keeps_reward_components(tmp_path):
    tr = RLTrainer(cfg(tmp_path, "hooks.sampler.name=test-keep-mixed"), reward_source=_ParityWithComponents())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    assert m["sampling_rounds"] == 1 and m["zero_var_frac"] == 0.0
    assert m["reward/parity"] == pytest.approx(m["reward_mean"]) == 0.5
    assert m["reward/one"] == 1.0


class _RefuseToScore(RewardSource):
    def submit(self, completions, examples):
        raise AssertionError("episodes that carry rewards must not be sent to the reward source")


class _SelfScoringRunner(EpisodeRunner):
    """An environment that scores its own episodes (as a multi-turn runner does)."""

    def __init__(self, inner):
        self.inner = inner

    def run(self, examples, n_per_prompt, params):
        ep = self.inner.run(examples, n_per_prompt, params)
        ep.rewards = torch.arange(len(ep), dtype=torch.float32) % 2
        return ep


def test_runner_supplied_rewards_bypass_the_reward_source(tmp_path):
    tr = RLTrainer(cfg(tmp_path), reward_source=_RefuseToScore())
    tr.runner = _SelfScoringRunner(tr.runner)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    assert m["reward_mean"] == 0.5 and m["zero_var_frac"] == 0.0


def test_replay_into_self_scored_episodes_is_refused_not_silently_dropped(tmp_path):
    tr = trainer(tmp_path, "hooks.replay.name=test-first", reward=FirstCharDigit())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        tr.step()  # fills the replay buffer
        tr.runner = _SelfScoringRunner(tr.runner)
        with pytest.raises(ValueError, match=r"hooks\.replay"):
            tr.step()


def test_resuming_a_finished_run_does_not_rewrite_its_checkpoint(tmp_path):
    extra = ["checkpoint.every=0", "checkpoint.final=true", "eval.at_end=false", "reward.num_workers=0"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        RLTrainer(cfg(tmp_path, "steps=1", *extra)).train(progress=False)
        ckpts = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
        assert len(ckpts) == 1
        before = ckpts[0].stat().st_ino, ckpts[0].stat().st_mtime_ns
        done = RLTrainer(cfg(tmp_path, "steps=1", *extra), resume=True)
        assert done.step_idx == 1
        done.train(progress=False)
    after = ckpts[0].stat().st_ino, ckpts[0].stat().st_mtime_ns
    assert after == before
