"""What one RL step feeds forward, each test guarding a wrong version that once passed the suite:
the advantages are computed from the SHAPED rewards (so a shaper's length or overlong penalty reaches
the gradient), ``reinforce_pp`` gets each sequence's token count, and ``entropy_pre_update`` is the
entropy of the policy that sampled, which is what the controllers get."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from _train_helpers import RL_BASE as BASE
from _train_helpers import Constant

from posttrain.algos import get_advantage
from posttrain.hooks import Controller, GroupRewardShaper, Knobs
from posttrain.rollout import FunctionRewardSource
from posttrain.train.config import load_rl_config
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer


def _trainer(tmp_path, *extra, reward=None, **kw):
    cfg = load_rl_config(None, [*BASE, f"out_dir={tmp_path / 'run'}", *extra])
    src = FunctionRewardSource(reward, num_workers=0) if reward is not None else None
    return RLTrainer(cfg, reward_source=src, **kw)


class _RowIndexShaper(GroupRewardShaper):
    """Adds 0.1 × (row index within the batch) to every reward: shaped rewards vary within each group."""

    def shape(self, rewards, group_ids, *, correct, lengths, truncated):
        return rewards + 0.1 * torch.arange(len(rewards), dtype=rewards.dtype)


def test_advantages_are_computed_from_shaped_rewards(tmp_path):
    """Raw rewards are constant (every group zero-variance), the shaper makes them vary: the advantages
    must be the GRPO advantages of the SHAPED rewards and the update must move the weights.
    Wrong version guarded: `adv = self.adv_fn(raw, ...)` in `RLTrainer.score` (advantages from RAW
    rewards, so a shaper's length or overlong penalty never reaches the gradient)."""
    tr = _trainer(tmp_path, reward=Constant(), shapers=[_RowIndexShaper()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        ro = tr.rollout()
        tr.forward_without_rewards(ro)
        scores = tr.score(ro)
    gids = ro.episodes.batch.group_ids
    assert torch.all(scores.raw == 1.0)
    assert get_advantage("grpo")(scores.raw, gids).abs().sum() == 0  # raw: nothing to learn
    expected = get_advantage("grpo")(scores.shaped, gids)
    assert expected.abs().sum() > 0
    torch.testing.assert_close(scores.advantages, expected)
    # and through a whole step: non-zero gradient although every raw group is zero-variance
    tr2 = _trainer(tmp_path / "b", reward=Constant(), shapers=[_RowIndexShaper()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr2.step()
    assert m["advantage_abs_mean"] > 0 and m["grad_norm"] > 0


def _stopped_early(batch, lengths):
    """`batch` as if row i had sampled EOS after lengths[i % len(lengths)] tokens (the tiny model
    rarely stops on its own, so every row would have the same length)."""
    import dataclasses

    keep = torch.zeros_like(batch.completion_mask)
    for i in range(keep.shape[0]):
        keep[i, : lengths[i % len(lengths)]] = 1
    mask = batch.completion_mask * keep
    ids = torch.where(
        mask.bool(), batch.completion_ids, torch.full_like(batch.completion_ids, batch.pad_token_id)
    )
    logprobs = None if batch.logprobs is None else batch.logprobs * mask
    return dataclasses.replace(
        batch, completion_ids=ids, completion_mask=mask, action_mask=None, logprobs=logprobs
    )


def test_trainer_passes_token_counts_to_reinforce_pp(tmp_path):
    """`reinforce_pp` whitens over tokens (verl's form: tests/algos/test_algos_advantages.py), so the
    score phase must hand it each sequence's action length; with lengths 1..3 the token-weighted
    advantages differ from the per-sequence ones."""
    tr = _trainer(
        tmp_path,
        "rollout.prompts_per_step=2",
        "rollout.group_size=3",
        "advantage.name=reinforce_pp",
        reward=_Length(),
    )
    real = tr.engine.generate
    tr.engine.generate = lambda *a, **k: _stopped_early(real(*a, **k), [1, 3, 2])
    with tr:
        ro = tr.rollout()
        tr.forward_without_rewards(ro)
        sc = tr.score(ro)
    b = ro.episodes.batch
    assert b.action_lengths.tolist() == [1, 3, 2, 1, 3, 2]
    expected = get_advantage("reinforce_pp")(sc.shaped, b.group_ids, token_counts=b.action_lengths.cpu())
    torch.testing.assert_close(sc.advantages, expected)
    per_sequence = get_advantage("reinforce_pp")(sc.shaped, b.group_ids)
    assert not torch.allclose(sc.advantages, per_sequence)


def _entropy_at(model, rows, tau):
    """Token-mean entropy of softmax(logits / tau) over the completion tokens, one unpadded forward each."""
    total, count = 0.0, 0
    with torch.no_grad():
        for prompt, comp in rows:
            ids = torch.tensor([prompt + comp])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / tau
            logp = torch.log_softmax(logits, -1)
            total += float(-(logp.exp() * logp).sum())
            count += len(comp)
    return total / count


class _RecordingController(Controller):
    """Leaves the temperature alone and keeps the metrics each update receives."""

    def __init__(self) -> None:
        self.seen: list[dict[str, float]] = []

    def apply(self, knobs: Knobs, step: int) -> None:
        pass

    def update(self, metrics: dict[str, float], step: int) -> dict[str, float]:
        self.seen.append(dict(metrics))
        return {"entropy": metrics["entropy_pre_update"]}


def test_entropy_pre_update_is_the_sampling_policy_entropy_with_two_minibatches(tmp_path):
    """With two minibatches the step's `entropy_pre_update` is the no-grad entropy of the policy that
    sampled (an independent forward of a copy taken before the step), it differs from `entropy` (the
    second minibatch's forward sees updated weights), and a controller gets both, unchanged.
    Wrong version guarded: the loop reporting the update's `entropy` as `entropy_pre_update` (E3's
    controller reads `entropy_pre_update`: lab/tests/recipes/e3/test_temperature_controller.py)."""
    import copy

    ctl = _RecordingController()
    tr = _trainer(
        tmp_path,
        "minibatches=2",
        "optimizer.lr=5e-2",
        "rollout.temperature=1.0",
        reward=_Parity(),
        controllers=[ctl],
    )
    seen = []
    real = tr.engine.generate

    def generate(*args, **kwargs):
        batch = real(*args, **kwargs)
        seen.append(batch)
        return batch

    tr.engine.generate = generate
    before = copy.deepcopy(tr.model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    (batch,) = seen
    rows = []
    for i in range(len(batch)):
        p = batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist()
        c = batch.completion_ids[i][batch.completion_mask[i].bool()].tolist()
        rows.append((p, c))
    expected = _entropy_at(before, rows, 1.0)
    assert m["entropy_pre_update"] == pytest.approx(expected, rel=1e-3)
    assert not math.isclose(m["entropy"], m["entropy_pre_update"], rel_tol=1e-4)
    (got,) = ctl.seen
    assert got["entropy_pre_update"] == m["entropy_pre_update"] and got["entropy"] == m["entropy"]
    assert m["controller/entropy"] == m["entropy_pre_update"]  # a controller's metrics are logged


class _Parity:
    name = "parity"

    def __call__(self, completion, example) -> float:
        return float(ord(completion[0]) % 2) if completion else 0.0


class _Length:
    name = "length"

    def __call__(self, completion, example) -> float:
        return float(len(completion))
