"""Every tool call has a deadline (issue 55 item 3): a custom tool runs in a worker process that is
killed at ``timeout_s``; the call then returns an error result marked ``timed_out`` (the episode goes
on); a signal to the trainer is not held up by a hanging tool. Settings: ``timeout_s`` and ``sandbox``
for all tools of a runner, overridable per tool; ``sandbox: bwrap`` is refused where it cannot run."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings

import pytest
from _tool_helpers import alive, sleepy, where

from posttrain.tools import ToolError, ToolSettings, ToolTimeout, get_tool
from posttrain.tools import sandbox as backends_mod
from posttrain.tools.backends import GuardBackend, SandboxUnavailableError, SandboxWarning
from posttrain.tools.deadline import cancel_calls
from posttrain.tools.sandbox import get_backend
from posttrain.utils.errors import InvalidValueError

SLACK_S = 2.0  # starting a worker (forkserver) on a busy 2-core machine


def test_a_tool_that_hangs_returns_a_timeout_error_and_its_worker_is_killed(tmp_path):
    tool = get_tool(sleepy, timeout_s=1)
    pid_file = tmp_path / "pid"
    start = time.monotonic()
    res = tool.invoke({"seconds": 1000, "pid_file": str(pid_file)})
    elapsed = time.monotonic() - start
    assert res.timed_out and not res.ok
    assert res.text == "tool 'sleepy' timed out after 1 s; the call was cut and gave no result"
    assert 1.0 <= elapsed < 1.0 + SLACK_S, elapsed
    worker = int(pid_file.read_text())
    assert worker != os.getpid() and not alive(worker)
    with pytest.raises(ToolTimeout, match="timed out after 1 s"):
        tool.call({"seconds": 1000})
    # the next call gets a fresh worker and runs normally
    assert tool.invoke({"seconds": 0}) == type(res)("slept 0.0", True)


def test_a_custom_tool_runs_in_a_worker_process_and_its_errors_come_back():
    out = get_tool(where).call({"x": 3})
    assert '"x": 3' in out and f'"pid": {os.getpid()}' not in out
    from _tool_helpers import failing

    res = get_tool(failing).invoke({"x": 2})
    assert not res.ok and not res.timed_out
    assert res.text == "tool 'failing' raised ValueError: bad x 2"


def test_a_closure_runs_in_a_thread_and_still_returns_at_the_deadline():
    release = threading.Event()

    def stuck(x: int) -> str:
        """Wait until released."""
        release.wait(30)
        return "released"

    try:
        start = time.monotonic()
        res = get_tool(stuck, timeout_s=0.5).invoke({"x": 1})
        assert res.timed_out and time.monotonic() - start < 0.5 + SLACK_S
    finally:
        release.set()


def test_the_python_tool_counts_its_time_limit_as_a_timeout():
    tool = get_tool({"name": "python", "timeout_s": 1, "sandbox": "guard"})
    assert tool.settings == ToolSettings(timeout_s=1, sandbox="guard")
    res = tool.invoke({"code": "print('started', flush=True)\nwhile True: pass"})
    assert res.timed_out and not res.ok
    assert res.text.startswith("tool 'python' timed out after 1 s") and "started" in res.text
    assert get_tool("python", timeout_s=2).invoke({"code": "print(6 * 7)"}).text.strip() == "42"


def test_settings_per_runner_and_per_tool():
    t = get_tool({"name": "calculator", "timeout_s": 3}, timeout_s=20, sandbox="guard")
    assert t.settings == ToolSettings(timeout_s=3, sandbox="guard")
    assert get_tool("calculator").settings == ToolSettings()
    assert "settings" not in get_tool("python").schema["function"]["parameters"]["properties"]
    with pytest.raises(ToolError, match=r"needs 'name' and takes only \['name', 'timeout_s', 'sandbox'\]"):
        get_tool({"name": "python", "timeout": 3})
    with pytest.raises(InvalidValueError, match="timeout_s must be a number of seconds > 0, got 0"):
        get_tool("calculator", timeout_s=0)
    with pytest.raises(
        InvalidValueError, match=r"sandbox must be one of \['auto', 'bwrap', 'guard'\], got 'docker'"
    ):
        get_tool("python", sandbox="docker")


@pytest.fixture
def no_bwrap(monkeypatch):
    """bwrap not on PATH (the probe's cache and the one-time warning reset around the test)."""
    monkeypatch.setenv("PATH", "/nonexistent")
    backends_mod.bwrap_problem.cache_clear()
    monkeypatch.setattr(backends_mod, "_GUARD_WARNED", threading.Event())
    yield
    backends_mod.bwrap_problem.cache_clear()


def test_requiring_bwrap_where_it_is_missing_is_refused(no_bwrap):
    with pytest.raises(SandboxUnavailableError) as err:
        get_tool("python", sandbox="bwrap")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("sandbox 'bwrap' was required but cannot run: bubblewrap (bwrap) is not on PATH")
    assert "apt-get install bubblewrap" in msg


def test_auto_falls_back_to_the_guard_and_warns_once(no_bwrap):
    with pytest.warns(SandboxWarning, match="NOT a security boundary") as rec:
        assert isinstance(get_backend("auto"), GuardBackend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert isinstance(get_backend("auto"), GuardBackend)  # no second warning
    assert len(rec) == 1
    assert get_tool("python").invoke({"code": "print(1 + 1)"}).text.strip() == "2"


def test_cancel_calls_ends_a_hanging_call_at_once():
    out = {}

    def call():
        out["res"] = get_tool(sleepy, timeout_s=60).invoke({"seconds": 1000})

    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 30  # a fresh worker starts in ~0.2 s idle, seconds on a loaded CI machine
    while cancel_calls() == 0 and time.monotonic() < deadline:  # once the call is in its worker
        time.sleep(0.05)
    t.join(15)
    assert not t.is_alive()
    assert out["res"].timed_out and "was cancelled" in out["res"].text


def test_cancel_calls_ends_a_call_waiting_on_a_thread_at_once():
    """A closure runs in a daemon thread that cannot be killed: cancel_calls stops the wait for it at
    once, so a stopping run's round of calls does not wait for the tool's deadline."""
    release = threading.Event()
    out = {}

    def stuck(x: int) -> str:
        """Wait until released."""
        release.wait(60)
        return "released"

    def call():
        out["res"] = get_tool(stuck, timeout_s=60).invoke({"x": 1})

    t = threading.Thread(target=call)
    try:
        t.start()
        deadline = time.monotonic() + 10
        while cancel_calls() == 0 and time.monotonic() < deadline:  # once the call waits on its thread
            time.sleep(0.05)
        t.join(5)
        assert not t.is_alive(), "the call still waits for its thread after cancel_calls"
        assert out["res"].timed_out and "was cancelled" in out["res"].text
    finally:
        release.set()


def test_a_hanging_tool_does_not_hold_up_a_signal():
    """SIGINT to the trainer while its main thread waits on a hanging tool: KeyboardInterrupt comes at
    once (the wait is a poll the signal interrupts), not at the deadline; the worker is killed."""
    tool = get_tool(sleepy, timeout_s=60)
    timer = threading.Timer(0.8, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            tool.call({"seconds": 1000})
    finally:
        timer.cancel()
    assert time.monotonic() - start < 0.8 + SLACK_S


@pytest.mark.parametrize("sandbox", ["guard", "auto"])
def test_cancel_calls_ends_a_running_sandbox_at_once(sandbox):
    out = {}

    def call():
        start = time.monotonic()
        out["res"] = get_tool("python", timeout_s=60, sandbox=sandbox).invoke({"code": "while True: pass"})
        out["elapsed"] = time.monotonic() - start

    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 10
    while cancel_calls() == 0 and time.monotonic() < deadline:  # once the sandbox runs
        time.sleep(0.05)
    t.join(10)
    assert not t.is_alive() and out["elapsed"] < 10
    assert not out["res"].timed_out and "[killed by signal SIGKILL]" in out["res"].text


def test_a_worker_ends_with_a_trainer_killed_by_sigkill(tmp_path):
    """kill -9 runs no atexit handler: the worker of a hanging call notices its trainer is gone and
    kills itself (with whatever the tool started) instead of sleeping on for ever."""
    import subprocess
    import sys
    from pathlib import Path

    import _tool_helpers

    pid_file = tmp_path / "pid"
    code = (
        "from _tool_helpers import sleepy; from posttrain.tools import get_tool; "
        f"get_tool(sleepy, timeout_s=600).invoke({{'seconds': 1000, 'pid_file': {str(pid_file)!r}}})"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(_tool_helpers.__file__).parent), *sys.path])}
    trainer = subprocess.Popen([sys.executable, "-c", code], env=env)
    worker = 0
    try:
        until = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < until:
            assert trainer.poll() is None, "the trainer ended before its tool call started"
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        trainer.kill()
        trainer.wait()
        until = time.monotonic() + 5
        while alive(worker) and time.monotonic() < until:
            time.sleep(0.05)
        assert not alive(worker), "the tool's worker outlived its trainer killed with SIGKILL"
    finally:
        trainer.kill()
        if worker and alive(worker):
            os.kill(worker, signal.SIGKILL)
