"""Asynchronous rollout (rollout.max_staleness > 0) with a local Ray: the staleness bound under slow,
fast and two generators; the importance weights against hand-computed π_θ / π_behaviour in float64;
the group filter and the sampler under staleness; kill and resume; a dying and a raising worker; and
max_staleness 0 being the synchronous run without Ray."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch
from _train_helpers import CLI_TINY, RL_BASE, kill_at_step, logp64
from typer.testing import CliRunner

from posttrain.train.config import load_rl_config
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer

ray = pytest.importorskip("ray", reason="asynchronous rollout needs the ray extra (make test installs it)")
# each trainer starts Ray actors that import torch and the model (a few seconds each): slow, run in CI
pytestmark = pytest.mark.slow

from posttrain.train.async_rollout import GenerationWorkerError, WorkerRestartWarning  # noqa: E402

ROOT = Path(__file__).parents[2]
ASYNC = ["rollout.engine.name=fast", "threads=1", "rollout.max_staleness=1"]
SCRIPTED = "rollout.runner.name=_async_helpers:scripted_runner"


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray (2 CPUs) for the module; trainers join it and leave it running."""
    path = os.pathsep.join(p for p in sys.path if p)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    yield
    ray.shutdown()


def _cfg(tmp_path, *extra):
    return load_rl_config(None, [*RL_BASE, *ASYNC, f"out_dir={tmp_path / 'run'}", *extra])


def _slow_updates(tr, monkeypatch, seconds):
    real = tr.update

    def slow_update(*a, **kw):
        time.sleep(seconds)
        return real(*a, **kw)

    monkeypatch.setattr(tr, "update", slow_update)


def _steps(tr, n):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        return [tr.step() for _ in range(n)]


