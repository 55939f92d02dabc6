"""Misbehaving rewards for the RewardPool tests (a plain module so worker processes can import it)."""

from __future__ import annotations

import os
import signal
import time

from posttrain.tasks import Example


class ScriptedReward:
    """Completion text is a command: a number -> that reward; `sleep`, `crash`, `segv`, `raise`,
    `nan`, `exit` misbehave. Top-level so worker processes can unpickle it."""

    name = "scripted"

    def __call__(self, completion: str, example: Example) -> float:
        if completion == "sleep":
            time.sleep(60)
        if completion == "crash":
            os._exit(3)
        if completion == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if completion == "raise":
            raise ValueError("scripted failure")
        if completion == "exit":
            raise SystemExit(1)
        if completion == "nan":
            return float("nan")
        return float(completion)


class BadSetupReward(ScriptedReward):
    def setup(self) -> None:
        raise RuntimeError("cannot load verifier")


class MissingPackageReward(ScriptedReward):
    """A reward whose `setup()` raises posttrain's own error for a missing package (one line)."""

    def setup(self) -> None:
        from posttrain.tasks.ifcheckers import CheckerUnavailable

        raise CheckerUnavailable('checkers need the `if-verifiable` package: pip install -e ".[ifbench]"')
