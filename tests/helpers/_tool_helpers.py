"""Custom tools for the deadline tests (tests/tools/test_tool_deadline.py): module-level functions in an
importable module, so the tool worker process can import them by name."""

from __future__ import annotations

import os
import time


def sleepy(seconds: float, pid_file: str = "") -> str:
    """Sleep, then say so.

    Args:
        seconds: how long to sleep
        pid_file: where to write the worker's process id first
    """
    if pid_file:
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
    time.sleep(seconds)
    return f"slept {seconds}"


def failing(x: int) -> str:
    """Raise a ValueError."""
    raise ValueError(f"bad x {x}")


def where(x: int) -> dict:
    """Say which process ran the call."""
    return {"pid": os.getpid(), "x": x}


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False
