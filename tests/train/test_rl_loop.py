"""The RL loop end to end with the tiny preset: learning, every objective, variable groups, KL,
entropy bonus, gradient accumulation, off-policy updates (checked against a hand-written update),
replay importance weights, hooks, timeouts, warnings, resume."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

# reward-pool workers unpickle rewards by module path: keep them in a plain module on sys.path
from _train_helpers import RL_BASE as BASE
from _train_helpers import Constant, FirstCharDigit, SleepyReward

from posttrain.algos import agg_loss, get_advantage, get_policy_loss, list_policy_losses
from posttrain.hooks import (
    CONTROLLERS,
    GROUP_FILTERS,
    REPLAY_BUFFERS,
    SAMPLERS,
    Controller,
    GroupDecision,
    GroupFilter,
    PromptPlan,
    PromptSampler,
    ReplayBuffer,
    Trajectory,
)
from posttrain.models import sequence_logprobs
from posttrain.rewards.failures import RewardFailureError
from posttrain.rollout import EpisodeRunner, FunctionRewardSource, RewardSource, ScoredBatch
from posttrain.rollout.reward_source import _Ready
from posttrain.train.config import load_rl_config
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer


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
    """Every group has reward variance (alternating rewards), so every objective must move the weights.
    (The old test asserted that only `if advantage_abs_mean > 0`, which may be false.)"""
    tr = RLTrainer(cfg(tmp_path, f"objective.name={objective}"), reward_source=_ParityWithComponents())
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
    assert m["advantage_abs_mean"] > 0 and m["zero_var_frac"] == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters(), strict=True))


def test_single_on_policy_update_does_no_extra_forward(tmp_path, monkeypatch):
    import posttrain.models.adapter as adapter

    calls = []
    real = adapter.sequence_logprobs  # every trainer forward goes through the model adapter
    monkeypatch.setattr(adapter, "sequence_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    tr = trainer(tmp_path, reward=FirstCharDigit())
    tr.step()
    assert len(calls) == 1 and tr.ref_lm is None  # kl.coef = 0: no reference model at all
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


def test_variable_group_sizes(tmp_path):
    tr = trainer(tmp_path, "hooks.sampler.name=test-variable", reward=FirstCharDigit())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    assert m["num_sequences"] == 11 and m["num_groups"] == 4
    assert (m["group_size_min"], m["group_size_max"]) == (1, 5)


def test_kl_to_reference_model(tmp_path):
    tr = trainer(tmp_path, "kl.coef=0.5", "kl.kind=k3", "optimizer.lr=1e-2", reward=FirstCharDigit())
    assert tr.ref_lm is not None and not any(p.requires_grad for p in tr.ref_lm.model.parameters())
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

    eps, _, _ = tr2.collector.collect(tr2.step_idx, SamplingParams(max_new_tokens=3))
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


# ---------------------------------------------------------------- hand-written reference updates
# Computed independently of the trainer: one unpadded forward per sequence, the algos' GRPO advantage
# and PPO loss, torch's clipping and a copy of the trainer's AdamW (same hyper-parameters and state).


class _FirstCharParity:
    """Reward = parity of the first character's code point (0 for an empty completion); records every
    reward it gives, in call order (in-process: the reward source runs with num_workers=0)."""

    name = "first_char_parity"

    def __init__(self):
        self.given = []

    def __call__(self, completion, example) -> float:
        r = float(ord(completion[0]) % 2) if completion else 0.0
        self.given.append(r)
        return r


def _record_generations(tr):
    """Wrap the trainer's engine: keep every RolloutBatch it returns (observe only)."""
    seen = []
    real = tr.engine.generate

    def generate(*args, **kwargs):
        batch = real(*args, **kwargs)
        seen.append(batch)
        return batch

    tr.engine.generate = generate
    return seen


def _rows(batch):
    """[(prompt ids, completion ids)] of a RolloutBatch, padding removed."""
    out = []
    for i in range(len(batch)):
        prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist()
        comp = batch.completion_ids[i][batch.completion_mask[i].bool()].tolist()
        out.append((prompt, comp))
    return out


