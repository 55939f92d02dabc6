"""Stopping always works (issue 55 item 4) at the level of one round of tool calls: Ctrl-C or SIGTERM
(a KeyboardInterrupt in the main thread) while ``ToolUse.run`` waits on tools that hang ends the round
at once: the calls are cancelled, their workers killed, and the executor's threads are not waited for
up to the tools' deadline (they were: ``with ThreadPoolExecutor`` joined them on the way out)."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from _tool_helpers import alive, sleepy

from posttrain.rollout.tool_use import ToolUse
from posttrain.tools.calls import ToolCall

SLACK_S = 10.0  # killing the workers and joining the threads, on a busy 2-core machine


def test_an_interrupted_round_returns_at_once_and_kills_the_hanging_tools(tmp_path):
    use = ToolUse([sleepy], chat_template=None, timeout_s=120, workers=2)
    pid_files = [tmp_path / f"pid{i}" for i in range(2)]
    calls = [[ToolCall("sleepy", {"seconds": 1000, "pid_file": str(p)}, "")] for p in pid_files]
    main = threading.main_thread().ident
    sent = {}

    def interrupt() -> None:  # SIGINT to the main thread once both calls are in their workers
        until = time.monotonic() + 60
        while not all(p.exists() and p.read_text() for p in pid_files) and time.monotonic() < until:
            time.sleep(0.05)
        sent["at"] = time.monotonic()
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        use.run(calls, [0, 0])
    waited = time.monotonic() - sent["at"]
    assert waited < SLACK_S, f"the interrupted round waited {waited:.1f} s for its tools"
    pids = [int(p.read_text()) for p in pid_files]
    until = time.monotonic() + 5
    while any(alive(pid) for pid in pids) and time.monotonic() < until:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids), "a hanging tool's worker outlived the interrupted round"
