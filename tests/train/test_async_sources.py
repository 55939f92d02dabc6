"""Asynchronous rollout's parts, without Ray: the staleness bound as an object, and the worker source
driven through the real trainer with an in-process worker pool (the same GenerationWorker, built from
the run's RolloutSpec, run synchronously at dispatch), so that what the workers sample with, which
groups go stale and what a checkpoint holds are deterministic and checkable exactly.

Mutants these tests kill (each was seen to pass every earlier asynchronous test):
* workers that never receive new weights (published once, or loaded once);
* a regenerated stale group that keeps its old version (so it is never trained);
* a checkpoint that leaves out groups that arrived but were not yet trained on;
* the behaviour weight computed with π_θ instead of π_old;
* an asynchronous checkpoint resumed synchronously dropping its pending prompts silently."""

from __future__ import annotations

import copy
import warnings
from collections import deque

import pytest
import torch
from _train_helpers import RL_BASE, logp64

import posttrain.train.async_rollout as ar
from posttrain.train.config import load_rl_config
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer
from posttrain.train.staleness import StalenessBound
from posttrain.utils.errors import InvalidValueError

pytest.importorskip("ray", reason="the worker source checks for Ray's package (the ray extra)")

ASYNC = ["rollout.engine.name=fast", "threads=1", "rollout.max_staleness=1", "eval.at_start=false"]


class InlinePool:
    """RayPool's interface in this process: each submitted call runs at once on its worker (a
    GenerationWorker with its own copy of the model); ``hold`` = {call number: submits to wait} keeps a
    call's result back until that many later calls were submitted (or nothing else is left to wait for)."""

    hold: dict[int, int] = {}

    def __init__(self, gen, make_args):
        self.gen, self.make_args = gen, make_args
        self.incarnation = [0] * gen.num
        self.workers, self.results, self.release = [], {}, {}
        self.submits = 0
        self.loads = deque()

    def start(self, model):
        self.workers = [ar.GenerationWorker(*self.make_args(i, 0, copy.deepcopy(model))) for i in range(self.gen.num)]

    def put(self, obj):
        return obj

    def submit(self, worker, *args):
        ref = self.submits
        self.results[ref] = self.workers[worker].generate(*args)
        self.release[ref] = ref + self.hold.get(ref, 0)
        self.submits += 1
        return ref

    def wait(self, refs, block):
        done = [r for r in refs if self.release[r] < self.submits]
        if not done and block:
            done = [min(refs, key=lambda r: self.release[r])]
        return done

    def result(self, ref):
        return self.results.pop(ref)

    def restart(self, worker):
        raise AssertionError("no worker dies in process")

    def close(self):
        self.workers = []


@pytest.fixture
def inline_pool(monkeypatch):
    monkeypatch.setattr(ar, "RayPool", InlinePool)
    monkeypatch.setattr(InlinePool, "hold", {})
    return InlinePool


def _trainer(tmp_path, *extra, resume=False, name="run"):
    cfg = load_rl_config(None, [*RL_BASE, *ASYNC, f"out_dir={tmp_path / name}", *extra])
    return RLTrainer(cfg, resume=resume)


def _steps(tr, n):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        return [tr.step() for _ in range(n)]


# ------------------------------------------------------------------------------ the bound itself
def test_the_bound_admits_eta_plus_one_batches_ahead_and_rejections_free_places():
    b = StalenessBound(max_staleness=1, batch=4)
    assert b.room(0) == 8  # (η + 0 + 1) · B
    b.on_submitted(8)
    assert b.room(0) == 0 and b.running == 8
    b.on_accepted(4)  # step 0 trained on 4
    assert b.room(1) == 4  # (1 + 1 + 1) · 4 − (4 accepted + 4 running)
    b.on_submitted(4)
    b.on_accepted(2)
    b.on_rejected(2)  # the filter dropped 2: their places are free again
    assert b.running == 4 and b.room(2) == 16 - 6 - 4
    b.on_stale(3)  # stale groups go back to be generated again: still running
    assert b.running == 4 and b.stale == 3
    assert b.usable(3, 2) and b.usable(3, 3) and not b.usable(3, 1)
    c = StalenessBound(1, 4)
    c.load_state_dict(b.state_dict())
    assert c.state_dict() == b.state_dict() and c.room(2) == b.room(2)
    with pytest.raises(InvalidValueError, match="max_staleness must be >= 0"):
        StalenessBound(-1, 4)


