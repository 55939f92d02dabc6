"""Asynchronous rollout with a staleness bound (``rollout.max_staleness`` = η > 0; docs/async.md).

The trainer's loop and its collector do not change: :class:`WorkerSource` is the
:class:`~posttrain.train.collector.GroupSource` the collector draws groups from instead of the local
runner, so the sampler, the group filter's rounds, scoring and the five phases of
:mod:`posttrain.train.rl` run as they do synchronously. What differs is where the groups come from:

* **Generation workers** (:class:`GenerationWorker`) are Ray actors, each with a copy of the policy
  and the run's :class:`~posttrain.rollout.RolloutSpec` (engine, runner, formatter, precision), built
  there with ``spec.build``. The trainer's weights reach them by version through Ray's object store
  (:class:`~posttrain.train.weight_sync.ObjectStoreWeights`: one ``ray.put`` per policy version, the
  trainer's step counter, published once per step), which every worker ``ray.get``\\s once when it
  first generates with that version (with LoRA only the adapter's parameters travel).
* **Dispatch** (at the trainer's step s, inside ``collect``): the sampler plans prompts
  (``sampler.plan(s, ...)``: curricula and samplers choose at dispatch time, with the policy of
  version s) and the collector sends them to the least-loaded worker, tagged with version s and the
  temperature of step s; every group (one prompt's ``n`` completions) gets a global id. The
  source admits groups by :class:`~posttrain.train.staleness.StalenessBound` (AReaL's rule,
  arXiv:2505.24298 §5.1: at most ``(η + s + 1) · B`` groups accepted or running at version s, B =
  ``ceil(prompts_per_step · oversample)``), so the workers generate ahead while the trainer trains,
  but not further ahead than the bound lets the trainer use.
* **Consumption**: the trainer at version s takes ready groups oldest version first; a group of
  version v is used only if ``s − v ≤ η``. An older one is dropped and its prompt generated again with
  the current policy (``stale_regenerated``: no prompt is lost, none is trained on twice). Rewards
  are scored by the collector's scorer as each batch of groups arrives; the group filter (DAPO
  dynamic sampling) decides on each draw of ``ceil(need · oversample)`` groups exactly as on a
  synchronous round.
* **Off-policy correction**: each group carries its behaviour log-probs μ (the engine's sampling
  log-probs under version v); :class:`~posttrain.train.correction.BehaviourWeights` multiplies each
  fresh token's loss by the truncated importance weight ``min(π_old / μ, C)``
  (``rollout.staleness_is``: verl's truncated IS; the masked modes follow AReaL), π_old the trainer's
  policy at the start of the step, while the objective's ratio π_θ / π_old and clip act as they do
  synchronously (decoupled PPO, AReaL arXiv:2505.24298 Eq. 5).
* **Safety**: a worker whose process dies is replaced (``rollout.generators.max_restarts``, default
  once) and its unfinished groups generated again; an exception inside a worker stops the run with
  the worker's traceback (:class:`GenerationWorkerError`). The checkpoint holds the next group id and
  every dispatched-but-untrained group, also one that arrived and waits in the buffer (prompt index,
  completions, dispatch step) and the bound's counters: ``--resume`` generates exactly those again
  first, so no prompt is lost and none is used twice (a synchronous resume of such a checkpoint is
  refused). Workers start at the first draw (inside the run, so while the run folder's lock is held),
  are owned by the trainer's process (non-detached actors: Ray ends them with it) and are killed by
  :meth:`WorkerSource.close`, which the run loop calls before it releases the lock. A local Ray is
  started without its dashboard, bound to loopback, and shut down on every exit path.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.hooks import PromptPlan
from posttrain.models.precision import precision_autocast
from posttrain.rollout import Episodes, RewardHandle, RolloutSpec, SamplingParams, ScoredBatch
from posttrain.rollout.reward_source import _Ready
from posttrain.train.collector import Planner, Scorer, merge_scored
from posttrain.train.staleness import StalenessBound
from posttrain.train.weight_sync import ObjectStoreWeights
from posttrain.utils.errors import (
    InvalidValueError,
    MissingPackageError,
    PosttrainRuntimeError,
    PosttrainWarning,
)

#: Environment variable a generation worker sets to its index (scripted test runners read it).
WORKER_ENV = "POSTTRAIN_GEN_WORKER"


class GenerationWorkerError(PosttrainRuntimeError):
    """A generation worker raised an exception, or died more often than
    ``rollout.generators.max_restarts`` allows: the run stops with the worker's traceback."""


