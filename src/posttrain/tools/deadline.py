"""A deadline on a tool call: :func:`call_with_deadline` runs a tool function and gives up at ``timeout_s``.

* A tool function that can be pickled by reference (a module-level function: every registered tool and
  every ``package.module:function``) runs in a **worker process** (``forkserver`` where the platform has
  it, else ``spawn``). Workers are reused between calls; at the deadline the worker is killed
  (``SIGKILL``) and the call raises :class:`DeadlineExceeded`, so a tool that hangs costs its deadline
  and one worker, never the run. A worker ignores ``SIGINT`` (Ctrl-C in a terminal reaches the whole
  process group: the trainer decides) and dies with the trainer (daemon processes, killed at exit).
* A function that cannot be pickled (a closure, a lambda) runs in a daemon **thread**: the call still
  returns at the deadline, but the thread cannot be killed and runs on in the background.
* ``inline`` (the built-in ``calculator`` and ``python``, which bound themselves: the calculator refuses
  big numbers before computing, the interpreter kills its sandbox at the deadline) runs in the caller.

The waiting is a poll with a timeout in the calling thread, so a signal to the trainer's main thread
is never held up by a tool call; :func:`cancel_calls` kills every busy worker (their calls raise
:class:`DeadlineExceeded` saying they were cancelled) for a trainer that is stopping.
"""

from __future__ import annotations

import json
import multiprocessing
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "DeadlineExceeded",
    "ToolRaised",
    "as_text",
    "call_with_deadline",
    "cancel_calls",
    "shutdown_workers",
]

#: Idle workers kept for the next calls (more are started when calls run in parallel).
MAX_IDLE_WORKERS = 8


class DeadlineExceeded(Exception):
    """The call did not finish within its deadline (or was cancelled: ``cancelled``)."""

    def __init__(self, timeout_s: float, cancelled: bool = False) -> None:
        super().__init__(f"no result within {timeout_s:g} s" if not cancelled else "cancelled")
        self.timeout_s = timeout_s
        self.cancelled = cancelled


class ToolRaised(Exception):
    """The tool raised in its worker: ``kind`` (the exception's class name) and ``message``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


def as_text(out: Any) -> str:
    """A tool's return value as the text the model gets (non-strings as JSON)."""
    return out if isinstance(out, str) else json.dumps(out, default=str)


def _worker_main(conn: Any) -> None:
    """A worker's loop: receive (the caller's sys.path, the pickled function, kwargs), send ("ok",
    text), ("raised", kind, message) or ("unpicklable", message) when it cannot load the function."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            path, blob, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        sys.path[:] = path  # the caller's (a test's rootdir, a script's folder) to import the function
        try:
            fn = pickle.loads(blob)
        except Exception as e:
            conn.send(("unpicklable", f"{type(e).__name__}: {e}"))
            continue
        try:
            msg: tuple[Any, ...] = ("ok", as_text(fn(**kwargs)))
        except BaseException as e:
            msg = ("raised", type(e).__name__, str(e))
        try:
            conn.send(msg)
        except (pickle.PicklingError, TypeError) as e:
            conn.send(("raised", type(e).__name__, str(e)))


def _context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class _Worker:
    def __init__(self) -> None:
        ctx = _context()
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="posttrain-tool-worker")
        self.proc.start()
        child.close()
        self.cancelled = False

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


_LOCK = threading.Lock()
_IDLE: list[_Worker] = []
_BUSY: set[_Worker] = set()


def _take() -> _Worker:
    with _LOCK:
        while _IDLE:
            w = _IDLE.pop()
            if w.proc.is_alive():
                _BUSY.add(w)
                return w
            w.kill()
    w = _Worker()
    with _LOCK:
        _BUSY.add(w)
    return w


def _give_back(w: _Worker, healthy: bool) -> None:
    with _LOCK:
        _BUSY.discard(w)
        keep = healthy and len(_IDLE) < MAX_IDLE_WORKERS
        if keep:
            _IDLE.append(w)
    if not keep:
        w.kill()


def _in_worker(fn: Callable[..., Any], kwargs: Mapping[str, Any], timeout_s: float) -> str:
    w = _take()
    healthy = False
    try:
        deadline = time.monotonic() + timeout_s
        w.conn.send((list(sys.path), pickle.dumps(fn), dict(kwargs)))
        while True:  # short polls: a worker killed by cancel_calls is noticed at once
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(timeout_s)
            try:
                if w.conn.poll(min(left, 0.25)):
                    msg = w.conn.recv()
                    break
            except (EOFError, OSError):
                msg = None
                break
            if w.cancelled:
                raise DeadlineExceeded(timeout_s, cancelled=True)
        if msg is None:
            if w.cancelled:
                raise DeadlineExceeded(timeout_s, cancelled=True)
            w.proc.join(timeout=1)
            raise ToolRaised("WorkerDied", f"the tool's worker process ended (exit status {w.proc.exitcode})")
        healthy = True
        if msg[0] == "ok":
            return str(msg[1])
        if msg[0] == "unpicklable":
            raise _NotInWorker(str(msg[1]))
        raise ToolRaised(str(msg[1]), str(msg[2]))
    finally:
        _give_back(w, healthy)


class _NotInWorker(Exception):
    """The worker could not load the function (it ran nowhere): run it in a thread instead."""


_THREAD_ONLY: set[Any] = set()


def _in_thread(fn: Callable[..., Any], kwargs: Mapping[str, Any], timeout_s: float) -> str:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["out"] = as_text(fn(**kwargs))
        except BaseException as e:
            box["err"] = e

    t = threading.Thread(target=target, daemon=True, name="posttrain-tool-thread")
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise DeadlineExceeded(timeout_s)
    if "err" in box:
        e = box["err"]
        raise ToolRaised(type(e).__name__, str(e)) from e
    return box["out"]


def _picklable(fn: Callable[..., Any]) -> bool:
    try:
        pickle.dumps(fn)
    except Exception:
        return False
    return True


def call_with_deadline(
    fn: Callable[..., Any], kwargs: Mapping[str, Any], timeout_s: float, *, inline: bool = False
) -> str:
    """``fn(**kwargs)`` as text, within ``timeout_s`` (module docstring: worker process, thread or
    inline). Raises :class:`DeadlineExceeded` past the deadline and :class:`ToolRaised` when the tool
    raised in a worker or thread (an inline tool's exception propagates as it is)."""
    if inline:
        return as_text(fn(**kwargs))
    if fn not in _THREAD_ONLY and _picklable(fn):
        try:
            return _in_worker(fn, kwargs, timeout_s)
        except _NotInWorker:
            _THREAD_ONLY.add(fn)
    return _in_thread(fn, kwargs, timeout_s)


def cancel_calls() -> int:
    """Kill every worker that is running a call now (those calls raise :class:`DeadlineExceeded` with
    ``cancelled``); returns how many. For a trainer that is stopping."""
    with _LOCK:
        busy = list(_BUSY)
    for w in busy:
        w.cancelled = True
        if w.proc.is_alive():
            w.proc.kill()
    return len(busy)


def shutdown_workers() -> None:
    """Kill the idle workers (busy ones are cancelled by :func:`cancel_calls`)."""
    with _LOCK:
        idle, _IDLE[:] = list(_IDLE), []
    for w in idle:
        w.kill()