def _completion_logp(model, prompt, completion):
    """log pi(completion token | prefix) for one sequence, no padding, temperature 1."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def _pad(vectors):
    t = max(len(v) for v in vectors)
    out = torch.zeros(len(vectors), t)
    mask = torch.zeros(len(vectors), t)
    for i, v in enumerate(vectors):
        out[i, : len(v)] = v
        mask[i, : len(v)] = 1
    return out, mask


def _stack_padded(vectors):
    """Right-pad differentiable vectors into (B, T) without breaking the graph."""
    t = max(len(v) for v in vectors)
    return torch.stack([torch.nn.functional.pad(v, (0, t - len(v))) for v in vectors])


def _copy_model_and_optimizer(tr):
    model = copy.deepcopy(tr.model)
    index = {id(p): i for i, p in enumerate(tr.model.parameters())}
    params = list(model.parameters())
    groups = [
        {
            **{k: v for k, v in g.items() if k != "params"},
            "params": [params[index[id(p)]] for p in g["params"]],
        }
        for g in tr.optimizer.param_groups
    ]
    opt = type(tr.optimizer)(groups)
    opt.load_state_dict(copy.deepcopy(tr.optimizer.state_dict()))
    return model, opt


def _hand_update(
    model, opt, rows, adv, *, epochs, minibatches, grad_clip, is_weight_rows=None, weights_from="current"
):
    """PPO-clip (token-mean) updates: `epochs` passes over `minibatches` contiguous minibatches, each one
    clipped AdamW step; old log-probs from the model before any update. `is_weight_rows[i]`, when given,
    maps row i's current log-probs (detached; `weights_from="old"`: its old log-probs) to its per-token
    importance weights."""
    loss_fn = get_policy_loss("ppo")
    with torch.no_grad():
        old = [_completion_logp(model, p, c) for p, c in rows]
    for _ in range(epochs):
        for mb in torch.arange(len(rows)).tensor_split(minibatches):
            opt.zero_grad(set_to_none=True)
            logps = [_completion_logp(model, *rows[i]) for i in mb.tolist()]
            lp = _stack_padded(logps)
            old_mb, mask = _pad([old[i] for i in mb.tolist()])
            w = None
            if is_weight_rows is not None:
                src = [
                    old[i] if weights_from == "old" else logps[j].detach() for j, i in enumerate(mb.tolist())
                ]
                w, _ = _pad([is_weight_rows[i](src[j]) for j, i in enumerate(mb.tolist())])
            loss, _ = loss_fn(lp, old_mb, adv[mb], mask, is_weights=w)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], grad_clip)
            opt.step()


@torch.no_grad()
def _assert_same_weights(a, b, lr):
    # AdamW moves each weight by ~lr per step; 1% of lr is far below any real difference in the update
    for (n, x), (_, y) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-2 * lr, msg=n)


HAND = ["objective.name=ppo", "optimizer.eps=1e-4", "optimizer.grad_clip=1.0"]


def test_off_policy_minibatches_and_epochs_equal_a_hand_written_update(tmp_path):
    """minibatches=2 x ppo_epochs=2 must be: old log-probs once, then twice over the two halves of the
    batch, each half one clipped AdamW step with ratios against the old log-probs.
    Mutants tried: `old = logp.detach()` (no off-policy ratio) and a single minibatch -> weights differ.
    (optimizer.eps=1e-4 keeps AdamW from amplifying float noise in near-zero gradients.)"""
    lr = 1e-2
    reward = _FirstCharParity()
    tr = trainer(tmp_path, "minibatches=2", "ppo_epochs=2", f"optimizer.lr={lr}", *HAND, reward=reward)
    generations = _record_generations(tr)
    model, opt = _copy_model_and_optimizer(tr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    (batch,) = generations
    rewards = torch.tensor(reward.given)
    adv = get_advantage("grpo")(rewards, batch.group_ids)
    assert len(rewards) == len(batch) == 16 and adv.abs().sum() > 0
    _hand_update(model, opt, _rows(batch), adv, epochs=2, minibatches=2, grad_clip=1.0)
    _assert_same_weights(tr.model, model, lr)
    assert m["ratio_mean"] != pytest.approx(1.0, abs=1e-6)  # later updates really were off-policy


def test_reward_timeouts_are_counted_and_score_zero(tmp_path):
    src = FunctionRewardSource(SleepyReward(30.0), num_workers=1, timeout_s=0.2)
    small = ["rollout.prompts_per_step=2", "rollout.group_size=2"]
    try:
        tr = RLTrainer(cfg(tmp_path, *small, "reward.max_failed_frac=1"), reward_source=src)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateSettingWarning)
            m = tr.step()
            tr = RLTrainer(cfg(tmp_path, *small), reward_source=src)  # default: more than half failed
            with pytest.raises(RewardFailureError, match=r"4 of 4 rewards failed \(4 timeouts"):
                tr.step()
    finally:
        src.close()
    assert m["reward_timeouts"] == 4 and m["reward_mean"] == 0.0


def test_degenerate_settings_warn_loudly(tmp_path):
    with pytest.raises(ValueError, match="group-relative advantage 'grpo'"):  # refused at config time
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


def test_controller_temperature_drives_rollout_and_training(tmp_path):
    tr = trainer(tmp_path, "hooks.controllers=[{name: test-half}]", reward=FirstCharDigit())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    assert m["temperature"] == 0.5 and m["controller/temperature"] == 0.5
    # sampling log-probs (T = 0.5) match the training log-probs computed at the same T
    assert m["rollout_logp_diff"] < 1e-4


class _ReplayFirstShifted(_ReplayFirst):
    """_ReplayFirst whose stored past log-probs are 1 nat below the sampling ones (a "past policy" less
    likely than the current one, so the importance weights are ~e, far from 1); records every
    `is_weights` call (current log-probs, past log-probs, mask, weights)."""

    SHIFT = 1.0

    def __init__(self):
        super().__init__()
        self.calls = []

    def observe(self, episodes, rewards, correct, step):
        super().observe(episodes, rewards, correct, step)
        self.stored = Trajectory(
            self.stored.completion_ids,
            [lp - self.SHIFT for lp in self.stored.logp_past],
            self.stored.finish_reason,
        )

    def is_weights(self, logp, logp_past, mask):
        w = super().is_weights(logp, logp_past, mask)
        self.calls.append((logp.detach().clone(), logp_past.clone(), mask.clone(), w.detach().clone()))
        return w


def test_replay_buffer_trajectories_join_groups_with_is_weights(tmp_path):
    """The replayed row's importance weights are min(exp(logp_now - logp_past), 10) per token (checked
    against an independent forward), fresh rows get weight 1, and the update uses them: the step equals
    a hand-written update with those weights and differs from one without.
    Mutants tried: the trainer passes `is_weights=None` to the loss; weights of 1 for the replayed row."""
    lr = 1e-2
    reward = _FirstCharParity()
    tr = trainer(tmp_path, "hooks.replay.name=test-first-shifted", f"optimizer.lr={lr}", *HAND, reward=reward)
    generations = _record_generations(tr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m1 = tr.step()
        stored = tr.collector.replay.stored
        model, opt = _copy_model_and_optimizer(tr)
        no_w_model, no_w_opt = _copy_model_and_optimizer(tr)
        reward.given.clear()
        tr.collector.replay.calls.clear()
        m2 = tr.step()
    assert m1["replayed"] == 0 and m2["replayed"] == 1
    assert m2["num_sequences"] == m1["num_sequences"]  # replayed slot replaces one fresh sample
    fresh = generations[-1]
    assert len(fresh) == 15 and fresh.group_ids.tolist()[:3] == [0, 0, 0]
    # the trainer's batch: the fresh rows, then the replayed completion in group 0 (same prompt as row 0)
    rows = [*_rows(fresh), (_rows(fresh)[0][0], stored.completion_ids)]
    group_ids = torch.cat([fresh.group_ids, torch.tensor([0])])
    past = torch.tensor(stored.logp_past)
    with torch.no_grad():
        logp_now = _completion_logp(model, *rows[-1])
    expected_w = torch.exp(logp_now - past).clamp(max=10.0)
    assert (expected_w > 2).all()  # far from 1: a loss that ignores the weights cannot match

    # the weights the trainer computed for the replayed row (its last row, the only replayed one)
    (call,) = tr.collector.replay.calls
    logp_seen, past_seen, mask_seen, w_seen = call
    n = len(stored.completion_ids)
    torch.testing.assert_close(past_seen[-1, :n], past)
    torch.testing.assert_close(logp_seen[-1, :n], logp_now, rtol=0, atol=1e-5)
    torch.testing.assert_close(w_seen[-1, :n], expected_w, rtol=1e-4, atol=1e-5)
    assert mask_seen[-1, :n].all() and not mask_seen[-1, n:].any()

    rewards = torch.tensor(reward.given)
    assert len(rewards) == len(rows) == 16
    adv = get_advantage("grpo")(rewards, group_ids)
    assert adv[-1] != 0  # the replayed row's loss term matters

    def ones(lp):
        return torch.ones_like(lp)

    def replay_weights(lp):
        return torch.exp(lp - past).clamp(max=10.0)

    weights = [ones] * (len(rows) - 1) + [replay_weights]
    _hand_update(model, opt, rows, adv, epochs=1, minibatches=1, grad_clip=1.0, is_weight_rows=weights)
    _assert_same_weights(tr.model, model, lr)
    _hand_update(no_w_model, no_w_opt, rows, adv, epochs=1, minibatches=1, grad_clip=1.0)
    with torch.no_grad():
        pairs = zip(tr.model.parameters(), no_w_model.parameters(), strict=True)
        diff = max(float((a - b).abs().max()) for a, b in pairs)
    assert diff > 0.1 * lr  # without the weights the update is measurably different


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


class _InOrder(PromptSampler):
    """The training examples in order, counting the rounds it plans."""

    def __init__(self, examples, *, seed=0):
        self.examples, self.i = examples, 0
        self.rounds_seen = 0

    def plan(self, step, num_prompts, group_size):
        picked = [self.examples[(self.i + j) % len(self.examples)] for j in range(num_prompts)]
        self.i += num_prompts
        self.rounds_seen += 1
        return PromptPlan(picked, [group_size] * num_prompts)


class _KeepMixed(GroupFilter):
    """DAPO-style dynamic sampling through the filter slot: keep only groups with reward variance."""

    max_rounds = 3

    def decide(self, outcomes, need):
        return [GroupDecision(not o.zero_variance, "zero_variance") for o in outcomes]


FILTERED = ["hooks.sampler.name=test-in-order", "hooks.filter.name=test-keep-mixed"]


def test_group_filter_resamples_and_keeps_only_informative_groups(tmp_path):
    """Mutant tried: the loop ignores the filter's decisions (keeps every group) -> 1 round,
    zero_var_frac 0.5. (The old test asserted zero_var_frac only inside an `if` that may be false.)"""
    tr = trainer(tmp_path, *FILTERED, reward=Constant())
    with pytest.warns(DegenerateSettingWarning, match="kept no group"):
        m = tr.step()
    # a constant reward never gives variance: 3 rounds, then the last round is used as is
    assert m["sampling_rounds"] == 3 and tr.collector.sampler.rounds_seen == 3 and m["num_groups"] == 4
    # every other group (in order of appearance) has reward variance: rounds of 4, 2 and 1 prompts keep
    # 2, 1 and 1 groups
    tr = RLTrainer(cfg(tmp_path, *FILTERED), reward_source=_EveryOtherGroupMixed())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    assert m["sampling_rounds"] == 3 and tr.collector.sampler.rounds_seen == 3
    assert m["num_groups"] == 4 and m["num_sequences"] == 16
    assert m["zero_var_frac"] == 0.0  # every kept group is informative
    assert m["reward_mean"] == 0.5


class _EveryOtherGroupMixed(RewardSource):
    """Groups (contiguous rows of one example) alternate, in order of appearance, between rewards
    0, 1, 0, 1 (variance) and all 1 (none)."""

    def submit(self, completions, examples):
        order = {}
        for ex in examples:
            order.setdefault(id(ex), len(order))
        r = [float(i % 2) if order[id(ex)] % 2 == 0 else 1.0 for i, ex in enumerate(examples)]
        return _Ready(ScoredBatch(rewards=r))


class _ParityWithComponents(RewardSource):
    """Rows of a group are contiguous, so alternating 0/1 gives every group of 4 reward variance."""

    def submit(self, completions, examples):
        r = [float(i % 2) for i in range(len(completions))]
        return _Ready(ScoredBatch(rewards=r, components={"parity": r, "one": [1.0] * len(r)}))


def test_group_filter_keeps_reward_components(tmp_path):
    tr = RLTrainer(cfg(tmp_path, *FILTERED), reward_source=_ParityWithComponents())
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
    tr.collector.runner = _SelfScoringRunner(tr.collector.runner)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    assert m["reward_mean"] == 0.5 and m["zero_var_frac"] == 0.0


def test_replay_into_self_scored_episodes_is_refused_not_silently_dropped(tmp_path):
    tr = trainer(tmp_path, "hooks.replay.name=test-first", reward=FirstCharDigit())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        tr.step()  # fills the replay buffer
        tr.collector.runner = _SelfScoringRunner(tr.collector.runner)
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


@pytest.fixture(autouse=True, scope="module")
def _module_hooks():
    """This module's test hooks, registered for its tests only (restored afterwards)."""
    saved = [(r, r.snapshot()) for r in (CONTROLLERS, REPLAY_BUFFERS, SAMPLERS, GROUP_FILTERS)]
    SAMPLERS.register("test-variable")(_VariableSampler)
    CONTROLLERS.register("test-half")(_HalfTemperature)
    REPLAY_BUFFERS.register("test-first")(_ReplayFirst)
    REPLAY_BUFFERS.register("test-first-shifted")(_ReplayFirstShifted)
    SAMPLERS.register("test-in-order")(_InOrder)
    GROUP_FILTERS.register("test-keep-mixed")(_KeepMixed)
    yield
    for reg, state in saved:
        reg.restore(state)