def test_the_bound_at_zero_staleness_admits_one_batch():
    b = StalenessBound(0, 3)
    assert b.room(0) == 3 and b.usable(5, 5) and not b.usable(5, 4)


# ------------------------------------------------------------------------------ what workers sample with
def test_every_trained_group_was_sampled_by_the_version_it_is_labelled_with(tmp_path, inline_pool):
    """The behaviour log-probs μ of every trained row equal (float64 recomputation) the log-probs of
    the policy version its group is labelled with, and differ from the current policy's once it moved.
    Kills: weights published once; a worker that loads weights once and labels later calls with the new
    version; a wrong version label."""
    tr = _trainer(tmp_path, "optimizer.lr=0.05", "reward.name=_async_helpers:CrcParity")
    snapshots = {}
    real = tr.weight_sync.publish

    def publish(model, version):
        snapshots.setdefault(version, copy.deepcopy(model))
        real(model, version)

    tr.weight_sync.publish = publish
    src = tr.collector.source
    lagged = 0
    with tr:
        for step in range(4):
            _steps(tr, 1)
            ro = tr.last_scored[0]
            gids = src.history[-1][1]
            versions = [src.versions[g] for g in gids]
            assert max(step - v for v in versions) <= 1
            rows_of = ro.batch.group_ids.tolist()
            mask = ro.actions.bool()
            for j, v in enumerate(versions):
                rows = [i for i, g in enumerate(rows_of) if g == j]
                want = logp64(snapshots[v], ro)[rows]
                got = ro.batch.logprobs[rows].double()
                assert torch.allclose(got[mask[rows]], want[mask[rows]], atol=2e-5), (step, j, v)
                if v < step:  # sampled by an older version: the current policy gives other log-probs
                    lagged += 1
                    now = logp64(snapshots[step], ro)[rows]
                    assert (now[mask[rows]] - want[mask[rows]]).abs().max() > 1e-3
    assert lagged > 0 and tr.weight_sync.sends == 4  # one publication per step


def test_a_group_regenerated_as_stale_is_trained_with_its_new_version(tmp_path, inline_pool):
    """The first call (groups 0 and 1, version 0) comes back only after 6 more calls: by then the
    trainer is more than η = 1 versions ahead, so both groups are generated again with the current
    policy under their ids, and trained. Kills: the regenerated group keeping its old version label
    (it would be dropped as stale again and again, never trained)."""
    inline_pool.hold = {0: 6}
    tr = _trainer(tmp_path, "rollout.generators.prompts_per_call=2")
    src = tr.collector.source
    with tr:
        ms = _steps(tr, 6)
    trained = {g: s for s, gs in src.history for g in gs}
    assert {0, 1} <= set(trained), src.history
    assert src.versions[0] >= 2 and trained[0] - src.versions[0] <= 1
    assert ms[-1]["stale_regenerated_total"] >= 2 and all(m["staleness_max"] <= 1 for m in ms)
    gids = [g for _, gs in src.history for g in gs]
    assert len(gids) == len(set(gids))  # none trained twice


