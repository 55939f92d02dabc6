"""A tool and a reward that hang, and an engine that calls the tool, for the stopping tests
(tests/cli/test_cli_stop.py) and the timing script (scripts/stop_times.py): importable by name, so a
``posttrain`` subprocess, its tool workers and its reward workers all load them.

Both hang only once the run is *armed*: the path in ``POSTTRAIN_HANG_AFTER`` exists (the run's first
checkpoint, so there is something to resume from; unset = armed at once). Entering the hang writes
the process id to ``POSTTRAIN_HANG_MARKER`` (the test waits for it), then sleeps forever."""

from __future__ import annotations

import os
import time
from typing import Any

from _engine_helpers import ScriptedEngine

CALL_HANG = '<tool_call>{"name": "hang", "arguments": {"x": 1}}</tool_call>'


def _maybe_hang() -> None:
    after = os.environ.get("POSTTRAIN_HANG_AFTER", "")
    if after and not os.path.exists(after):
        return
    marker = os.environ.get("POSTTRAIN_HANG_MARKER", "")
    if marker:
        with open(marker + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(marker + ".tmp", marker)
    while True:
        time.sleep(3600)


def hang(x: int) -> str:
    """Answer with x, or hang forever once the run is armed.

    Args:
        x: any number
    """
    _maybe_hang()
    return str(x)


class HangingReward:
    """Reward 1.0, or hang forever once the run is armed."""

    name = "hanging"

    def __call__(self, completion: str, example: Any) -> float:
        _maybe_hang()
        return 1.0


def calls_hang(ctx: Any) -> ScriptedEngine:
    """An engine factory (``rollout.engine.name=_hang_helpers:calls_hang``): every turn calls ``hang``
    until a tool result is in the context, then answers 1."""

    def reply(context: str) -> str:
        return "1" if "\n</tool_response>" in context else CALL_HANG

    return ScriptedEngine(ctx.tokenizer, reply, logprob=-1.0)
