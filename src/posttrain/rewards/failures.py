"""Reward failures made visible: what the RL trainer and ``posttrain eval`` do with the errors and
timeouts a reward source reports (``errors`` / ``timeouts`` / ``failures`` of a scored batch).

A failing reward scores 0, so without this a reward plug-in that raises on every call looked like a
task the model cannot solve: reward 0, a "zero-variance groups" warning, exit status 0. Now:

* the first failure of each kind (exception type, ``non-finite reward``, ``timeout``, a worker that
  died) is printed once, on stderr, with its traceback;
* each step's ``reward_errors`` / ``reward_timeouts`` are logged in ``metrics.jsonl`` (NaN and inf
  rewards count as errors: scored 0, never silently);
* when more than ``reward.max_failed_frac`` of a step's rewards failed, the run stops with
  :class:`RewardFailureError`, naming the first failure (``max_failed_frac=1`` never stops).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from posttrain.utils.errors import InvalidValueError, PosttrainError


class RewardFailureError(PosttrainError, RuntimeError):
    """Too many of a step's rewards failed; the message names the first failure."""


def _first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def failure_summary(scored: Any) -> str:
    """``"3 of 8 rewards failed (2 errors, 1 timeout)"`` or "" when none failed."""
    errors, timeouts = int(getattr(scored, "errors", 0)), int(getattr(scored, "timeouts", 0))
    if not errors + timeouts:
        return ""
    n = len(scored.rewards)
    parts = [f"{errors} error{'s' * (errors != 1)}"] * bool(errors) + [
        f"{timeouts} timeout{'s' * (timeouts != 1)}"
    ] * bool(timeouts)
    return f"{errors + timeouts} of {n} rewards failed ({', '.join(parts)}; scored 0)"


class RewardFailureMonitor:
    """Shows each new kind of reward failure once (with its traceback), counts failures, and stops a
    run when more than ``max_failed_frac`` of one batch failed."""

    def __init__(self, max_failed_frac: float = 0.5, *, stream: TextIO | None = None) -> None:
        if not 0 <= max_failed_frac <= 1:
            raise InvalidValueError(f"max_failed_frac must be in [0, 1], got {max_failed_frac}")
        self.max_failed_frac = max_failed_frac
        self.stream = stream
        self.shown: set[str] = set()
        self.errors = 0
        self.timeouts = 0

    def check(self, scored: Any, where: str) -> None:
        """Report and count the failures of one scored batch (``where``: e.g. "step 3")."""
        errors, timeouts = int(getattr(scored, "errors", 0)), int(getattr(scored, "timeouts", 0))
        self.errors += errors
        self.timeouts += timeouts
        failures: dict[str, str] = dict(getattr(scored, "failures", None) or {})
        out = self.stream or sys.stderr
        for kind, text in failures.items():
            if kind in self.shown:
                continue
            self.shown.add(kind)
            print(
                f"reward failure ({where}; first of kind {kind!r}, later ones are only counted in "
                f"reward_errors / reward_timeouts): {text.rstrip()}",
                file=out,
                flush=True,
            )
        n = len(scored.rewards)
        if n and errors + timeouts > self.max_failed_frac * n:
            first = next(iter(failures.values()), "")
            raise RewardFailureError(
                f"{where}: {failure_summary(scored)}, more than reward.max_failed_frac="
                f"{self.max_failed_frac:g} of them; the run is stopped because its rewards are not being "
                f"computed{': first failure: ' + _first_line(first) if first else ''}. Fix the reward (its "
                "traceback is above), or raise reward.max_failed_frac (1 = never stop)"
            )