def test_resume_after_groups_arrived_but_were_not_trained_keeps_the_prompt_sets(tmp_path, inline_pool):
    """After 3 steps the groups generated ahead have arrived and wait, untrained, in the buffer. A
    checkpoint then, resumed, trains the same prompts at every step as the run that went on. Kills: a
    checkpoint without the buffered groups (the resume lost them and drew other prompts)."""

    def prompt_sets(tr):
        src = tr.collector.source
        ids = {}
        for step, gids in src.history:
            ids[step] = sorted(tr.train_examples[src._index[id(src._example_of[g])]].id for g in gids)
        return ids

    def record_examples(tr):
        src = tr.collector.source
        src._example_of = {}
        real = src._arrived

        def arrived(call, episodes):
            src._example_of.update(zip(call.gids, call.examples, strict=True))
            real(call, episodes)

        src._arrived = arrived

    full = _trainer(tmp_path, name="full")
    record_examples(full)
    with full:
        _steps(full, 5)
        want = prompt_sets(full)
    part = _trainer(tmp_path, "checkpoint.every=1", name="part")
    record_examples(part)
    with part:
        _steps(part, 3)
        assert part.collector.source._buffer  # arrived, not yet trained
        part.save()
        got = prompt_sets(part)
    resumed = _trainer(tmp_path, "checkpoint.every=1", name="part", resume=True)
    record_examples(resumed)
    with resumed:
        _steps(resumed, 2)
        got.update(prompt_sets(resumed))
    assert got == want


def test_an_async_checkpoint_resumed_synchronously_is_refused(tmp_path, inline_pool):
    tr = _trainer(tmp_path)
    with tr:
        _steps(tr, 2)
        tr.save()
        assert tr.collector.state_dict()["pending"]
    cfg = load_rl_config(None, [*RL_BASE, *ASYNC, f"out_dir={tmp_path / 'run'}", "rollout.max_staleness=0"])
    with pytest.raises(InvalidValueError, match=r"dispatched but not yet trained on.*rollout.max_staleness"):
        RLTrainer(cfg, resume=True)


# ------------------------------------------------------------------------------ off-policy correction
def test_the_behaviour_weight_uses_pi_old_not_pi_theta():
    """With ``minibatches`` or ``ppo_epochs`` > 1, π_θ moves away from π_old within the step; the
    behaviour weight must stay π_old / μ (the loss's ratio carries π_θ / π_old). Kills: π_θ in the
    weight (then it would be exp(logp − μ) here)."""
    from posttrain.rollout import Episodes, RolloutBatch
    from posttrain.train.correction import BehaviourWeights

    old = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    cur = torch.tensor([[-0.2, -3.0]], dtype=torch.float64)  # π_θ after a first minibatch
    mu = torch.tensor([[-1.1, -1.9]])
    batch = RolloutBatch.from_token_lists([[1]], [[2, 3]], pad_token_id=0, group_ids=[0], finish_reasons=["stop"])
    batch.logprobs = mu
    eps = Episodes(batch, ["a"], [None])
    w = BehaviourWeights("token_truncate", 10.0, None)(torch.arange(1), cur, old, torch.ones(1, 2), eps, batch)
    assert torch.allclose(w.double(), torch.exp(old - mu.double()), atol=1e-6)
    assert not torch.allclose(w.double(), torch.exp(cur - mu.double()), atol=1e-2)


def test_a_local_ray_starts_without_dashboard_on_loopback_and_is_shut_down(monkeypatch):
    """The local Ray a run starts listens on loopback only and has no dashboard (they outlived killed
    runs on the machine's address), and the pool that started it shuts it down on close."""
    calls = {}

    class FakeRay:
        def is_initialized(self):
            return "init" in calls

        def init(self, **kw):
            calls["init"] = kw

        def put(self, obj):
            return obj

        def remote(self, cls):
            class Actor:
                def options(self, **kw):
                    return self

                def remote(self, *args):
                    return ("actor", args[0])

            return Actor()

        def kill(self, actor, no_restart=True):
            calls.setdefault("killed", []).append(actor)

        def shutdown(self):
            calls["shutdown"] = True

    monkeypatch.setattr(ar, "require_ray", lambda: FakeRay())
    gen = load_rl_config(None, [*RL_BASE, *ASYNC, "rollout.generators.num=2"]).rollout.generators
    pool = ar.RayPool(gen, lambda i, inc, ref: (i,))
    pool.start(torch.nn.Linear(1, 1))
    kw = calls["init"]
    assert kw["include_dashboard"] is False and kw["_node_ip_address"] == "127.0.0.1"
    assert kw["num_cpus"] == 2 and pool.workers == [("actor", 0), ("actor", 1)]
    pool.close()
    assert calls["shutdown"] and calls["killed"] == [("actor", 0), ("actor", 1)]