class WorkerRestartWarning(PosttrainWarning, RuntimeWarning):
    """A generation worker died and was replaced."""


class WorkerDied(Exception):
    """A pool's call failed because its worker's process died (the pool replaces it)."""


class WorkerFailed(Exception):
    """A pool's call raised inside its worker (a bug: the run stops with the traceback)."""


def require_ray() -> Any:
    """The ``ray`` module, or an error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise MissingPackageError(
            "rollout.max_staleness > 0 runs the generation workers on Ray, which is not installed: "
            "pip install -e '.[ray]' (or set rollout.max_staleness=0)"
        ) from None
    return ray


# -------------------------------------------------------------------------------- the worker (actor)
class GenerationWorker:
    """One generation worker; the pool runs it as a Ray actor (``ray.remote(GenerationWorker)``).

    Holds a copy of the policy (``model``, moved to ``device``), builds its rollout from ``spec``
    (engine seed ``seed``) and generates with the weights of the version it is asked for, loading them
    from the object store only when the version changes."""

    def __init__(
        self, index: int, model: Any, tokenizer: Any, spec: RolloutSpec, seed: int, device: str, threads: int
    ) -> None:
        os.environ[WORKER_ENV] = str(index)
        torch.set_num_threads(threads)
        self.index, self.device, self.precision = index, torch.device(device), spec.precision
        self.model = model.to(self.device)
        self.version = -1
        self.rollout = spec.build(self.model, tokenizer, seed=seed)

    def generate(
        self,
        weights: list[Any],
        version: int,
        examples: list[Any],
        n_per_prompt: list[int],
        params: SamplingParams,
    ) -> dict[str, Any]:
        """Episodes of ``examples`` under policy ``version`` (``weights[0]``: the object-store reference
        of its weights, in a list so that Ray hands over the reference, not the tensors) and the
        wall-clock interval the worker was busy."""
        start = time.time()
        if version != self.version:
            state = weights[0]
            if not isinstance(state, dict):  # an object-store reference (an in-process pool hands the dict)
                state = require_ray().get(state)
            self.load(state)
            self.version = version
        with precision_autocast(self.device, self.precision):
            episodes = self.rollout.runner.run(examples, n_per_prompt, params)
        return {"episodes": episodes, "version": version, "start": start, "end": time.time()}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Copy ``state`` (every weight, or the trainable ones only) into the worker's model in place, so
        the engine, which holds the same module, samples from them."""
        params = dict(self.model.named_parameters())
        buffers = dict(self.model.named_buffers())
        with torch.no_grad():
            for k, v in state.items():
                target = params.get(k, buffers.get(k))
                if target is None:
                    raise InvalidValueError(f"generation worker {self.index}: weight {k!r} is not in its model")
                target.copy_(v.to(target.device, target.dtype))
        if not self.rollout.engine.shares_model:  # an engine with its own copy (vLLM) reloads it
            self.rollout.engine.sync_weights(self.model)

    def pid(self) -> int:
        return os.getpid()


