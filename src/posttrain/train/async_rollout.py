"""Asynchronous rollout with a staleness bound (``rollout.max_staleness`` = η > 0; docs/async.md).

The trainer's loop does not change: :class:`AsyncRolloutCollector` replaces the
:class:`~posttrain.train.collector.RolloutCollector` and returns a step's episodes from
``collect(step, params)`` like it, so the five phases of :mod:`posttrain.train.rl` run as they do
synchronously. What differs is where the episodes come from:

* **Generation workers** (:class:`GenerationWorker`) are Ray actors, each with a copy of the policy,
  the configured ``rollout.engine`` (fast CPU engine, HF, vLLM) and ``rollout.runner``. The trainer's
  weights reach them by version through Ray's object store: one ``ray.put`` of the state dict per
  policy version (the version is the trainer's step counter, i.e. the number of optimizer steps
  behind it), which every worker ``ray.get``\\s once when it first generates with that version.
* **Dispatch** (at the trainer's step s, inside ``collect``): the sampler plans prompts
  (``sampler.plan(s, ...)``: curricula and samplers choose at dispatch time, with the policy of
  version s) and the collector sends them to the least-loaded worker, tagged with version s and the
  temperature of step s; every group (one prompt's ``n`` completions) gets a global id. The
  collector keeps at most ``(η + 1) · ceil(prompts_per_step · oversample)`` groups dispatched and
  not yet consumed (AReaL's admission rule, arXiv:2505.24298 §5.1), so the workers generate ahead
  while the trainer trains, but not further ahead than the bound lets the trainer use.
* **Consumption**: the trainer at version s takes ready groups oldest version first; a group of
  version v is used only if ``s − v ≤ η``. An older one is dropped and its prompt generated again with
  the current policy (``stale_regenerated``: no prompt is lost, none is trained on twice). Rewards
  are scored by the trainer's reward source as each batch of groups arrives; the group filter
  (DAPO dynamic sampling) decides on consumed groups exactly as on a synchronous round.
* **Off-policy correction**: each group carries its behaviour log-probs μ (the engine's sampling
  log-probs under version v); :class:`BehaviourWeights` multiplies each fresh token's loss by the
  truncated importance weight ``min(π_old / μ, C)`` (``rollout.staleness_is``), π_old the trainer's
  policy at the start of the step, while the objective's ratio π_θ / π_old and clip act as they do
  synchronously (decoupled PPO, AReaL arXiv:2505.24298 Eq. 5, with TIS).
* **Safety**: a worker whose process dies is replaced (``rollout.generators.max_restarts``, default
  once) and its unfinished groups generated again; an exception inside a worker stops the run with
  the worker's traceback (:class:`GenerationWorkerError`). The checkpoint holds the next group id and
  every dispatched-but-unconsumed group (prompt index, completions, dispatch step): ``--resume``
  generates exactly those again first, so no prompt is lost and none is used twice. Workers start at
  the first ``collect`` (inside the run, so while the run folder's lock is held), are owned by the
  trainer's process (non-detached actors: Ray ends them with it) and are killed by
  :meth:`AsyncRolloutCollector.close`, which the run loop calls before it releases the lock.

Ray is imported only here, and this module only when ``rollout.max_staleness`` > 0.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import sys
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.algos.importance import truncated_is_weights
from posttrain.hooks import PromptPlan
from posttrain.models.precision import precision_autocast
from posttrain.rollout import Episodes, RewardHandle, SamplingParams, ScoredBatch
from posttrain.rollout.reward_source import _Ready
from posttrain.train.collector import RolloutCollector
from posttrain.utils.errors import InvalidValueError, PosttrainRuntimeError, PosttrainWarning

#: Environment variable a generation worker sets to its index (scripted test runners read it).
WORKER_ENV = "POSTTRAIN_GEN_WORKER"


class GenerationWorkerError(PosttrainRuntimeError):
    """A generation worker raised an exception, or died more often than
    ``rollout.generators.max_restarts`` allows: the run stops with the worker's traceback."""


class WorkerRestartWarning(PosttrainWarning, RuntimeWarning):
    """A generation worker died and was replaced."""


