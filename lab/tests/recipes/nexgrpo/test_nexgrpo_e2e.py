"""End to end on the tiny preset: replayed failures join groups after the delayed start, carry their
importance weights into the loss, and the buffer state survives a checkpoint."""

from __future__ import annotations

import json
import warnings

import torch

from posttrain.rollout import FunctionRewardSource
from posttrain.train.config import load_rl_config
from posttrain.train.rl import RLTrainer


class EvenFirstChar:
    """About half of a random policy's completions are 'correct': partially solved groups."""

    name = "even_first_char"

    def __call__(self, completion, example):
        return float(bool(completion) and ord(completion[0]) % 2 == 0)


class _Spy:
    """Wraps the policy loss; records the importance weights it receives."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __getattr__(self, k):
        return getattr(self.fn, k)

    def __call__(self, logp, old, adv, mask, **kw):
        self.calls.append(kw.get("is_weights"))
        return self.fn(logp, old, adv, mask, **kw)


def _trainer(tmp_path, *extra, resume=False):
    cfg = load_rl_config(
        None,
        [
            "model.name=tiny",
            "model.device=cpu",
            "task.name=dialogue-events",
            "task.params={n_train: 8, n_heldout: 4, n_ood: 4}",
            "reward.num_workers=0",
            "rollout.prompts_per_step=4",
            "rollout.group_size=4",
            "rollout.max_new_tokens=3",
            "optimizer.lr=1e-2",
            "eval.at_start=false",
            "eval.at_end=false",
            "checkpoint.final=false",
            "threads=1",
            f"out_dir={tmp_path / 'run'}",
            *extra,
        ],
    )
    return RLTrainer(cfg, reward_source=FunctionRewardSource(EvenFirstChar(), num_workers=0), resume=resume)


def test_replayed_failures_join_groups_after_delayed_start_with_is_weights(tmp_path):
    hook = (
        "hooks.replay={name: nexgrpo, params: {start_accuracy: 0.0, start_step: 2, ratio: 0.5, gate: none}}"
    )
    tr = _trainer(tmp_path, hook)
    spy = _Spy(tr.loss_fn)
    tr.loss_fn = spy
    rollouts = []
    orig = tr.rollout
    tr.rollout = lambda: rollouts.append(orig()) or rollouts[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ms = [tr.step() for _ in range(4)]
    assert [m["replayed"] for m in ms[:2]] == [0, 0]  # delayed start: nothing before step 2
    assert ms[2]["replay/failures"] > 0 and ms[2]["replay/started"] == 1.0
    assert all(m["replayed"] >= 1 for m in ms[2:]), [m["replayed"] for m in ms]
    assert spy.calls[0] is None and spy.calls[1] is None
    for ro, w in zip(rollouts[2:], spy.calls[2:], strict=True):
        rep = ro.episodes.replayed
        gids = ro.episodes.batch.group_ids
        # every replayed row sits in a group with fresh rows (the mixed group of its prompt)
        for g in gids[rep].tolist():
            assert bool((~rep & (gids == g)).any())
        assert w is not None
        mask = ro.actions.bool()
        assert torch.all(w[~rep] == 1.0)  # fresh rows: weight exactly 1
        assert torch.any((w[rep] != 1.0) & mask[rep])  # replayed tokens: π_θ/π_past after updates
        # the weight is the buffer's clipped ratio against the stored sampling log-probs
        assert torch.all(w[rep][~mask[rep]] == 1.0)


def test_buffer_state_in_checkpoint(tmp_path):
    hook = "hooks.replay={name: random-failure, params: {start_accuracy: 0.0}}"
    tr = _trainer(tmp_path, hook)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr.step()
        tr.step()
    tr.save()
    state = json.loads(json.dumps(tr.collector.replay.state_dict()))
    assert state["records"]
    again = _trainer(tmp_path, hook, resume=True)
    assert again.collector.replay.state_dict() == state
