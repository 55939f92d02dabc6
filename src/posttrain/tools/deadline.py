"""A deadline on a tool call: :func:`call_with_deadline` runs a tool function and gives up at ``timeout_s``.

* A tool function that can be pickled by reference (a module-level function: every registered tool and
  every ``package.module:function``) runs in a **worker process**: a fresh ``sys.executable`` that
  imports the function's module by name with the caller's ``sys.path`` (never the trainer's
  ``__main__``). Workers are reused between calls; at the deadline the worker is killed (``SIGKILL``)
  and the call raises :class:`DeadlineExceeded`, so a tool that hangs costs its deadline and one
  worker, never the run. A worker is in its own session (Ctrl-C at a terminal does not reach it: the
  trainer decides) and is killed when the trainer exits (``atexit``); a trainer that dies without
  running it (``kill -9``, a crash of the interpreter) takes its workers along: each watches its
  parent and kills its own process group within 0.5 s of losing it. A function the worker cannot
  import (defined in ``__main__`` of a script run as a file) falls back to a thread, as below.
* A function that cannot be pickled (a closure, a lambda) runs in a daemon **thread**: the call still
  returns at the deadline, but the thread cannot be killed and runs on in the background.
* ``inline`` (the built-in ``calculator`` and ``python``, which bound themselves: the calculator refuses
  big numbers before computing, the interpreter kills its sandbox at the deadline) runs in the caller.

The waiting is a poll with a timeout in the calling thread, so a signal to the trainer's main thread
is never held up by a tool call; :func:`cancel_calls` kills every busy worker (their calls raise
:class:`DeadlineExceeded` saying they were cancelled), every running sandbox (:func:`cancellable`) and
stops waiting for the calls in threads, for a trainer that is stopping (the multi-turn runner calls it
when Ctrl-C or SIGTERM interrupts a round of tool calls: ``posttrain.rollout.tool_use``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from multiprocessing.connection import Connection
from typing import Any

from posttrain.utils.errors import PosttrainError

__all__ = [
    "DeadlineExceeded",
    "ToolRaised",
    "as_text",
    "call_with_deadline",
    "cancel_calls",
    "cancellable",
    "shutdown_workers",
]

#: Idle workers kept for the next calls (more are started when calls run in parallel).
MAX_IDLE_WORKERS = 8


class DeadlineExceeded(PosttrainError, TimeoutError):
    """The call did not finish within its deadline (or was cancelled: ``cancelled``)."""

    def __init__(self, timeout_s: float, cancelled: bool = False) -> None:
        super().__init__(f"no result within {timeout_s:g} s" if not cancelled else "cancelled")
        self.timeout_s = timeout_s
        self.cancelled = cancelled


class ToolRaised(PosttrainError, RuntimeError):
    """The tool raised in its worker: ``kind`` (the exception's class name) and ``message``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


def as_text(out: Any) -> str:
    """A tool's return value as the text the model gets (non-strings as JSON)."""
    return out if isinstance(out, str) else json.dumps(out, default=str)


# A worker: a fresh interpreter running this loop (it imports nothing of posttrain, and not the
# trainer's __main__). Each message: (the caller's sys.path, the pickled function, kwargs); each
# answer: ("ok", text), ("raised", kind, message) or ("unpicklable", message).
_WORKER = r"""
import json, os, pickle, signal, sys, threading, time
from multiprocessing.connection import Connection
signal.signal(signal.SIGINT, signal.SIG_IGN)
inbox, outbox = Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False)
def orphaned(trainer=int(sys.argv[3])):
    while os.getppid() == trainer:
        time.sleep(0.5)
    os.killpg(0, signal.SIGKILL)  # the trainer is gone (kill -9 too): this worker and what the tool started
threading.Thread(target=orphaned, daemon=True).start()
while True:
    try:
        path, blob, kwargs = inbox.recv()
    except (EOFError, OSError):
        break
    sys.path[:] = path
    try:
        fn = pickle.loads(blob)
    except Exception as e:
        outbox.send(("unpicklable", "%s: %s" % (type(e).__name__, e)))
        continue
    try:
        out = fn(**kwargs)
        msg = ("ok", out if isinstance(out, str) else json.dumps(out, default=str))
    except BaseException as e:
        msg = ("raised", type(e).__name__, str(e))
    try:
        outbox.send(msg)
    except Exception as e:
        outbox.send(("raised", type(e).__name__, str(e)))
"""


class _Worker:
    def __init__(self) -> None:
        to_child, self._child_in = _pipe()
        self._child_out, from_child = _pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(to_child), str(from_child), str(os.getpid())],
            pass_fds=(to_child, from_child),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C at a terminal does not reach it; the trainer decides
        )
        os.close(to_child)
        os.close(from_child)
        self.send = Connection(self._child_in, readable=False)
        self.recv = Connection(self._child_out, writable=False)
        self.cancelled = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill_group(self) -> None:
        """SIGKILL to the worker's process group: the worker and whatever the tool started (only while
        the worker is not reaped, so its id cannot have been reused)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        self.kill_group()
        self.proc.wait()
        self.send.close()
        self.recv.close()


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    return r, w


_LOCK = threading.Lock()
_IDLE: list[_Worker] = []
_BUSY: set[_Worker] = set()


def _take() -> _Worker:
    with _LOCK:
        while _IDLE:
            w = _IDLE.pop()
            if w.alive():
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
        try:
            w.send.send((list(sys.path), pickle.dumps(fn), dict(kwargs)))
        except OSError:  # the worker is gone: cancel_calls killed it between taking it and sending
            if w.cancelled:
                raise DeadlineExceeded(timeout_s, cancelled=True) from None
            raise ToolRaised("WorkerDied", f"the tool's worker process ended (exit status {w.proc.wait()})") from None
        while True:  # short polls: a worker killed by cancel_calls is noticed at once
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(timeout_s)
            try:
                if w.recv.poll(min(left, 0.25)):
                    msg = w.recv.recv()
                    break
            except (EOFError, OSError):
                msg = None
                break
            if w.cancelled:
                raise DeadlineExceeded(timeout_s, cancelled=True)
        if msg is None:
            if w.cancelled:
                raise DeadlineExceeded(timeout_s, cancelled=True)
            raise ToolRaised("WorkerDied", f"the tool's worker process ended (exit status {w.proc.wait()})")
        healthy = True
        if msg[0] == "ok":
            return str(msg[1])
        if msg[0] == "unpicklable":
            raise _NotInWorker(str(msg[1]))
        raise ToolRaised(str(msg[1]), str(msg[2]))
    finally:
        _give_back(w, healthy)


class _NotInWorker(PosttrainError, RuntimeError):
    """The worker could not load the function (it ran nowhere): run it in a thread instead."""


_THREAD_ONLY: set[Any] = set()
_THREAD_CALLS: set[threading.Event] = set()  # one per call running in a thread: set = cancelled


def _in_thread(fn: Callable[..., Any], kwargs: Mapping[str, Any], timeout_s: float) -> str:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["out"] = as_text(fn(**kwargs))
        except BaseException as e:
            box["err"] = e

    t = threading.Thread(target=target, daemon=True, name="posttrain-tool-thread")
    cancelled = threading.Event()
    with _LOCK:
        _THREAD_CALLS.add(cancelled)
    try:
        t.start()
        deadline = time.monotonic() + timeout_s
        while t.is_alive():  # short joins: a call cancelled by cancel_calls returns at once
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(timeout_s)
            if cancelled.is_set():
                raise DeadlineExceeded(timeout_s, cancelled=True)
            t.join(min(left, 0.25))
    finally:
        with _LOCK:
            _THREAD_CALLS.discard(cancelled)
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


_SANDBOXES: set[subprocess.Popen[bytes]] = set()


@contextlib.contextmanager
def cancellable(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """While inside, :func:`cancel_calls` kills ``proc``'s process group (a sandbox run by an inline tool)."""
    with _LOCK:
        _SANDBOXES.add(proc)
    try:
        yield
    finally:
        with _LOCK:
            _SANDBOXES.discard(proc)


def cancel_calls() -> int:
    """Kill every worker that is running a call now (those calls raise :class:`DeadlineExceeded` with
    ``cancelled``), every running sandbox (its call returns at once, killed) and stop waiting for every
    call running in a thread (it raises :class:`DeadlineExceeded` with ``cancelled``; the daemon thread
    runs on, it cannot be killed); returns how many. For a trainer that is stopping."""
    with _LOCK:
        busy, boxes, threads = list(_BUSY), list(_SANDBOXES), list(_THREAD_CALLS)
    for ev in threads:
        ev.set()
    for w in busy:
        w.cancelled = True
        w.kill_group()
    for proc in boxes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    return len(busy) + len(boxes) + len(threads)


def shutdown_workers() -> None:
    """Kill the idle workers (busy ones are cancelled by :func:`cancel_calls`)."""
    with _LOCK:
        idle, _IDLE[:] = list(_IDLE), []
    for w in idle:
        w.kill()


atexit.register(lambda: (cancel_calls(), shutdown_workers()))
