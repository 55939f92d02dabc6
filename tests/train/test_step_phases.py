"""RLTrainer.step in named phases, losses that declare extra per-token inputs, advantage inputs that
follow their rows through group filtering and replay, and the dead-code satellites (kl_clamped logged,
engines without sampling log-probs refused with a clear error)."""

from __future__ import annotations

import warnings

import pytest
import torch
from _train_helpers import FirstCharDigit

from posttrain.algos import get_policy_loss
from posttrain.algos.advantages import ADVANTAGES, register_advantage
from posttrain.algos.policy_losses import LOSS_INPUTS, POLICY_LOSSES, Terms, register_policy_loss
from posttrain.hooks import (
    GROUP_FILTERS,
    REPLAY_BUFFERS,
    GroupDecision,
    GroupFilter,
    ReplayBuffer,
    Trajectory,
)
from posttrain.rollout import EpisodeRunner, FunctionRewardSource
from posttrain.train import rl as rl_module
from posttrain.train.config import load_rl_config
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer, StepForwards, StepRollout, StepScores

BASE = [
    "model.name=tiny",
    "model.device=cpu",
    'task.params={digits: 1, ops: "+", n_train: 60, n_heldout: 20}',
    "reward.num_workers=0",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=3",
    "eval.at_start=false",
    "optimizer.lr=1e-2",
]


def make(tmp_path, *extra, reward=None, **kw) -> RLTrainer:
    cfg = load_rl_config(None, [*BASE, f"out_dir={tmp_path / 'run'}", *extra])
    src = FunctionRewardSource(reward or FirstCharDigit(), num_workers=0)
    return RLTrainer(cfg, reward_source=src, **kw)


def _quiet():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("ignore", DegenerateSettingWarning)
    return ctx


def _strip_times(m: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in m.items() if not k.startswith("time_") and k != "tokens_per_s"}


# ------------------------------------------------------------------------------------------- phases
@pytest.mark.parametrize(
    "extra", [[], ["kl.coef=0.1", "minibatches=2", "ppo_epochs=2", "micro_batch_size=3"]]
)
def test_phases_called_one_by_one_equal_step(tmp_path, extra):
    ctx = _quiet()
    try:
        whole = make(tmp_path / "a", *extra)
        m_whole = [whole.step() for _ in range(2)]
        parts = make(tmp_path / "b", *extra)
        m_parts = []
        for _ in range(2):
            ro = parts.rollout()
            assert isinstance(ro, StepRollout) and len(ro.batch) == 16
            assert ro.actions.shape == ro.batch.completion_ids.shape
            fw = parts.forward_without_rewards(ro)
            assert isinstance(fw, StepForwards) and fw.first is not None
            assert (fw.old_logp is not None) == parts.cfg.off_policy
            assert (fw.ref_logp is not None) == (parts.cfg.kl.coef > 0)
            scores = parts.score(ro)
            assert isinstance(scores, StepScores) and scores.advantages.shape == (16,)
            step_before = parts.step_idx
            upd = parts.update(ro, fw, scores)
            assert fw.first is None  # the early forward was consumed, not recomputed
            assert len(upd.grad_norms) == parts.cfg.ppo_epochs * len(ro.minibatches)
            assert parts.step_idx == step_before  # only report() advances the step
            m_parts.append(parts.report(ro, fw, scores, upd, t_start=0.0))
            assert parts.step_idx == step_before + 1
    finally:
        ctx.__exit__(None, None, None)
    for a, b in zip(m_whole, m_parts, strict=True):
        assert _strip_times(a) == _strip_times(b)
    for (n, a), (_, b) in zip(whole.model.named_parameters(), parts.model.named_parameters(), strict=True):
        assert torch.equal(a, b), n


def test_metric_sums_helper():
    s = rl_module.MetricSums()
    s.mean("entropy", 6.0, 3)
    s.mean("entropy", 4.0, 1)
    s.share("pg_loss", 0.25)
    s.share("pg_loss", 0.75)
    assert s.result(n_updates=2) == {"entropy": 2.5, "pg_loss": 0.5}


# -------------------------------------------------------------------------------- loss extra inputs
SEEN: list[dict[str, torch.Tensor]] = []


