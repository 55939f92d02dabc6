"""`RewardPool`: score completions in persistent worker processes, with a per-item timeout.

Protocol (one design, documented in docs/tasks-and-rewards.md):

- Workers are started once (start method `forkserver` where available, else `spawn`: both are
  safe with torch/CUDA loaded in the parent, unlike `fork`) and reused for every batch. Each gets
  the pickled reward function and runs its optional `setup()` before it reports ready.
- A batch becomes a queue of items; a dispatcher thread in the parent sends items to idle workers
  in chunks (guided scheduling: chunk = ceil(remaining / (2 * workers)), clamped to [4, 64]), so a batch
  of 128 cheap items costs a handful of pipe messages, not 128 round trips. Workers send results
  back per chunk (or every 20 ms on long chunks).
- Per-item timeout: before each item a worker writes `(item tag, start time)` into a shared-memory
  heartbeat. The parent wakes at the earliest deadline `start + timeout_s`; if that item is still
  running, the worker is killed (SIGKILL) and replaced, the item gets reward 0 and counts as a
  timeout, and the rest of the chunk is re-queued.
- A reward that raises, or returns NaN / inf or a value that is not a number (a str such as "1.0",
  None, ...: ``NonNumericReward``, never converted), gives reward 0 and counts as an error (the worker
  keeps going); the first failure of each kind in a batch keeps its traceback (`RewardResult.failures`),
  which the trainer and `posttrain eval` print once per kind. A worker
  that dies (os._exit, segfault, OOM kill) is replaced; the item it was running gets reward 0 and
  counts as an error; the rest of its chunk is re-queued. An item caught in 3 worker deaths
  without being the one running is failed too, so every failure consumes an item and a batch always
  terminates.
- `num_workers=0` scores in the calling thread: no processes, NO timeout, exceptions still count as
  errors. For debugging only.
- Workers never re-run the parent's `__main__` (multiprocessing's spawn/forkserver would: a script
  without the `if __name__ == "__main__":` guard then started its training again in every worker and
  died with "worker 0 exited during start"). A reward or an example that refers to objects defined
  in `__main__` (a script, a notebook) is sent by value with cloudpickle instead; everything else by
  reference with pickle, as before.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import math
import multiprocessing as mp
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait as mp_wait
from typing import Any

from posttrain.rewards.base import RewardFn, score_detailed
from posttrain.tasks.base import Example
from posttrain.utils.errors import InvalidTypeError, InvalidValueError, PosttrainError, PosttrainRuntimeError

log = logging.getLogger(__name__)

OK, TIMEOUT, ERROR = "ok", "timeout", "error"
_FLUSH_S = 0.02  # a worker on a long chunk sends partial results at least this often
_MAX_CHUNK = 64
_MIN_CHUNK = 4  # the tail of guided scheduling would otherwise be many one-item round trips
_MAX_ATTEMPTS = 3  # an item requeued after this many worker deaths is failed

_LIVE_POOLS: weakref.WeakSet[RewardPool] = weakref.WeakSet()
_WORKER_NAME = "posttrain-reward-"
_STARTING = threading.local()  # .active: this thread is starting a reward worker


def dumps_for_workers(obj: Any) -> bytes:
    """`obj` pickled for a worker process that does not import the parent's `__main__`: by reference
    (pickle) unless the pickle names `__main__` (a reward or a value defined in a script or a notebook),
    then by value (cloudpickle). Raises what pickling raises (a lambda or a local class of an importable
    module, a lock, ...)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if b"__main__" in data:
        import cloudpickle

        data = cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return data


def _install_main_guard() -> None:
    """Make multiprocessing leave `__main__` alone in the processes this module starts (and in a
    forkserver it starts on the way). spawn and forkserver put the parent's main script (or `-m`
    module) in the preparation data, and the child re-runs it as `__mp_main__` before the target: a
    script without the `if __name__ == "__main__":` guard then ran its whole training again in each
    worker. The wrapper drops those keys only while this module's thread is starting a worker
    (`_STARTING.active`); every other process anyone starts is prepared exactly as before."""
    from multiprocessing import spawn

    if getattr(spawn.get_preparation_data, "_posttrain_main_guard", False):
        return
    original = spawn.get_preparation_data

    def get_preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        if getattr(_STARTING, "active", False):
            for key in ("init_main_from_path", "init_main_from_name", "main_path"):
                data.pop(key, None)
        return data

    get_preparation_data._posttrain_main_guard = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = get_preparation_data