def require_ray() -> Any:
    """The ``ray`` module, or an error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InvalidValueError(
            "rollout.max_staleness > 0 runs the generation workers on Ray, which is not installed: "
            "pip install -e '.[ray]' (or set rollout.max_staleness=0)"
        ) from None
    return ray


# -------------------------------------------------------------------------------- the worker (actor)
class GenerationWorker:
    """One generation worker; the collector runs it as a Ray actor (``ray.remote(GenerationWorker)``).

    Holds a copy of the policy (``model``, moved to ``device``), builds the configured engine and
    episode runner around it (engine seed ``seed``) and generates with the weights of the version it
    is asked for, loading them from the object store only when the version changes."""

    def __init__(self, index: int, model: Any, tokenizer: Any, cfg: Any, seed: int, device: str) -> None:
        from posttrain.rollout import EngineContext, RunnerContext, build_engine, build_runner
        from posttrain.train.builder import build_formatter

        os.environ[WORKER_ENV] = str(index)
        torch.set_num_threads(cfg.rollout.generators.threads)
        self.index, self.device, self.precision = index, torch.device(device), cfg.model.precision
        self.model = model.to(self.device)
        self.version = -1
        formatter = build_formatter(cfg.task, tokenizer)
        ctx = EngineContext(
            self.model,
            tokenizer,
            seed=seed,
            max_batch_size=cfg.rollout.max_batch_size,
            precision=cfg.model.precision,
        )
        self.engine = build_engine(cfg.rollout.engine.name, cfg.rollout.engine.params, ctx)
        run_ctx = RunnerContext(self.engine, formatter, tokenizer, seed=seed)
        self.runner = build_runner(cfg.rollout.runner.name, cfg.rollout.runner.params, run_ctx)

    def generate(
        self,
        weights: list[Any],
        version: int,
        examples: list[Any],
        n_per_prompt: list[int],
        params: SamplingParams,
    ) -> dict[str, Any]:
        """Episodes of ``examples`` under policy ``version`` (``weights[0]``: the object-store reference
        of its state dict, in a list so that Ray hands over the reference, not the tensors) and the
        wall-clock interval the worker was busy."""
        import ray

        start = time.time()
        if version != self.version:
            self.model.load_state_dict(ray.get(weights[0]))
            self.engine.sync_weights(self.model)
            self.version = version
        with precision_autocast(self.device, self.precision):
            episodes = self.runner.run(examples, n_per_prompt, params)
        return {"episodes": episodes, "version": version, "start": start, "end": time.time()}

    def pid(self) -> int:
        return os.getpid()


# ------------------------------------------------------------------------------ the collector's parts
@dataclass
class _Call:
    """One generate call in flight: its groups (global ids, examples, completions each), the step and
    policy version it was dispatched at, and the worker (and that worker's incarnation) running it."""

    gids: list[int]
    examples: list[Any]
    n_per_prompt: list[int]
    dispatch_step: int
    version: int
    params: SamplingParams
    worker: int
    incarnation: int


class _Scores:
    """The reward handle of one call's episodes, resolved once; its failure counts go to the first
    step that consumes one of its groups."""

    def __init__(self, handle: RewardHandle) -> None:
        self.handle, self._res, self.counted = handle, None, False

    def result(self) -> ScoredBatch:
        if self._res is None:
            self._res = self.handle.result()
        return self._res


@dataclass
class _Group:
    """One generated group: one prompt's completions (``episodes``, group id 0), the policy version
    that generated them and where its rewards are (``scores``, ``rows`` of its call)."""

    gid: int
    example: Any
    n: int
    dispatch_step: int
    version: int
    episodes: Episodes
    scores: _Scores
    rows: list[int]


@dataclass
class _Pending:
    """A group to dispatch again (stale, its worker died, or unconsumed at the last checkpoint)."""

    gid: int
    example: Any
    n: int
    dispatch_step: int


class AsyncRolloutCollector(RolloutCollector):
    """The step's rollout from generation workers with a staleness bound (module docstring).

    Same ``collect(step, params) -> (episodes, reward handle, rounds)`` as the synchronous collector;
    in addition ``metrics()`` (the step's staleness, queue and utilisation numbers),
    ``state_dict()`` / ``load_state_dict()`` (what ``--resume`` needs), ``close()`` (kills the
    workers; shuts Ray down if it started it) and ``history`` ((step, group ids) of every consumed
    step, for tests and analyses). ``model`` is the trainer's policy (its weights are published per
    version), ``cfg`` the run's :class:`~posttrain.train.config.RLConfig`, ``train_examples`` the
    training split (a checkpoint names unconsumed prompts by their index in it)."""

    def __init__(self, *, model: Any, cfg: Any, train_examples: list[Any], **parts: Any) -> None:
        super().__init__(**parts)
        self.model, self.cfg = model, cfg
        self.max_staleness = cfg.rollout.max_staleness
        gen = cfg.rollout.generators
        self.gen = gen
        self.prompts_per_call = gen.prompts_per_call or math.ceil(self.prompts_per_step / gen.num)
        self.examples = train_examples
        self._index = {id(ex): i for i, ex in enumerate(train_examples)}
        self._ray: Any = None
        self._owns_ray = False
        self._workers: list[Any] = []
        self._incarnation = [0] * gen.num
        self.restarts = [0] * gen.num
        self._model_ref: Any = None
        self._weights: tuple[int, Any] | None = None  # (version, object ref)
        self._inflight: dict[Any, _Call] = {}
        self._buffer: list[_Group] = []
        self._redo: deque[_Pending] = deque()
        self._next_gid = 0
        self.history: list[tuple[int, list[int]]] = []
        self._stats: dict[str, float] = {}
        self._busy: list[float] = []  # completed calls' busy seconds
        self._t_first: float | None = None
        self._t_collect = self._t_return = 0.0
        self.stale_regenerated_total = 0
        self._taken = 0  # groups the current step has kept so far

    # ------------------------------------------------------------------------------- workers
    def start(self) -> None:
        """Start (or join) Ray and the workers; called by the first :meth:`collect`."""
        if self._workers:
            return
        ray = self._ray = require_ray()
        if not ray.is_initialized():
            g = self.gen
            if g.ray_address is None:  # a local Ray; its workers import what this process imports
                path = os.pathsep.join(p for p in sys.path if p)
                ray.init(
                    num_cpus=g.num_cpus or g.num * g.threads,
                    include_dashboard=False,
                    runtime_env={"env_vars": {"PYTHONPATH": path}},
                )
            else:
                ray.init(address=g.ray_address)
            self._owns_ray = True
        model = copy.deepcopy(self.model).to("cpu")
        self._model_ref = ray.put(model)
        del model
        self._workers = [self._new_worker(i) for i in range(self.gen.num)]

    def _new_worker(self, i: int) -> Any:
        ray, g = self._ray, self.gen
        actor = ray.remote(GenerationWorker).options(num_cpus=g.threads, num_gpus=g.num_gpus, max_restarts=0)
        # a replaced worker samples from a new stream (seed + 1 as the synchronous engine, per worker)
        seed = self.cfg.seed + 1 + 1000 * (i + 1) + 100_003 * self._incarnation[i]
        device = "cuda" if g.num_gpus > 0 else "cpu"
        return actor.remote(i, self._model_ref, self.tokenizer, self.cfg, seed, device)

    def _restart(self, call: _Call, err: BaseException) -> None:
        """The worker of ``call`` died: replace it (once per death) and generate its groups again."""
        w = call.worker
        if call.incarnation == self._incarnation[w]:  # first failed call of this death
            self.restarts[w] += 1
            if self.restarts[w] > self.gen.max_restarts:
                raise GenerationWorkerError(
                    f"generation worker {w} died {self.restarts[w]} times (rollout.generators.max_restarts="
                    f"{self.gen.max_restarts}); the run stops. Last error:\n{err}"
                ) from None
            warnings.warn(
                f"generation worker {w} died ({type(err).__name__}); restarting it "
                f"({self.restarts[w]} of rollout.generators.max_restarts={self.gen.max_restarts}); its "
                f"{len(call.gids)} unfinished groups are generated again",
                WorkerRestartWarning,
                stacklevel=2,
            )
            with contextlib.suppress(Exception):  # already gone
                self._ray.kill(self._workers[w], no_restart=True)
            self._incarnation[w] += 1
            self._workers[w] = self._new_worker(w)
        self._requeue(call)

    def _requeue(self, call: _Call) -> None:
        for gid, ex, n in zip(call.gids, call.examples, call.n_per_prompt, strict=True):
            self._redo.append(_Pending(gid, ex, n, call.dispatch_step))

    def close(self) -> None:
        """Kill the workers; shut Ray down when this collector started it."""
        if self._ray is None:
            return
        for actor in self._workers:
            with contextlib.suppress(Exception):
                self._ray.kill(actor, no_restart=True)
        for call in self._inflight.values():  # unfinished groups are generated again if the run goes on
            self._requeue(call)
        self._workers, self._inflight = [], {}
        self._weights = self._model_ref = None
        if self._owns_ray:
            self._ray.shutdown()
        self._ray, self._owns_ray = None, False

    # ------------------------------------------------------------------------------ dispatch
    def _publish(self, version: int) -> Any:
        """The object-store reference of the policy's weights at ``version`` (one ``ray.put`` each)."""
        if self._weights is None or self._weights[0] != version:
            state = {k: v.detach().to("cpu") for k, v in self.model.state_dict().items()}
            self._weights = (version, self._ray.put(state))
        return self._weights[1]

    def _target(self) -> int:
        over = self.group_filter.oversample if self.group_filter is not None else 1.0
        return (self.max_staleness + 1) * math.ceil(self.prompts_per_step * over)

    def _outstanding(self) -> int:
        """Groups dispatched (or waiting to be) and not yet consumed, plus those the current step has
        taken already: at version s at most (η + 1) · B of them, so a group dispatched now is consumed
        by step s + η at the latest when groups arrive in order (AReaL's rule: groups dispatched in
        total ≤ (s + η + 1) · B)."""
        inflight = sum(len(c.gids) for c in self._inflight.values())
        return inflight + len(self._buffer) + len(self._redo) + self._taken

    def _top_up(self, step: int, params: SamplingParams) -> None:
        """Dispatch until the admission bound is reached: groups to generate again first, then new
        prompts from the sampler (planned now, at step ``step``)."""
        weights = None
        while True:
            room = self._target() - self._outstanding()
            if room <= 0 and not self._redo:
                return
            k = min(self.prompts_per_call, len(self._redo) or room)
            if self._redo:
                todo = [self._redo.popleft() for _ in range(k)]
            else:
                plan = self.sampler.plan(step, k, self.group_size)
                todo = []
                for ex, n in zip(plan.examples, plan.n_per_prompt, strict=True):
                    todo.append(_Pending(self._next_gid, ex, n, step))
                    self._next_gid += 1
            weights = weights or self._publish(step)
            loads = [0] * len(self._workers)
            for c in self._inflight.values():
                loads[c.worker] += len(c.gids)
            w = loads.index(min(loads))
            call = _Call(
                gids=[p.gid for p in todo],
                examples=[p.example for p in todo],
                n_per_prompt=[p.n for p in todo],
                dispatch_step=min(p.dispatch_step for p in todo),  # when its prompts were planned
                version=step,
                params=params,
                worker=w,
                incarnation=self._incarnation[w],
            )
            ref = self._workers[w].generate.remote([weights], step, call.examples, call.n_per_prompt, params)
            self._inflight[ref] = call

    # ------------------------------------------------------------------------------ arrivals
    def _receive(self, block: bool) -> None:
        """Move finished calls into the buffer (rewards submitted on arrival); ``block``: wait for one."""
        ray = self._ray
        refs = list(self._inflight)
        if not refs:
            return
        done, _ = ray.wait(refs, num_returns=1, timeout=None if block else 0)
        if done:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in done:
            call = self._inflight.pop(ref)
            try:
                out = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                self._restart(call, e)
                continue
            except ray.exceptions.RayTaskError as e:
                raise GenerationWorkerError(
                    f"generation worker {call.worker} raised while generating {len(call.gids)} groups with "
                    f"policy version {call.version}; the run stops. The worker's traceback:\n{e}"
                ) from None
            self._busy.append(out["end"] - out["start"])
            self._t_first = min(self._t_first or out["start"], out["start"])
            self._arrived(call, out["episodes"])

    def _arrived(self, call: _Call, episodes: Episodes) -> None:
        if episodes.rewards is not None:  # the environment scored its own episodes
            handle: RewardHandle = _Ready(ScoredBatch(rewards=[float(r) for r in episodes.rewards]))
        else:
            handle = self.reward_source.submit(episodes.texts, episodes.examples)
        scores = _Scores(handle)
        gids = episodes.batch.group_ids
        for j, gid in enumerate(call.gids):
            rows = (gids == j).nonzero().flatten()
            if not len(rows):  # a prompt with 0 completions
                continue
            self._buffer.append(
                _Group(
                    gid,
                    call.examples[j],
                    call.n_per_prompt[j],
                    call.dispatch_step,
                    call.version,
                    episodes.select(rows),
                    scores,
                    rows.tolist(),
                )
            )

    def _take(self, step: int, need: int) -> list[_Group]:
        """Up to ``need`` ready groups within the bound, oldest version first; older ones are dropped
        and generated again."""
        self._buffer.sort(key=lambda g: (g.version, g.gid))
        out, keep = [], []
        for g in self._buffer:
            if step - g.version > self.max_staleness:
                self._redo.append(_Pending(g.gid, g.example, g.n, g.dispatch_step))
                self._stats["stale_regenerated"] += 1
                self.stale_regenerated_total += 1
            elif len(out) < need:
                out.append(g)
            else:
                keep.append(g)
        self._buffer = keep
        return out

    # ------------------------------------------------------------------------------ a step
    def collect(self, step: int, params: SamplingParams) -> tuple[Episodes, RewardHandle, int]:
        """The step's ``prompts_per_step`` groups (fewer when the group filter hits its round cap), each
        generated by a policy at most ``max_staleness`` versions behind ``step``; rewards known."""
        self.start()
        t0 = self._t_collect = time.time()
        self._stats = {"stale_regenerated": 0.0}
        filt = self.group_filter
        need, kept, rounds, last = self.prompts_per_step, [], 0, []
        self._taken = 0
        if filt is not None:
            filt.start_step(step, need)
        while need > 0:
            self._top_up(step, params)
            self._receive(block=False)
            take = self._take(step, need)
            if not take:
                self._receive(block=True)
                continue
            if filt is None:
                kept += take
                need -= len(take)
                self._taken = len(kept)
                continue
            rounds += 1
            last = take
            part = Episodes.concat([g.episodes for g in take])
            raw = torch.tensor([r for g in take for r in self._rewards(g)], dtype=torch.float32)
            outcomes = self.outcomes(part, raw)
            self.sampler.observe_round(outcomes, step)
            filt.start_round(PromptPlan([g.example for g in take], [len(g.rows) for g in take]))
            decisions = filt.decide(outcomes, need)
            for g, d in zip(take, decisions, strict=True):
                if d.keep:
                    kept.append(g)
                    need -= 1
            self._taken = len(kept)
            if rounds >= filt.max_rounds:
                break
        if not kept:  # the group filter kept nothing: train on the last round (zero advantages)
            self.warn(
                "no_groups_kept",
                "the group filter kept no group in any round; training on the last round",
                step=step,
                force=True,
            )
            kept = last
        self._top_up(step, params)  # refill at once: the workers generate while the trainer trains
        episodes = Episodes.concat([g.episodes for g in kept])
        scored = self._merge_scores(kept)
        self._step_stats(step, kept, wait=time.time() - t0)
        self.history.append((step, [g.gid for g in kept]))
        self._t_return = time.time()
        return episodes, _Ready(scored), max(rounds, 1)

    def _rewards(self, g: _Group) -> list[float]:
        res = g.scores.result()
        return [res.rewards[i] for i in g.rows]

    def _merge_scores(self, groups: list[_Group]) -> ScoredBatch:
        parts = [g.scores.result() for g in groups]
        common = set.intersection(*(set(p.components) for p in parts)) if parts else set()
        timeouts = errors = 0
        failures: dict[str, str] = {}
        for g, p in zip(groups, parts, strict=True):
            if not g.scores.counted:  # a call's failure counts go to the first step using it
                g.scores.counted = True
                timeouts, errors = timeouts + p.timeouts, errors + p.errors
                failures.update(p.failures)
        return ScoredBatch(
            rewards=[r for g in groups for r in self._rewards(g)],
            timeouts=timeouts,
            errors=errors,
            components={
                k: [p.components[k][i] for g, p in zip(groups, parts, strict=True) for i in g.rows]
                for k in sorted(common)
            },
            failures=failures,
        )

    def _step_stats(self, step: int, groups: list[_Group], *, wait: float) -> None:
        lag = [step - g.version for g in groups]
        s = self._stats
        s["staleness_max"] = float(max(lag))
        s["staleness_mean"] = float(sum(lag) / len(lag))
        for k in range(self.max_staleness + 1):
            s[f"staleness_hist_{k}"] = float(sum(x == k for x in lag))
        s["queue_depth"] = float(len(self._buffer))
        s["in_flight"] = float(sum(len(c.gids) for c in self._inflight.values()))
        s["policy_version"] = float(step)
        s["time_wait_groups"] = wait
        s["stale_regenerated_total"] = float(self.stale_regenerated_total)
        s["worker_restarts"] = float(sum(self.restarts))

    def metrics(self) -> dict[str, float]:
        """The latest step's numbers: ``staleness_max`` / ``staleness_mean`` / ``staleness_hist_k``
        (groups of each lag k = step − version), ``stale_regenerated`` (groups dropped as too stale and
        generated again; ``_total`` since the start), ``queue_depth`` (generated groups waiting after the
        step took its own), ``in_flight`` (groups being generated), ``time_wait_groups`` (seconds the
        trainer waited for groups), ``trainer_util`` (busy share of the step: 1 − wait / (wait + the
        step's compute so far)), ``generator_util`` (the workers' busy share since the first dispatch,
        cumulative), ``worker_restarts``."""
        now = time.time()
        s = dict(self._stats)
        busy = now - self._t_return
        s["trainer_util"] = busy / max(busy + s.get("time_wait_groups", 0.0), 1e-9)
        span = now - (self._t_first or now)
        s["generator_util"] = min(sum(self._busy) / max(span * len(self._workers or [0]), 1e-9), 1.0)
        return s

    # ------------------------------------------------------------------------------ checkpoint
    def pending(self) -> list[_Pending]:
        """Every group dispatched (or to be) and not consumed, by global id."""
        out = list(self._redo)
        for c in self._inflight.values():
            out += [
                _Pending(*x, c.dispatch_step) for x in zip(c.gids, c.examples, c.n_per_prompt, strict=True)
            ]
        out += [_Pending(g.gid, g.example, g.n, g.dispatch_step) for g in self._buffer]
        return sorted(out, key=lambda p: p.gid)

    def state_dict(self) -> dict[str, Any]:
        """JSON: the next group id and the unconsumed groups as [gid, prompt index, n, dispatch step]."""
        rows = []
        for p in self.pending():
            i = self._index.get(id(p.example))
            if i is None:
                raise InvalidValueError(
                    f"asynchronous rollout: group {p.gid}'s example is not in the training split (the "
                    "sampler returned another object), so the checkpoint cannot name it"
                )
            rows.append([p.gid, i, p.n, p.dispatch_step])
        return {
            "next_gid": self._next_gid,
            "pending": rows,
            "stale_regenerated_total": self.stale_regenerated_total,
            "restarts": list(self.restarts),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the unconsumed groups of the checkpoint are generated first (with the resumed
        policy), then new prompts from the sampler (whose own state was restored)."""
        self._next_gid = int(state["next_gid"])
        self._redo = deque(_Pending(g, self.examples[i], n, d) for g, i, n, d in state["pending"])
        self.stale_regenerated_total = int(state.get("stale_regenerated_total", 0))


# ------------------------------------------------------------------------------ importance weights
class BehaviourWeights:
    """Asynchronous rollout's off-policy correction: on fresh rows the truncated importance weight of
    ``rollout.staleness_is`` (:func:`~posttrain.algos.importance.truncated_is_weights`), e.g.
    ``w_t = min(exp(log π_old_t − log μ_t), C)`` with μ the behaviour log-probs the group carries
    (``RolloutBatch.logprobs``) and π_old the trainer's policy at the start of the step; replayed rows
    1. Detached; the policy loss multiplies it into every term (``is_weights``)."""

    def __init__(self, mode: str, cap: float, floor: float | None) -> None:
        self.mode, self.cap, self.floor = mode, cap, floor

    def __call__(self, rows, logp, old_logp, mask, episodes, batch):
        if batch.logprobs is None:
            raise InvalidValueError(
                "rollout.max_staleness > 0: the episodes carry no behaviour log-probs (RolloutBatch.logprobs "
                "is None); use an engine that records them"
            )
        w = truncated_is_weights(
            old_logp, batch.logprobs[rows], mask, mode=self.mode, cap=self.cap, floor=self.floor
        )
        return torch.where(episodes.replayed.to(logp.device)[rows][:, None], torch.ones_like(w), w)