@pytest.fixture
def test_losses():
    """Registers two test losses for one test only (the registries are process-global)."""

    def core(b, *, coef: float = 0.1) -> Terms:
        SEEN.append({k: v.detach().clone() for k, v in b.inputs.items()} | {"valid": b.valid.clone()})
        r = torch.exp(b.log_ratio)
        ent = b.inputs["entropy"]
        # a REINFORCE term weighted by how far sampling and training log-probs agree, plus entropy
        w = torch.exp(b.logp.detach() - b.inputs["rollout_logp"]).clamp(max=2.0)
        loss = -b.adv * r * w - coef * ent
        rd = r.detach()
        none = torch.zeros_like(b.valid)
        return Terms(loss, w, rd, none, none)

    register_policy_loss(
        "test-entropy-rollout", validate=lambda name, p: None, inputs=("entropy", "rollout_logp")
    )(core)

    def ref_core(b) -> Terms:
        SEEN.append({k: v.detach().clone() for k, v in b.inputs.items()} | {"logp": b.logp.detach().clone()})
        r = torch.exp(b.log_ratio)
        none = torch.zeros_like(b.valid)
        return Terms(-b.adv * r, r.detach(), r.detach(), none, none)

    register_policy_loss("test-ref", validate=lambda name, p: None, inputs=("ref_logp",))(ref_core)
    yield
    for name in ("test-entropy-rollout", "test-ref"):
        POLICY_LOSSES._items.pop(name)


def test_trainer_provides_every_declared_loss_input():
    assert set(rl_module._LOSS_INPUTS) == set(LOSS_INPUTS)


def test_loss_receives_exactly_the_inputs_it_declares(tmp_path, test_losses):
    SEEN.clear()
    tr = make(tmp_path, "objective.name=test-entropy-rollout", "objective.params={coef: 0.5}")
    ctx = _quiet()
    try:
        ro = tr.rollout()
        fw = tr.forward_without_rewards(ro)
        with torch.no_grad():
            lp, ent = tr._policy_forward(tr.lm, ro, torch.arange(len(ro.batch)), False)
        upd = tr.update(ro, fw, tr.score(ro))
    finally:
        ctx.__exit__(None, None, None)
    assert len(SEEN) == 1 and set(SEEN[0]) == {"entropy", "rollout_logp", "valid"}
    valid = SEEN[0]["valid"]
    assert torch.equal(valid, ro.actions.bool())
    torch.testing.assert_close(SEEN[0]["entropy"], ent * valid)
    torch.testing.assert_close(SEEN[0]["rollout_logp"], ro.batch.logprobs)
    assert upd.metrics["pg_loss"] != 0.0
    # callers must pass exactly the declared inputs
    with pytest.raises(ValueError, match=r"declares inputs \['entropy', 'rollout_logp'\], got \[\]"):
        get_policy_loss("test-entropy-rollout")(lp, lp, torch.zeros(len(lp)), ro.actions)
    with pytest.raises(ValueError, match=r"'ppo' declares inputs \[\], got \['entropy'\]"):
        get_policy_loss("ppo")(lp, lp, torch.zeros(len(lp)), ro.actions, inputs={"entropy": ent})


def test_entropy_input_is_differentiable(tmp_path, test_losses):
    grads = []
    for coef in (0.0, 1.0):
        tr = make(tmp_path, "objective.name=test-entropy-rollout", f"objective.params={{coef: {coef}}}")
        ctx = _quiet()
        try:
            ro = tr.rollout()
            fw = tr.forward_without_rewards(ro)
            tr.update(ro, fw, tr.score(ro))
        finally:
            ctx.__exit__(None, None, None)
        grads.append(torch.cat([p.grad.flatten() for p in tr.model.parameters() if p.grad is not None]))
    assert not torch.allclose(grads[0], grads[1])


def test_loss_declaring_ref_logp_gets_a_reference_model_without_kl(tmp_path, test_losses):
    SEEN.clear()
    tr = make(tmp_path, "objective.name=test-ref")
    assert tr.cfg.kl.coef == 0 and tr.ref_lm is not None
    ctx = _quiet()
    try:
        m = tr.step()
    finally:
        ctx.__exit__(None, None, None)
    # step 1: the reference is the initial policy, so ref_logp equals the policy's own log-probs
    torch.testing.assert_close(SEEN[0]["ref_logp"], SEEN[0]["logp"], rtol=0, atol=1e-6)
    assert "kl_loss" not in m and m["kl"] == pytest.approx(0.0, abs=1e-6)


def test_register_policy_loss_rejects_unknown_inputs():
    with pytest.raises(ValueError, match=r"unknown input.*'entropyy'.*known inputs: entropy, ref_logp"):
        register_policy_loss("test-bad-input", validate=lambda n, p: None, inputs=("entropyy",))