@atexit.register
def _close_live_pools() -> None:
    """Close every pool still open when the interpreter exits. atexit runs handlers in reverse order of
    registration and this module imports multiprocessing first, so this runs BEFORE multiprocessing
    terminates its children: without it, a pool its owner never closed saw its workers killed at exit
    and kept spawning replacements ("reward worker 0 replaced: worker exited with code -15", "could not
    restart reward worker 0")."""
    for pool in list(_LIVE_POOLS):
        with contextlib.suppress(Exception):
            pool.close()


_STALL_GRACE_S = 1.0
_MAX_MESSAGES = 8  # error messages kept per batch


@dataclass
class RewardResult:
    """Scores of one batch, in input order.

    `rewards[i]` is 0.0 for an item that timed out or failed; `statuses[i]` is "ok", "timeout" or
    "error"; `components` maps a component name to per-item values (from rewards with
    `detailed()`, e.g. `weighted`; 0.0 for failed items), else None; `wall_s` is submit-to-done
    time; `messages` holds up to 8 error/timeout descriptions for logs; `failures` maps each kind of
    failure (exception type, "non-finite reward", "timeout", "worker exited ...") to the first such
    item's description with its traceback.
    """

    rewards: list[float]
    timeouts: int
    errors: int
    components: dict[str, list[float]] | None
    wall_s: float
    statuses: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)


class NonFiniteReward(PosttrainError, ValueError):
    """A reward function returned NaN or inf (scored 0 and counted as an error, never silently)."""


def failure_kind(status: str, msg: str) -> str:
    """What groups failures for "show the first of each kind": the exception type, or the reason."""
    if status == TIMEOUT:
        return "timeout"
    head = msg.split("\n", 1)[0]
    return (head.split(":", 1)[0] if ": " in head else head).split(" (item lost")[0][:80] or "error"