def test_replay_is_weights_use_the_old_policy_with_two_minibatches(tmp_path):
    """With two minibatches the replayed row (last row, second minibatch) is weighted by
    pi_old / pi_past, not pi_theta / pi_past: the PPO ratio pi_theta / pi_old is already in the loss.
    The step equals a hand-written two-minibatch update with weights exp(logp_old - logp_past) and
    differs from one with exp(logp_theta - logp_past) (the ratio counted twice).
    Mutant killed: `ReplayWeights` passing the current `logp.detach()` instead of `old_logp`."""
    lr = 1e-2
    reward = _FirstCharParity()
    tr = trainer(
        tmp_path,
        "hooks.replay.name=test-first-shifted",
        "minibatches=2",
        f"optimizer.lr={lr}",
        *HAND,
        reward=reward,
    )
    generations = _record_generations(tr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        tr.step()
        stored = tr.collector.replay.stored
        model, opt = _copy_model_and_optimizer(tr)
        twice_model, twice_opt = _copy_model_and_optimizer(tr)
        reward.given.clear()
        m2 = tr.step()
    assert m2["replayed"] == 1
    fresh = generations[-1]
    rows = [*_rows(fresh), (_rows(fresh)[0][0], stored.completion_ids)]
    group_ids = torch.cat([fresh.group_ids, torch.tensor([0])])
    past = torch.tensor(stored.logp_past)
    adv = get_advantage("grpo")(torch.tensor(reward.given), group_ids)
    assert adv[-1] != 0

    def ones(lp):
        return torch.ones_like(lp)

    def replay_weights(lp):
        return torch.exp(lp - past).clamp(max=10.0)

    weights = [ones] * (len(rows) - 1) + [replay_weights]
    kw = dict(epochs=1, minibatches=2, grad_clip=1.0, is_weight_rows=weights)
    _hand_update(model, opt, rows, adv, weights_from="old", **kw)
    _assert_same_weights(tr.model, model, lr)
    _hand_update(twice_model, twice_opt, rows, adv, weights_from="current", **kw)
    with torch.no_grad():
        pairs = zip(tr.model.parameters(), twice_model.parameters(), strict=True)
        diff = max(float((a - b).abs().max()) for a, b in pairs)
    assert diff > 1e-2 * lr  # weighting with pi_theta (ratio counted twice) gives another update