# ------------------------------------------------------------- advantage inputs through select/merge
def _turn_bonus_adv(r, inv, n_groups, *, turn_bonus=None, per_token=None):
    """Advantage = reward + per-row bonus; also checks the per-token input kept its rows."""
    if turn_bonus is None or per_token is None:
        raise ValueError("test-turn-bonus: turn_bonus and per_token are required advantage inputs")
    assert per_token.shape[0] == r.shape[0]
    # per_token row i holds i's bonus at every completion position (0 on padding)
    assert torch.all((per_token == turn_bonus[:, None]) | (per_token == 0))
    return r + turn_bonus


@pytest.fixture
def turn_bonus_advantage():
    """Registers the test estimator for one test only (the registries are process-global)."""
    register_advantage("test-turn-bonus")(_turn_bonus_adv)
    yield
    ADVANTAGES._items.pop("test-turn-bonus")


class _BonusRunner(EpisodeRunner):
    """Wraps the single-turn runner; each row's bonus is unique, so a row mix-up shows."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0

    def run(self, examples, n_per_prompt, params):
        ep = self.inner.run(examples, n_per_prompt, params)
        self.calls += 1
        n = len(ep)
        bonus = torch.arange(n, dtype=torch.float32) + 100.0 * self.calls
        ep.advantage_inputs = {"turn_bonus": bonus, "per_token": bonus[:, None] * ep.batch.completion_mask}
        return ep


class _KeepEveryOther(GroupFilter):
    """Keeps every other group of a round (the 2nd, 4th, ...), for at most 2 rounds."""

    max_rounds = 2

    def decide(self, outcomes, need):
        return [GroupDecision(i % 2 == 1, "kept" if i % 2 else "odd") for i in range(len(outcomes))]


def test_advantage_inputs_survive_group_filtering(tmp_path, turn_bonus_advantage):
    tr = make(tmp_path, "hooks.filter.name=test-every-other", "advantage.name=test-turn-bonus")
    tr.collector.runner = _BonusRunner(tr.collector.runner)
    ctx = _quiet()
    try:
        ro = tr.rollout()
        scores = tr.score(ro)
    finally:
        ctx.__exit__(None, None, None)
    # round 1 keeps groups 1 and 3 of 4, round 2 plans the 2 missing groups and keeps group 1 of 2
    assert ro.rounds == 2 and len(ro.batch) == 12
    bonus = ro.episodes.advantage_inputs["turn_bonus"]
    kept = [100 + i for i in (4, 5, 6, 7, 12, 13, 14, 15)] + [200 + i for i in (4, 5, 6, 7)]
    assert bonus.tolist() == kept
    torch.testing.assert_close(scores.advantages, scores.shaped + bonus)


class _ReplayWithInputs(ReplayBuffer):
    """Replays the first fresh episode of the previous step, with its advantage inputs."""

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
        ai = episodes.advantage_inputs
        self.stored = Trajectory(
            b.completion_ids[0, :n].tolist(),
            b.logprobs[0, :n].tolist(),
            b.finish_reasons[0],
            advantage_inputs={
                "turn_bonus": float(ai["turn_bonus"][0]),
                "per_token": ai["per_token"][0, :n].tolist(),
            },
        )


def test_advantage_inputs_survive_replay(tmp_path, turn_bonus_advantage):
    tr = make(tmp_path, "hooks.replay.name=test-replay-inputs", "advantage.name=test-turn-bonus")
    tr.collector.runner = _BonusRunner(tr.collector.runner)
    ctx = _quiet()
    try:
        tr.step()
        ro = tr.rollout()
        scores = tr.score(ro)
    finally:
        ctx.__exit__(None, None, None)
    replayed = ro.episodes.replayed
    assert int(replayed.sum()) == 1 and bool(replayed[-1])  # fresh rows first, then the replayed one
    bonus = ro.episodes.advantage_inputs["turn_bonus"]
    assert bonus[-1] == 100.0 and bonus[:-1].tolist() == [200.0 + i for i in range(15)]
    per_token = ro.episodes.advantage_inputs["per_token"]
    assert per_token.shape == ro.batch.completion_ids.shape
    torch.testing.assert_close(scores.advantages, scores.shaped + bonus)


def test_replayed_trajectory_without_the_runners_inputs_is_refused(tmp_path, turn_bonus_advantage):
    tr = make(tmp_path, "hooks.replay.name=test-first-plain", "advantage.name=test-turn-bonus")
    tr.collector.runner = _BonusRunner(tr.collector.runner)
    ctx = _quiet()
    try:
        tr.step()
        with pytest.raises(ValueError, match=r"hooks\.replay: advantage_inputs: part 1 has keys \[\]"):
            tr.step()
    finally:
        ctx.__exit__(None, None, None)


class _ReplayPlain(_ReplayWithInputs):
    def observe(self, episodes, rewards, correct, step):
        b = episodes.batch
        n = int(b.lengths[0])
        self.stored = Trajectory(
            b.completion_ids[0, :n].tolist(), b.logprobs[0, :n].tolist(), b.finish_reasons[0]
        )


# ------------------------------------------------------------------------------ dead-code satellites
def test_kl_clamped_fraction_is_logged_for_k3_only(tmp_path):
    ctx = _quiet()
    try:
        m3 = make(tmp_path, "kl.coef=0.1", "kl.kind=k3").step()
        m1 = make(tmp_path, "kl.coef=0.1", "kl.kind=k1").step()
        m0 = make(tmp_path).step()
    finally:
        ctx.__exit__(None, None, None)
    assert m3["kl_clamped_frac"] == 0.0  # the reference is the policy itself at step 1
    assert "kl_clamped_frac" not in m1 and "kl_clamped_frac" not in m0


class _NoLogprobsRunner(EpisodeRunner):
    """An engine that does not record sampling log-probs (allowed by the engine interface)."""

    def __init__(self, inner):
        self.inner = inner

    def run(self, examples, n_per_prompt, params):
        ep = self.inner.run(examples, n_per_prompt, params)
        ep.batch.logprobs = None
        return ep


def test_missing_sampling_logprobs_are_refused_when_needed(tmp_path, test_losses):
    ctx = _quiet()
    try:
        ok = make(tmp_path)  # nobody needs them: the step runs, without the rollout_logp_diff check
        ok.collector.runner = _NoLogprobsRunner(ok.collector.runner)
        assert "rollout_logp_diff" not in ok.step()
        rep = make(tmp_path, "hooks.replay.name=test-first-plain")
        rep.collector.runner = _NoLogprobsRunner(rep.collector.runner)
        with pytest.raises(ValueError, match=r"hooks\.replay 'test-first-plain' \(needs_logprobs\)"):
            rep.step()
        loss = make(tmp_path, "objective.name=test-entropy-rollout")
        loss.collector.runner = _NoLogprobsRunner(loss.collector.runner)
        with pytest.raises(ValueError, match=r"objective 'test-entropy-rollout' \(input 'rollout_logp'\)"):
            loss.step()
    finally:
        ctx.__exit__(None, None, None)


class _ReplayWithEnvTokens(_ReplayWithInputs):
    """Stores the first fresh completion as if its middle token had come from the environment."""

    def observe(self, episodes, rewards, correct, step):
        b = episodes.batch
        n = int(b.lengths[0])
        mask = [1] * n
        mask[n // 2] = 0
        self.stored = Trajectory(
            b.completion_ids[0, :n].tolist(),
            b.logprobs[0, :n].tolist(),
            b.finish_reasons[0],
            action_mask=mask,
        )


def test_replayed_trajectory_keeps_its_action_mask(tmp_path):
    tr = make(tmp_path, "hooks.replay.name=test-replay-env", "rollout.max_new_tokens=4")
    ctx = _quiet()
    try:
        tr.step()
        ro = tr.rollout()
    finally:
        ctx.__exit__(None, None, None)
    b = ro.batch
    assert b.completion_mask[-1].tolist() == [1, 1, 1, 1]
    assert b.action_mask[-1].tolist() == [1, 1, 0, 1]  # replayed row: the env token is not an action
    assert b.action_mask[:-1].tolist() == b.completion_mask[:-1].tolist()  # fresh rows: all actions
    assert b.logprobs[-1, 2] == 0 and ro.actions[-1].tolist() == [1.0, 1.0, 0.0, 1.0]


@pytest.fixture(autouse=True, scope="module")
def _module_hooks():
    """This module's test hooks, registered for its tests only (restored afterwards)."""
    saved = [(r, r.snapshot()) for r in (REPLAY_BUFFERS, GROUP_FILTERS)]
    GROUP_FILTERS.register("test-every-other")(_KeepEveryOther)
    REPLAY_BUFFERS.register("test-replay-inputs")(_ReplayWithInputs)
    REPLAY_BUFFERS.register("test-first-plain")(_ReplayPlain)
    REPLAY_BUFFERS.register("test-replay-env")(_ReplayWithEnvTokens)
    yield
    for reg, state in saved:
        reg.restore(state)