# -------------------------------------------------------------------------------- the worker pool
class RayPool:
    """Generation workers as Ray actors (one per ``rollout.generators.num``): ``submit`` a call to a
    worker, ``wait`` for finished calls, ``result`` of one (raising :class:`WorkerDied` or
    :class:`WorkerFailed`), ``restart`` a dead worker, ``close``. A local Ray is started when none runs
    (no dashboard, bound to loopback) and shut down by :meth:`close`."""

    def __init__(self, gen: Any, make_args: Any) -> None:
        self.gen, self.make_args = gen, make_args
        self.ray: Any = None
        self.owns_ray = False
        self.workers: list[Any] = []
        self.incarnation = [0] * gen.num

    def start(self, model: Any) -> None:
        ray = self.ray = require_ray()
        with _quiet_ray(), _keep_sigterm():
            self._start(ray, model)

    def _start(self, ray: Any, model: Any) -> None:
        if not ray.is_initialized():
            g = self.gen
            if g.ray_address is None:  # a local Ray; its workers import what this process imports
                path = os.pathsep.join(p for p in sys.path if p)
                ray.init(
                    num_cpus=g.num_cpus or g.num * g.threads,
                    include_dashboard=False,
                    _node_ip_address="127.0.0.1",
                    log_to_driver=sys.stderr.isatty(),
                    configure_logging=False,
                    runtime_env={"env_vars": {"PYTHONPATH": path}},
                )
            else:
                ray.init(address=g.ray_address)
            self.owns_ray = True
        self.model_ref = ray.put(model)
        self.workers = [self._new(i) for i in range(self.gen.num)]

    def put(self, obj: Any) -> Any:
        return self.ray.put(obj)

    def _new(self, i: int) -> Any:
        g = self.gen
        actor = self.ray.remote(GenerationWorker).options(num_cpus=g.threads, num_gpus=g.num_gpus, max_restarts=0)
        with _quiet_ray():
            return actor.remote(*self.make_args(i, self.incarnation[i], self.model_ref))

    def submit(self, worker: int, *args: Any) -> Any:
        return self.workers[worker].generate.remote(*args)

    def wait(self, refs: list[Any], block: bool) -> list[Any]:
        done, _ = self.ray.wait(refs, num_returns=1, timeout=None if block else 0)
        if done:
            done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        return done

    def result(self, ref: Any) -> dict[str, Any]:
        ray = self.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as e:
            raise WorkerDied(str(e)) from None
        except ray.exceptions.RayTaskError as e:
            raise WorkerFailed(str(e)) from None

    def restart(self, worker: int) -> None:
        with contextlib.suppress(Exception):  # already gone
            self.ray.kill(self.workers[worker], no_restart=True)
        self.incarnation[worker] += 1
        self.workers[worker] = self._new(worker)

    def close(self) -> None:
        if self.ray is None:
            return
        for actor in self.workers:
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)
        self.workers = []
        self.model_ref = None
        if self.owns_ray:
            self.ray.shutdown()
        self.ray, self.owns_ray = None, False


@contextlib.contextmanager
def _keep_sigterm() -> Any:
    """``ray.init`` replaces the SIGTERM handler (its driver's calls ``sys.exit``, its C++ core's dumps a
    stack and aborts): the run's own handler (the CLI's: SIGTERM as Ctrl-C, with where it stopped and
    how to resume) is put back once Ray has started."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _quiet_ray() -> Any:
    """Ray's FutureWarning "Tip: In future versions of Ray ..." about accelerator environment variables,
    printed at every start and actor creation, says nothing about the run: not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Tip: In future versions of Ray", category=FutureWarning)
        yield


# ------------------------------------------------------------------------------ the source's parts
@dataclass
class _Call:
    """One generate call in flight: its groups (global ids, examples, completions each), the step and
    policy version it was dispatched at, and the worker (and that worker's incarnation) running it."""

    gids: list[int]
    examples: list[Any]
    n_per_prompt: list[int]
    dispatch_step: int
    version: int
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
    """One generated group: one prompt's completions (``episodes``), the policy version that generated
    them and where its rewards are (``scores``, ``rows`` of its call)."""

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
    """A group to dispatch again (stale, its worker died, or untrained at the last checkpoint)."""

    gid: int
    example: Any
    n: int
    dispatch_step: int