def _error_text(e: BaseException) -> str:
    """One line `Type: message`, then the traceback (bounded), for the failure report."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return f"{_safe_str(e)}\n{tb[-3000:]}"


class _Job:
    def __init__(self, completions: Sequence[str], examples: Sequence[Example]) -> None:
        n = len(completions)
        self.completions, self.examples = completions, examples
        self.rewards = [0.0] * n
        self.statuses = [""] * n
        self.comps: list[dict[str, float] | None] = [None] * n
        self.messages: list[str] = []
        self.failures: dict[str, str] = {}
        self.remaining = n
        self.t0 = time.perf_counter()
        self.event = threading.Event()
        self.result: RewardResult | None = None
        self.exception: BaseException | None = None
        if n == 0:
            self.finish()

    def record(
        self, pos: int, status: str, value: float, comps: dict[str, float] | None, msg: str = ""
    ) -> None:
        if self.statuses[pos]:
            return  # already recorded (a duplicate after a requeue race); first one wins
        self.statuses[pos] = status
        self.rewards[pos] = value if status == OK else 0.0
        self.comps[pos] = comps if status == OK else None
        if msg and len(self.messages) < _MAX_MESSAGES:
            self.messages.append(f"item {pos}: {msg.split(chr(10), 1)[0]}")
        if status != OK:
            self.failures.setdefault(failure_kind(status, msg), f"item {pos}: {msg or status}")
        self.remaining -= 1
        if self.remaining == 0:
            self.finish()

    def finish(self) -> None:
        names: list[str] = []
        for c in self.comps:
            for k in c or ():
                if k not in names:
                    names.append(k)
        components = {k: [(c or {}).get(k, 0.0) for c in self.comps] for k in names} if names else None
        self.result = RewardResult(
            rewards=list(self.rewards),
            timeouts=self.statuses.count(TIMEOUT),
            errors=self.statuses.count(ERROR),
            components=components,
            wall_s=time.perf_counter() - self.t0,
            statuses=list(self.statuses),
            messages=list(self.messages),
            failures=dict(self.failures),
        )
        self.event.set()

    def fail(self, exc: BaseException) -> None:
        if not self.event.is_set():
            self.exception = exc
            self.event.set()


class RewardHandle:
    """A submitted batch. `result(timeout=None)` blocks until it is scored; `done()` does not."""

    def __init__(self, job: _Job) -> None:
        self._job = job

    def done(self) -> bool:
        return self._job.event.is_set()

    def result(self, timeout: float | None = None) -> RewardResult:
        if not self._job.event.wait(timeout):
            raise TimeoutError(f"reward batch not finished after {timeout} s")
        if self._job.exception is not None:
            raise PosttrainRuntimeError(f"reward pool failed: {self._job.exception}") from self._job.exception
        assert self._job.result is not None
        return self._job.result


def _safe_str(e: BaseException) -> str:
    try:
        text = f"{type(e).__name__}: {e}"
    except Exception:
        text = type(e).__name__
    return text[:500]


def _worker_main(conn: Any, heartbeat: Any, payload: bytes, sys_path: list[str]) -> None:
    """Worker process: unpickle the reward, run `setup()`, then score chunks until told to stop.

    Messages in: a list of `(tag, completion, example)` or None (stop). Out: ("ready", pid),
    ("init_error", traceback, the one-line message of a PosttrainError or ""), or a list of
    `(tag, status, value_or_message, components)`.
    Heartbeat: `[tag of the running item or -1, monotonic time of the last change]`.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    for p in reversed(sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    heartbeat[0] = -1.0
    try:
        fn = pickle.loads(payload)
        setup = getattr(fn, "setup", None)
        if callable(setup):
            setup()
    except BaseException as e:
        # posttrain's own errors (a checker package missing, with its install command) say it all in
        # their message: the parent raises that one line; anything else keeps its traceback
        conn.send(
            ("init_error", traceback.format_exc(), _safe_str(e) if isinstance(e, PosttrainError) else "")
        )
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            items = conn.recv()
        except (EOFError, OSError):
            return
        if items is None:
            return
        heartbeat[1] = time.monotonic()
        buf: list[tuple[int, str, Any, Any]] = []
        last_flush = time.monotonic()
        for tag, completion, example in items:
            heartbeat[1] = time.monotonic()
            heartbeat[0] = float(tag)
            try:
                value, comps = score_detailed(fn, completion, example)
                if not math.isfinite(value):
                    raise NonFiniteReward(f"reward is not finite ({value}); scored 0")
                buf.append((tag, OK, value, comps))
            except (Exception, SystemExit) as e:
                buf.append((tag, ERROR, _error_text(e), None))
            now = time.monotonic()
            heartbeat[1] = now
            heartbeat[0] = -1.0
            if now - last_flush >= _FLUSH_S:
                conn.send(buf)
                buf, last_flush = [], now
        if buf:
            conn.send(buf)


class _Worker:
    def __init__(self, ctx: Any, payload: bytes, slot: int) -> None:
        self.slot = slot
        self.conn, child = ctx.Pipe(duplex=True)
        self.heartbeat = ctx.RawArray("d", 2)
        self.heartbeat[0] = -1.0
        self.proc = ctx.Process(
            target=_worker_main,
            args=(child, self.heartbeat, payload, list(sys.path)),
            daemon=True,
            name=f"{_WORKER_NAME}{slot}",
        )
        _install_main_guard()
        _STARTING.active = True
        try:
            self.proc.start()
        finally:
            _STARTING.active = False
        child.close()
        self.started_at = time.monotonic()
        self.ready = False
        self.dead = False
        self.outstanding: dict[int, None] = {}  # tags in send order
        self.sent_at = 0.0

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.dead = True


class RewardPool:
    """Score `(completions, examples)` with `reward_fn` in `num_workers` persistent processes.

    `pool.score(completions, examples) -> RewardResult` (also `pool(...)`) blocks;
    `pool.submit(...) -> RewardHandle` returns at once and scores in the background (the trainer can
    overlap rewards with other work); `handle.result()` waits. Items that exceed `timeout_s` get 0
    and count as timeouts; exceptions and crashed workers give 0 and count as errors; the pool keeps
    working. Use as a context manager or call `close()`.

    Construction starts the workers and waits (up to `start_timeout_s`) until each has loaded the
    reward and run its `setup()`; an unpicklable reward or a failing `setup()` raises here.
    """

    def __init__(
        self,
        reward_fn: RewardFn,
        *,
        num_workers: int = 2,
        timeout_s: float = 5.0,
        start_method: str | None = None,
        start_timeout_s: float = 60.0,
    ) -> None:
        if not isinstance(num_workers, int) or num_workers < 0:
            raise InvalidValueError(f"RewardPool: num_workers must be an integer >= 0, got {num_workers!r}")
        if not timeout_s > 0:
            raise InvalidValueError(f"RewardPool: timeout_s must be > 0, got {timeout_s!r}")
        self.reward_fn = reward_fn
        self.num_workers, self.timeout_s, self.start_timeout_s = (
            num_workers,
            float(timeout_s),
            start_timeout_s,
        )
        self.name = getattr(reward_fn, "name", type(reward_fn).__name__)
        self._closed = False
        self._broken: BaseException | None = None
        self._lock = threading.Lock()
        self.stats = {"timeouts": 0, "errors": 0, "restarts": 0, "items": 0}
        if num_workers == 0:
            setup = getattr(reward_fn, "setup", None)
            if callable(setup):
                setup()
            return
        try:
            self._payload = dumps_for_workers(reward_fn)
        except Exception as e:
            raise InvalidTypeError(
                f"RewardPool: reward function {self.name!r} must be picklable (an instance of a "
                f"top-level class): {e}"
            ) from e
        if start_method is None:
            start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        if start_method == "fork":
            raise InvalidValueError(
                "RewardPool: start_method 'fork' is unsafe with torch loaded; use forkserver or spawn"
            )
        self._ctx = mp.get_context(start_method)
        self._workers: list[_Worker] = [_Worker(self._ctx, self._payload, i) for i in range(num_workers)]
        self._init_failures = [0] * num_workers
        self._wait_ready()
        self._queue: collections.deque[tuple[_Job, int, int]] = collections.deque()  # (job, pos, attempts)
        self._tags: dict[int, tuple[_Job, int, int]] = {}
        self._next_tag = 0
        self._inbox: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name="posttrain-reward-pool", daemon=True)
        self._thread.start()
        _LIVE_POOLS.add(self)

    # -- public API ---------------------------------------------------------------------------
    def submit(self, completions: Sequence[str], examples: Sequence[Example]) -> RewardHandle:
        """Queue a batch for scoring and return at once."""
        if self._closed:
            raise PosttrainRuntimeError("RewardPool is closed")
        if self._broken is not None:
            raise PosttrainRuntimeError(f"RewardPool dispatcher crashed earlier: {_safe_str(self._broken)}")
        completions, examples = list(completions), list(examples)
        if len(completions) != len(examples):
            raise InvalidValueError(
                f"RewardPool: got {len(completions)} completions but {len(examples)} examples; "
                "expected one example per completion"
            )
        for i, c in enumerate(completions):
            if not isinstance(c, str):
                raise InvalidTypeError(f"RewardPool: completion {i} is {type(c).__name__}, expected str")
        job = _Job(completions, examples)
        if job.remaining == 0:
            return RewardHandle(job)
        if self.num_workers == 0:
            self._score_inline(job)
        else:
            self._inbox.put(job)
            self._wake()
        return RewardHandle(job)

    def score(self, completions: Sequence[str], examples: Sequence[Example]) -> RewardResult:
        """Score a batch and wait for the result."""
        result = self.submit(completions, examples).result()
        return result

    __call__ = score

    def close(self) -> None:
        """Stop the workers. Batches still pending fail with RuntimeError('pool closed'). A worker still
        scoring (a reward that hangs, a run stopped by Ctrl-C or SIGTERM) is killed at once; an idle
        one gets up to 2 s to leave on its own."""
        if self._closed:
            return
        self._closed = True
        if self.num_workers == 0:
            return
        self._wake()
        self._thread.join(timeout=10)
        stopped = not self._thread.is_alive()  # else the dispatcher may still touch the workers
        self._fail_all(RuntimeError("pool closed"))  # a batch submitted while the loop was exiting
        for w in self._workers:
            if stopped and w.outstanding and w.proc.is_alive():
                w.proc.kill()  # busy: it would not read the stop message before its item ends
                continue
            with contextlib.suppress(Exception):
                w.conn.send(None)
        deadline = time.monotonic() + 2.0
        for w in self._workers:
            w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(timeout=5)
            with contextlib.suppress(Exception):
                w.conn.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # plain try/except: at interpreter shutdown module globals (contextlib included) may already
        # be None, and a pool nobody closed must not print a traceback then
        try:  # noqa: SIM105
            self.close()
        except Exception:
            pass

    # -- in-process mode ----------------------------------------------------------------------
    def _score_inline(self, job: _Job) -> None:
        for pos, (c, ex) in enumerate(zip(job.completions, job.examples, strict=True)):
            try:
                value, comps = score_detailed(self.reward_fn, c, ex)
                if not math.isfinite(value):
                    raise NonFiniteReward(f"reward is not finite ({value}); scored 0")
                self._account(OK)
                job.record(pos, OK, value, comps)
            except Exception as e:
                self._account(ERROR)
                job.record(pos, ERROR, 0.0, None, _error_text(e))

    def _account(self, status: str) -> None:
        with self._lock:
            self.stats["items"] += 1
            if status == TIMEOUT:
                self.stats["timeouts"] += 1
            elif status == ERROR:
                self.stats["errors"] += 1

    # -- worker management --------------------------------------------------------------------
    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        for w in self._workers:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not w.conn.poll(remaining):
                self._abort_start(f"worker {w.slot} did not start within {self.start_timeout_s} s")
            try:
                msg = w.conn.recv()
            except (EOFError, OSError):
                self._abort_start(f"worker {w.slot} exited during start (exit code {w.proc.exitcode})")
            if msg[0] == "init_error":
                if msg[2]:
                    self._abort_start(f"reward {self.name!r} failed to load in a worker: {msg[2]}")
                self._abort_start(f"reward {self.name!r} failed to load in a worker:\n{msg[1]}")
            w.ready = True

    def _abort_start(self, why: str) -> None:
        for w in self._workers:
            w.kill()
        self._closed = True
        raise PosttrainRuntimeError(f"RewardPool: {why}")

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _replace(self, w: _Worker) -> None:
        w.kill()
        with contextlib.suppress(Exception):
            w.conn.close()
        if self._init_failures[w.slot] >= _MAX_ATTEMPTS:
            log.error(
                "reward worker slot %d failed to start %d times; leaving it empty", w.slot, _MAX_ATTEMPTS
            )
            return
        try:
            self._workers[w.slot] = _Worker(self._ctx, self._payload, w.slot)
        except Exception as e:  # e.g. out of processes / memory: keep going with fewer workers
            self._init_failures[w.slot] += 1
            log.error("could not restart reward worker %d: %s", w.slot, e)

    def _live_workers(self) -> list[_Worker]:
        return [w for w in self._workers if not w.dead]

    # -- dispatcher thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # a bug here must not leave callers blocked forever
            log.exception("reward pool dispatcher crashed")
            self._broken = e
            self._fail_all(e)
        else:
            self._fail_all(RuntimeError("pool closed"))

    def _fail_all(self, exc: BaseException) -> None:
        jobs = {id(j): j for j, _, _ in self._queue}
        jobs.update({id(j): j for j, _, _ in self._tags.values()})
        while True:
            try:
                j = self._inbox.get_nowait()
            except queue.Empty:
                break
            jobs[id(j)] = j
        for j in jobs.values():
            j.fail(exc)

    def _loop(self) -> None:
        while not self._closed:
            while True:
                try:
                    job = self._inbox.get_nowait()
                except queue.Empty:
                    break
                self._queue.extend((job, pos, 0) for pos in range(len(job.completions)))
            if not self._live_workers():
                self._fail_queued("no reward workers could be started")
            self._dispatch()
            waitables: list[Any] = [self._wake_r]
            for w in self._live_workers():
                waitables += [w.conn, w.proc.sentinel]
            ready = mp_wait(waitables, timeout=self._next_deadline())
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError, OSError):
                    os.read(self._wake_r, 4096)
            for w in list(self._live_workers()):
                if w.conn in ready:
                    self._drain(w)
                if not w.dead and (w.proc.sentinel in ready or not w.proc.is_alive()):
                    self._on_death(w, reason=f"worker exited with code {w.proc.exitcode}")
            self._check_deadlines()

    def _fail_queued(self, why: str) -> None:
        while self._queue:
            job, pos, _ = self._queue.popleft()
            self._account(ERROR)
            job.record(pos, ERROR, 0.0, None, why)

    def _dispatch(self) -> None:
        idle = [w for w in self._live_workers() if w.ready and not w.outstanding]
        if not idle or not self._queue:
            return
        n_live = max(1, len(self._live_workers()))
        for w in idle:
            if not self._queue:
                break
            size = max(_MIN_CHUNK, min(_MAX_CHUNK, math.ceil(len(self._queue) / (2 * n_live))))
            chunk = []
            for _ in range(min(size, len(self._queue))):
                job, pos, attempts = self._queue.popleft()
                tag = self._next_tag
                self._next_tag += 1
                self._tags[tag] = (job, pos, attempts)
                w.outstanding[tag] = None
                chunk.append((tag, job.completions[pos], job.examples[pos]))
            self._send_chunk(w, chunk)

    def _send_chunk(self, w: _Worker, chunk: list[tuple[int, str, Example]]) -> None:
        w.sent_at = time.monotonic()
        try:
            data = dumps_for_workers(chunk)
        except Exception:
            # some example cannot be pickled: fail exactly those items, send the others
            good = []
            for item in chunk:
                try:
                    dumps_for_workers(item)
                    good.append(item)
                except Exception as e:
                    self._finish_tag(w, item[0], ERROR, 0.0, None, f"could not send item: {_safe_str(e)}")
            if not good:
                return
            data = dumps_for_workers(good)
        try:
            w.conn.send_bytes(data)
        except OSError as e:
            self._on_death(w, reason=f"worker unreachable: {_safe_str(e)}")

    def _finish_tag(
        self, w: _Worker, tag: int, status: str, value: float, comps: dict[str, float] | None, msg: str = ""
    ) -> None:
        w.outstanding.pop(tag, None)
        entry = self._tags.pop(tag, None)
        if entry is None:
            return
        job, pos, _ = entry
        self._account(status)
        job.record(pos, status, value, comps, msg)

    def _drain(self, w: _Worker) -> None:
        """Read every message the worker has sent."""
        try:
            while w.conn.poll():
                msg = w.conn.recv()
                if isinstance(msg, tuple):
                    if msg[0] == "ready":
                        w.ready = True
                        self._init_failures[w.slot] = 0
                    elif msg[0] == "init_error":  # counted in _on_death when the worker exits
                        log.error("reward worker %d failed to load the reward:\n%s", w.slot, msg[1])
                    continue
                for tag, status, value, comps in msg:
                    if status == OK:
                        self._finish_tag(w, tag, OK, value, comps)
                    else:
                        self._finish_tag(w, tag, ERROR, 0.0, None, value)
        except (EOFError, OSError):
            pass  # the death is handled by the sentinel check

    def _on_death(self, w: _Worker, reason: str, blame: int | None = None, blame_status: str = ERROR) -> None:
        """Collect what the worker sent, fail the item it was running, requeue the rest, replace it."""
        current = int(w.heartbeat[0])
        with self._lock:
            self.stats["restarts"] += 1  # before any item is recorded, so callers see it
        w.kill()
        self._drain(w)
        explicit = blame is not None
        if blame is None:
            blame = current
        requeue_penalty = 0
        if blame in w.outstanding:
            self._finish_tag(w, blame, blame_status, 0.0, None, reason)
        elif not explicit:
            requeue_penalty = 1  # died outside any item: every item it held gets one strike
        back = []
        for tag in list(w.outstanding):
            job, pos, attempts = self._tags[tag]
            attempts += requeue_penalty
            if attempts >= _MAX_ATTEMPTS:
                self._finish_tag(w, tag, ERROR, 0.0, None, f"{reason} (item lost {attempts} times)")
                continue
            w.outstanding.pop(tag)
            del self._tags[tag]
            back.append((job, pos, attempts))
        self._queue.extendleft(reversed(back))
        if not w.ready:
            self._init_failures[w.slot] += 1
        log.warning("reward worker %d replaced: %s", w.slot, reason)
        self._replace(w)

    def _next_deadline(self) -> float | None:
        now = time.monotonic()
        deadlines = []
        for w in self._live_workers():
            if not w.ready:
                deadlines.append(w.started_at + self.start_timeout_s)
            elif w.outstanding:
                tag, t = int(w.heartbeat[0]), w.heartbeat[1]
                if tag in w.outstanding:
                    deadlines.append(t + self.timeout_s)
                else:
                    deadlines.append(max(t, w.sent_at) + self.timeout_s + _STALL_GRACE_S)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - now) + 0.002

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for w in list(self._live_workers()):
            if not w.ready:
                if now - w.started_at > self.start_timeout_s:
                    self._on_death(w, reason=f"worker did not start within {self.start_timeout_s} s")
                continue
            if not w.outstanding:
                continue
            tag, t = int(w.heartbeat[0]), w.heartbeat[1]
            if tag in w.outstanding and now - t > self.timeout_s:
                self._on_death(
                    w, reason=f"timed out after {self.timeout_s} s", blame=tag, blame_status=TIMEOUT
                )
            elif tag not in w.outstanding and now - max(t, w.sent_at) > self.timeout_s + _STALL_GRACE_S:
                self._on_death(w, reason="worker stalled between items")