# ------------------------------------------------------------------------------ no Ray at staleness 0
@pytest.mark.slow
def test_max_staleness_zero_is_the_synchronous_run_and_imports_no_ray():
    """The default (0) and an explicit 0 give the same metrics as each other, step by step, and neither
    imports Ray (checked in a fresh process, where nothing else could have)."""
    code = textwrap.dedent(
        f"""
        import json, sys, warnings
        sys.path.insert(0, {str(ROOT / "tests" / "helpers")!r})
        warnings.simplefilter("ignore")
        from _train_helpers import RL_BASE
        from posttrain.train.config import load_rl_config
        from posttrain.train.rl import RLTrainer
        runs = []
        for extra in ([], ["rollout.max_staleness=0"]):
            cfg = load_rl_config(None, [*RL_BASE, "threads=1", "rollout.engine.name=fast", *extra])
            with RLTrainer(cfg) as tr:
                runs.append([tr.step() for _ in range(2)])
        print(json.dumps({{"runs": runs, "ray": "ray" in sys.modules}}))
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["ray"] is False
    timing = ("time_", "tokens_per_s")
    a, b = ([{k: v for k, v in m.items() if not k.startswith(timing)} for m in run] for run in res["runs"])
    assert a == b
    assert not any(k.startswith("staleness") for k in a[0])


def test_config_refuses_what_async_cannot_do_yet():
    with pytest.raises(ValueError, match=r"rollout.max_staleness=1 with hooks.replay 'success'"):
        load_rl_config(None, [*RL_BASE, *ASYNC, "hooks.replay.name=success"])
    with pytest.raises(ValueError, match=r"rollout.is_correction.mode"):
        load_rl_config(None, [*RL_BASE, *ASYNC, "rollout.is_correction.mode=tokens"])


# ------------------------------------------------------------------------------ the bar (CLI)
def test_cli_three_steps_with_max_staleness_one_keep_the_bound(tmp_path, local_ray):
    from posttrain.cli import app

    run = tmp_path / "run"
    args = ["rl", *CLI_TINY, *ASYNC, "steps=3", "eval.at_start=false", "eval.at_end=false"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        res = CliRunner().invoke(app, [*args, f"out_dir={run}", "--no-progress"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("kind", "step") == "step" and "staleness_max" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["staleness_max"] <= 1
        assert r["staleness_hist_0"] + r["staleness_hist_1"] == r["num_groups"] == 2
        for key in ("staleness_mean", "queue_depth", "in_flight", "generator_util", "trainer_util"):
            assert key in r
    # one-step-off: from the second step on the trainer uses groups of the previous version
    assert [r["staleness_max"] for r in steps] == [0, 1, 1]


# ------------------------------------------------------------------------------ the bound
def test_a_step_takes_only_groups_within_the_bound_oldest_first(tmp_path):
    """The rule itself, without timing: at step 3 with η = 1, groups of versions 0 and 1 (lag 3 and 2)
    are dropped and queued to be generated again under their ids; the step takes the oldest of the
    rest; the newest waits. (No Ray: workers start at the first step.)"""
    from posttrain.rollout import Episodes, RolloutBatch
    from posttrain.train.async_rollout import _Group

    tr = RLTrainer(_cfg(tmp_path))
    c = tr.collector.source
    batch = RolloutBatch.from_token_lists(
        [[1]], [[2]], pad_token_id=0, group_ids=[0], finish_reasons=["stop"]
    )
    eps = Episodes(batch, ["x"], [None])
    versions = [3, 0, 2, 1, 2]
    c._buffer = [_Group(i, tr.train_examples[i], 1, v, v, eps, None, [0]) for i, v in enumerate(versions)]
    c._stats = {"stale_regenerated": 0.0}
    got = c._take(3, need=2)
    assert [(g.gid, g.version) for g in got] == [(2, 2), (4, 2)]
    assert sorted(p.gid for p in c._redo) == [1, 3] and c._stats["stale_regenerated"] == 2
    assert c.bound.stale == 2
    assert [g.gid for g in c._buffer] == [0]
    assert not c.started  # nothing started
    tr.close()


def test_bound_holds_with_a_slow_generator(tmp_path, local_ray):
    """Generation (0.4 s a call) is slower than a tiny step: the trainer waits, groups are one version
    old, none is dropped."""
    tr = RLTrainer(_cfg(tmp_path, SCRIPTED, 'rollout.runner.params={delays: {"0": 0.4}}'))
    with tr:
        ms = _steps(tr, 4)
    assert all(m["staleness_max"] <= 1 for m in ms)
    assert [m["staleness_max"] for m in ms] == [0, 1, 1, 1]
    assert ms[-1]["stale_regenerated_total"] == 0
    assert all(m["time_wait_groups"] > 0.2 for m in ms[1:])  # the trainer waited for the generator


def test_bound_holds_with_a_fast_generator_and_a_slow_trainer(tmp_path, local_ray, monkeypatch):
    """The trainer is slow (0.4 s per update), so the generator runs ahead: only the admission bound,
    (η + 1) · prompts_per_step groups not yet consumed, keeps it within η = 2 (no group is ever too old
    to use, so none is dropped), and the trainer does use groups η versions old."""
    tr = RLTrainer(_cfg(tmp_path, "rollout.max_staleness=2"))
    _slow_updates(tr, monkeypatch, 0.4)
    with tr:
        ms = _steps(tr, 5)
    lags = [m["staleness_max"] for m in ms]
    assert max(lags) == 2 and all(x <= 2 for x in lags), lags
    assert ms[-1]["stale_regenerated_total"] == 0
    assert all(m["queue_depth"] + m["in_flight"] <= 2 * 4 for m in ms)


def test_bound_holds_with_two_workers_one_slow(tmp_path, local_ray, monkeypatch):
    """Worker 1 takes 1 s per group, worker 0 is fast and a step takes >= 0.3 s: worker 1's groups come
    back more than η versions behind and are dropped (and generated again), so the bound is enforced,
    not merely never challenged; no group is used twice."""
    extra = [
        SCRIPTED,
        'rollout.runner.params={delays: {"1": 1.0}}',
        "rollout.generators.num=2",
        "rollout.generators.prompts_per_call=1",
    ]
    tr = RLTrainer(_cfg(tmp_path, *extra))
    _slow_updates(tr, monkeypatch, 0.3)
    with tr:
        ms = _steps(tr, 8)
        gids = [g for _, gs in tr.collector.source.history for g in gs]
    assert all(m["staleness_max"] <= 1 for m in ms), [m["staleness_max"] for m in ms]
    assert ms[-1]["stale_regenerated_total"] > 0
    assert len(gids) == len(set(gids)) == 8 * 4  # regenerated groups keep their id; none used twice


# ------------------------------------------------------------------------------ off-policy correction
def test_importance_weights_are_pi_theta_over_pi_behaviour(tmp_path, local_ray, monkeypatch):
    """At step 2 the groups were sampled by version 1 (μ) and the trainer is at version 2: the weights
    handed to the loss equal exp(log π_θ − log μ) with log π_θ computed here by hand in float64 from the
    pre-update weights, and differ from 1 (so using the current log-probs as behaviour would fail).
    The same run checks the sampler under staleness: it plans when groups are dispatched, at the
    trainer's step of that moment, so a group used at step s was planned at s − 1 (one-step-off)."""
    import posttrain.train.rl as rl
    from posttrain.hooks import SAMPLERS, UniformSampler

    class Recording(UniformSampler):
        def __init__(self, examples, *, seed=0):
            super().__init__(examples, seed=seed)
            self.planned = {}

        def plan(self, step, num_prompts, group_size):
            p = super().plan(step, num_prompts, group_size)
            self.planned.update({ex.id: step for ex in p.examples})
            return p

    SAMPLERS.register("recording-async")(Recording)
    seen = []
    real = rl.combine_weights

    def record(parts):
        w = real(parts)
        seen.append(w.detach().clone())
        return w

    monkeypatch.setattr(rl, "combine_weights", record)
    extra = ["optimizer.lr=0.05", "rollout.is_correction.cap=1e6", "reward.name=_async_helpers:CrcParity"]
    tr = RLTrainer(_cfg(tmp_path, *extra, "hooks.sampler.name=recording-async"))
    with tr:
        _steps(tr, 1)
        before = copy.deepcopy(tr.model)
        seen.clear()
        (m,) = _steps(tr, 1)
        ro = tr.last_scored[0]
        planned = tr.collector.sampler.planned
    assert m["staleness_max"] == m["staleness_mean"] == 1
    assert {planned[ex.id] for ex in ro.episodes.examples} == {0}  # planned at dispatch, used at step 1
    (w,) = seen  # one micro-batch
    mask = ro.actions.bool()
    want = torch.where(mask, torch.exp(logp64(before, ro) - ro.batch.logprobs.double()), 1.0)
    assert torch.allclose(w.double(), want, rtol=2e-4, atol=1e-6), (w - want).abs().max()
    assert (want[mask] - 1).abs().max() > 1e-2  # the policy moved between the versions


def test_behaviour_weights_truncate_at_the_cap_and_leave_replayed_rows_alone():
    from posttrain.rollout import Episodes, RolloutBatch
    from posttrain.train.correction import BehaviourWeights

    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]], dtype=torch.float64)
    mu = torch.tensor([[-1.5, -1.0, 0.0], [-2.0, -0.1, -0.5]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    batch = RolloutBatch.from_token_lists(
        [[1], [1]], [[2, 3, 4], [2, 3, 4]], pad_token_id=0, group_ids=[0, 0], finish_reasons=["stop"] * 2
    )
    batch.logprobs = mu.float()
    eps = Episodes(batch, ["a", "b"], [None, None], replayed=torch.tensor([False, True]))
    w = BehaviourWeights("token_truncate", 1.5, None)(torch.arange(2), old, old, mask, eps, batch)
    want = torch.tensor(
        [
            [min(float(torch.exp(torch.tensor(0.5))), 1.5), float(torch.exp(torch.tensor(-1.0))), 1.0],
            [1.0, 1.0, 1.0],
        ]
    )
    assert torch.allclose(w, want.to(w.dtype), atol=1e-6)


# ------------------------------------------------------------------------------ hooks under staleness
def test_group_filter_applies_to_async_groups(tmp_path, local_ray):
    """DAPO's dynamic-sampling filter decides on the consumed groups: even prompts (constant reward)
    are dropped, every trained group has reward variance."""
    extra = [
        "reward.name=_async_helpers:CrcParity",
        "hooks.filter={name: dynamic-sampling, params: {max_rounds: 30}}",
    ]
    tr = RLTrainer(_cfg(tmp_path, *extra))
    with tr:
        ms = []
        for _ in range(3):
            ms += _steps(tr, 1)
            ids = {int(ex.id.rsplit("-", 1)[1]) for ex in tr.last_scored[0].episodes.examples}
            assert all(i % 2 == 1 for i in ids), ids
    assert all(m["zero_var_frac"] == 0 and m["filter/groups_kept"] == 4 for m in ms)
    assert sum(m["filter/dropped_zero_variance"] for m in ms) > 0
    assert all(m["staleness_max"] <= 1 for m in ms)


# ------------------------------------------------------------------------------ resume, lock, crashes
def test_kill_and_resume_lose_no_group_and_train_none_twice(tmp_path, local_ray, monkeypatch):
    extra = ["steps=4", "checkpoint.every=1", "eval.at_end=false"]
    tr = RLTrainer(_cfg(tmp_path, *extra))
    assert not tr.collector.source.started  # workers start inside the run, under the run folder's lock
    kill_at_step(monkeypatch, RLTrainer, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        with pytest.raises(KeyboardInterrupt):
            tr.train()
    assert not tr.collector.source.started  # stopped before the lock was released
    pre = tr.collector.source.history
    tr.close()
    monkeypatch.undo()
    state = json.loads((tmp_path / "run" / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    pending = [g[0] for g in state["collector"]["pending"]]
    assert len(pending) == 4  # one step's groups were generated ahead (η · prompts_per_step)
    tr2 = RLTrainer(_cfg(tmp_path, *extra), resume=True)
    with tr2, warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        tr2.train()
        post = tr2.collector.source.history
    assert [s for s, _ in pre] == [0, 1] and [s for s, _ in post] == [2, 3]
    used_pre = {g for _, gs in pre for g in gs}
    used_post = [g for _, gs in post for g in gs]
    assert not used_pre & set(used_post) and len(used_post) == len(set(used_post))
    assert set(pending) <= set(used_post)  # what was in flight at the checkpoint is trained on
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "staleness_max" in r] == [1, 2, 3, 4]


def test_a_dead_worker_is_restarted_once(tmp_path, local_ray):
    marker = tmp_path / "died"
    params = f'rollout.runner.params={{exit_at: 2, marker: "{marker}"}}'
    tr = RLTrainer(_cfg(tmp_path, SCRIPTED, params))
    with tr, pytest.warns(WorkerRestartWarning, match="generation worker 0 died"):
        ms = _steps(tr, 4)
    assert marker.exists()
    assert ms[-1]["worker_restarts"] == 1
    assert all(m["staleness_max"] <= 1 and m["num_groups"] == 4 for m in ms)
    gids = [g for _, gs in tr.collector.source.history for g in gs]
    assert len(gids) == len(set(gids)) == 16


def test_a_worker_dying_beyond_max_restarts_stops_the_run(tmp_path, local_ray):
    marker = tmp_path / "died"
    params = f'rollout.runner.params={{exit_at: 1, marker: "{marker}"}}'
    tr = RLTrainer(_cfg(tmp_path, SCRIPTED, params, "rollout.generators.max_restarts=0"))
    with (
        tr,
        pytest.raises(
            GenerationWorkerError, match=r"worker 0 died 1 times \(rollout.generators.max_restarts=0\)"
        ),
    ):
        _steps(tr, 2)


def test_a_worker_exception_stops_the_run_with_its_traceback(tmp_path, local_ray):
    tr = RLTrainer(_cfg(tmp_path, SCRIPTED, "rollout.runner.params={raise_at: 2}"))
    with tr, pytest.raises(GenerationWorkerError) as info:
        _steps(tr, 3)
    msg = str(info.value)
    print(msg)
    assert "scripted failure in generation worker 0" in msg
    assert 'raise RuntimeError("scripted failure' in msg and "_async_helpers.py" in msg  # its traceback