class WorkerSource:
    """Groups from generation workers within the staleness bound (module docstring): the
    :class:`~posttrain.train.collector.GroupSource` of asynchronous rollout.

    ``pool`` runs the workers (:class:`RayPool`; tests pass an in-process one), ``weights`` is the
    run's :class:`~posttrain.train.weight_sync.ObjectStoreWeights` (the trainer publishes a version per
    step), ``bound`` the :class:`~posttrain.train.staleness.StalenessBound`, ``examples`` the training
    split (a checkpoint names untrained prompts by their index in it), ``prompts_per_call`` the groups
    per generate call. ``history`` holds (step, group ids) of every draw and ``versions`` the policy
    version of every group drawn, for tests and analyses."""

    supports_replay = False

    def __init__(
        self,
        *,
        pool: Any,
        model: Any,
        weights: ObjectStoreWeights,
        bound: StalenessBound,
        examples: list[Any],
        prompts_per_call: int,
        num_workers: int,
        max_restarts: int,
        metrics_runner: Callable[[], Any] | None = None,
    ) -> None:
        self.pool, self.model, self.weights, self.bound = pool, model, weights, bound
        self._make_metrics_runner, self._metrics_runner = metrics_runner, None
        self.examples = examples
        self._index = {id(ex): i for i, ex in enumerate(examples)}
        self.prompts_per_call, self.num_workers, self.max_restarts = prompts_per_call, num_workers, max_restarts
        self.started = False
        self.restarts = [0] * num_workers
        self._inflight: dict[Any, _Call] = {}
        self._buffer: list[_Group] = []
        self._redo: deque[_Pending] = deque()
        self._next_gid = 0
        self._score: Scorer | None = None
        self._drawn = 0
        self.history: list[tuple[int, list[int]]] = []
        self.versions: dict[int, int] = {}
        self._stats: dict[str, float] = {}
        self._stats_step = -1
        self._lags: list[int] = []
        self._busy: list[float] = []
        self._t_first: float | None = None
        self._t_return = 0.0

    # ------------------------------------------------------------------------------- workers
    def put(self, obj: Any) -> Any:
        """``obj`` in the pool's object store (the workers started first: a local Ray starts with them)."""
        self.start()
        return self.pool.put(obj)

    def start(self) -> None:
        """Start the workers (and a local Ray); called by the first draw or weight publication."""
        if self.started:
            return
        model = copy.deepcopy(self.model).to("cpu")
        self.pool.start(model)
        del model
        self.started = True

    def _restart(self, call: _Call, err: BaseException) -> None:
        """The worker of ``call`` died: replace it (once per death) and generate its groups again."""
        w = call.worker
        if call.incarnation == self.pool.incarnation[w]:  # first failed call of this death
            self.restarts[w] += 1
            if self.restarts[w] > self.max_restarts:
                raise GenerationWorkerError(
                    f"generation worker {w} died {self.restarts[w]} times (rollout.generators.max_restarts="
                    f"{self.max_restarts}); the run stops. Last error:\n{err}"
                ) from None
            warnings.warn(
                f"generation worker {w} died ({type(err).__name__}); restarting it "
                f"({self.restarts[w]} of rollout.generators.max_restarts={self.max_restarts}); its "
                f"{len(call.gids)} unfinished groups are generated again",
                WorkerRestartWarning,
                stacklevel=2,
            )
            self.pool.restart(w)
        self._requeue(call)

    def _requeue(self, call: _Call) -> None:
        for gid, ex, n in zip(call.gids, call.examples, call.n_per_prompt, strict=True):
            self._redo.append(_Pending(gid, ex, n, call.dispatch_step))

    def close(self) -> None:
        """Kill the workers (their unfinished groups stay pending); shut Ray down when the pool started it."""
        if not self.started:
            return
        for call in self._inflight.values():
            self._requeue(call)
        self._inflight = {}
        self.pool.close()
        self.weights.close()
        self.started = False

    # ------------------------------------------------------------------------------ dispatch
    def _top_up(self, step: int, params: SamplingParams, plan: Planner) -> None:
        """Dispatch groups to generate again first, then new prompts from ``plan`` (the sampler, at step
        ``step``) while the bound admits them."""
        version, ref = self.weights.latest()
        while True:
            if self._redo:
                todo = [self._redo.popleft() for _ in range(min(self.prompts_per_call, len(self._redo)))]
            else:
                room = self.bound.room(step)
                if room <= 0:
                    return
                p, _ = plan(min(self.prompts_per_call, room))
                todo = []
                for ex, n in zip(p.examples, p.n_per_prompt, strict=True):
                    todo.append(_Pending(self._next_gid, ex, n, step))
                    self._next_gid += 1
                if not todo:
                    return
                self.bound.on_submitted(len(todo))
            loads = [0] * self.num_workers
            for c in self._inflight.values():
                loads[c.worker] += len(c.gids)
            w = loads.index(min(loads))
            call = _Call(
                gids=[t.gid for t in todo],
                examples=[t.example for t in todo],
                n_per_prompt=[t.n for t in todo],
                dispatch_step=min(t.dispatch_step for t in todo),  # when its prompts were planned
                version=version,
                worker=w,
                incarnation=self.pool.incarnation[w],
            )
            ref_call = self.pool.submit(w, [ref], version, call.examples, call.n_per_prompt, params)
            self._inflight[ref_call] = call

    # ------------------------------------------------------------------------------ arrivals
    def _receive(self, block: bool) -> None:
        """Move finished calls into the buffer (rewards submitted on arrival); ``block``: wait for one."""
        refs = list(self._inflight)
        if not refs:
            return
        for ref in self.pool.wait(refs, block):
            call = self._inflight.pop(ref)
            try:
                out = self.pool.result(ref)
            except WorkerDied as e:
                self._restart(call, e)
                continue
            except WorkerFailed as e:
                raise GenerationWorkerError(
                    f"generation worker {call.worker} raised while generating {len(call.gids)} groups with "
                    f"policy version {call.version}; the run stops. The worker's traceback:\n{e}"
                ) from None
            self._busy.append(out["end"] - out["start"])
            self._t_first = min(self._t_first or out["start"], out["start"])
            self._arrived(call, out["episodes"])

    def _arrived(self, call: _Call, episodes: Episodes) -> None:
        assert self._score is not None
        scores = _Scores(self._score(episodes))
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
        """Up to ``need`` ready groups within the bound, oldest version first; older ones go back to be
        generated again (under their ids)."""
        self._buffer.sort(key=lambda g: (g.version, g.gid))
        out, keep = [], []
        for g in self._buffer:
            if not self.bound.usable(step, g.version):
                self._redo.append(_Pending(g.gid, g.example, g.n, g.dispatch_step))
                self.bound.on_stale()
                self._stats["stale_regenerated"] += 1
            elif len(out) < need:
                out.append(g)
            else:
                keep.append(g)
        self._buffer = keep
        return out

    # ------------------------------------------------------------------------------ a draw
    def draw(
        self, step: int, n: int, params: SamplingParams, plan: Planner, score: Scorer
    ) -> tuple[PromptPlan, Episodes, RewardHandle]:
        """``n`` groups, each generated by a policy at most ``max_staleness`` versions behind ``step``
        (oldest first), their rewards known."""
        self.start()
        self._score = score
        t0 = time.time()
        if self._stats_step != step:  # a step's first draw
            self._stats_step, self._lags = step, []
            self._stats = {"stale_regenerated": 0.0, "time_wait_groups": 0.0}
        taken: list[_Group] = []
        while len(taken) < n:
            self._top_up(step, params, plan)
            self._receive(block=False)
            got = self._take(step, n - len(taken))
            taken += got
            if len(taken) < n and not got:
                if not self._inflight and not self._redo:
                    break  # the sampler had no prompts left to plan
                self._receive(block=True)
        self._top_up(step, params, plan)  # refill at once: the workers generate while the trainer trains
        self._drawn = len(taken)
        episodes = Episodes.concat([g.episodes for g in taken])
        scored = merge_scored(
            [(g.scores.result(), g.rows) for g in taken], count=[self._first_use(g) for g in taken]
        )
        self.history.append((step, [g.gid for g in taken]))
        self.versions.update({g.gid: g.version for g in taken})
        self._lags += [step - g.version for g in taken]
        self._step_stats(step, wait=time.time() - t0)
        self._t_return = time.time()
        return PromptPlan([g.example for g in taken], [len(g.rows) for g in taken]), episodes, _Ready(scored)

    @staticmethod
    def _first_use(g: _Group) -> bool:
        """True for the first consumed group of its call: the call's failure counts go to that step."""
        if g.scores.counted:
            return False
        g.scores.counted = True
        return True

    def step_metrics(self, episodes: Episodes) -> dict[str, float]:
        """The episode runner's own numbers about the trained episodes (tool calls, multi-agent
        metrics), computed from the rows' ``row_stats`` by the runner ``metrics_runner()`` builds in
        this process (it never generates: the workers do)."""
        if self._make_metrics_runner is None:
            return {}
        if self._metrics_runner is None:  # built on first use
            self._metrics_runner = self._make_metrics_runner()
        return self._metrics_runner.step_metrics(episodes)

    def kept(self, n: int) -> None:
        """The collector trained on ``n`` of the groups of the last draw; the rest were rejected."""
        self.bound.on_accepted(n)
        self.bound.on_rejected(self._drawn - n)
        self._drawn = 0

    def _step_stats(self, step: int, *, wait: float) -> None:
        lag, s = self._lags, self._stats
        s["staleness_max"] = float(max(lag)) if lag else 0.0
        s["staleness_mean"] = float(sum(lag) / len(lag)) if lag else 0.0
        for k in range(self.bound.max_staleness + 1):
            s[f"staleness_hist_{k}"] = float(sum(x == k for x in lag))
        s["queue_depth"] = float(len(self._buffer))
        s["in_flight"] = float(sum(len(c.gids) for c in self._inflight.values()))
        s["policy_version"] = float(step)
        s["time_wait_groups"] += wait
        s["stale_regenerated_total"] = float(self.bound.stale)
        s["worker_restarts"] = float(sum(self.restarts))
        s["weight_versions_sent"] = float(self.weights.sends)

    def metrics(self) -> dict[str, float]:
        """The latest step's numbers: ``staleness_max`` / ``staleness_mean`` / ``staleness_hist_k``
        (groups of each lag k = step − version), ``stale_regenerated`` (groups dropped as too stale and
        generated again; ``_total`` since the start), ``queue_depth`` (generated groups waiting after the
        step took its own), ``in_flight`` (groups being generated), ``time_wait_groups`` (seconds the
        trainer waited for groups), ``trainer_util`` (busy share of the step: 1 − wait / (wait + the
        step's compute so far)), ``generator_util`` (the workers' busy share since the first dispatch,
        cumulative), ``worker_restarts``, ``weight_versions_sent`` (policy versions published)."""
        now = time.time()
        s = dict(self._stats)
        busy = now - self._t_return
        s["trainer_util"] = busy / max(busy + s.get("time_wait_groups", 0.0), 1e-9)
        span = now - (self._t_first or now)
        s["generator_util"] = min(sum(self._busy) / max(span * self.num_workers, 1e-9), 1.0)
        return s

    # ------------------------------------------------------------------------------ checkpoint
    def pending(self) -> list[_Pending]:
        """Every group dispatched (or to be) and not trained on, by global id: waiting to be generated
        again, being generated, and generated but waiting in the buffer."""
        out = list(self._redo)
        for c in self._inflight.values():
            out += [
                _Pending(*x, c.dispatch_step) for x in zip(c.gids, c.examples, c.n_per_prompt, strict=True)
            ]
        out += [_Pending(g.gid, g.example, g.n, g.dispatch_step) for g in self._buffer]
        return sorted(out, key=lambda p: p.gid)

    def state_dict(self) -> dict[str, Any]:
        """JSON: the next group id, the untrained groups as [gid, prompt index, n, dispatch step], the
        bound's counters and the restarts."""
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
            "bound": self.bound.state_dict(),
            "stale_regenerated_total": self.bound.stale,
            "restarts": list(self.restarts),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the untrained groups of the checkpoint are generated first (with the resumed policy),
        then new prompts from the sampler (whose own state was restored)."""
        self._next_gid = int(state["next_gid"])
        self._redo = deque(_Pending(g, self.examples[i], n, d) for g, i, n, d in state["pending"])
        if "bound" in state:
            self.bound.load_state_dict(state["bound"])
        else:  # written before the bound was its own object: every pending group is running
            self.bound.stale = int(state.get("stale_regenerated_total", 0))


def worker_source(
    rollout: Any,
    spec: RolloutSpec,
    model: Any,
    tokenizer: Any,
    train_examples: list[Any],
    *,
    seed: int,
    oversample: float,
    lora: bool,
) -> tuple[WorkerSource, ObjectStoreWeights]:
    """The worker source of a run (``rollout.max_staleness`` > 0; ``rollout`` is the run's
    ``RolloutConfig``) and the weight transport the trainer publishes through: Ray actors built from
    ``spec``, the bound of ``rollout.max_staleness`` over ``ceil(prompts_per_step · oversample)`` groups
    a step; with ``lora`` only the adapter's parameters travel."""
    require_ray()
    gen = rollout.generators

    def make_args(i: int, incarnation: int, model_ref: Any) -> tuple[Any, ...]:
        # a replaced worker samples from a new stream (seed + 1 as the synchronous engine, per worker)
        worker_seed = seed + 1 + 1000 * (i + 1) + 100_003 * incarnation
        device = "cuda" if gen.num_gpus > 0 else "cpu"
        return (i, model_ref, tokenizer, spec, worker_seed, device, gen.threads)

    holder: list[WorkerSource] = []
    weights = ObjectStoreWeights(lambda obj: holder[0].put(obj), trainable_only=lora)
    source = WorkerSource(
        pool=RayPool(gen, make_args),
        model=model,
        weights=weights,
        bound=StalenessBound(rollout.max_staleness, math.ceil(rollout.prompts_per_step * oversample)),
        examples=train_examples,
        prompts_per_call=gen.prompts_per_call or math.ceil(rollout.prompts_per_step / gen.num),
        num_workers=gen.num,
        max_restarts=gen.max_restarts,
        # the runner's step metrics read the rows' row_stats; this copy over an HF engine never generates
        metrics_runner=lambda: spec.replace(engine="hf", engine_params={}).build(model, tokenizer, seed=seed).runner,
    )
    holder.append(source)
    return source, weights
