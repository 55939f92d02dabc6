"""Scripted episode runners for the asynchronous-rollout tests: they run inside Ray generation workers
(built there from ``rollout.runner.name=_async_helpers:scripted_runner``), so they live in a plain module
on sys.path, which the local Ray's workers import too."""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path
from typing import Any

from posttrain.rollout import EpisodeRunner, SingleTurnRunner


class ScriptedRunner(EpisodeRunner):
    """The single-turn runner with scripted behaviour per generation worker (index from the
    ``POSTTRAIN_GEN_WORKER`` variable its worker sets): ``delays[worker]`` seconds of sleep per call;
    ``raise_at``: raise on that call (1-based) of worker 0; ``exit_at``: the process of worker 0 dies
    (``os._exit``) on that call, once per ``marker`` file (a replaced worker finds the file and lives)."""

    def __init__(
        self,
        inner: EpisodeRunner,
        delays: dict[str, float] | None,
        raise_at: int | None,
        exit_at: int | None,
        marker: str | None,
    ) -> None:
        self.inner, self.delays = inner, delays or {}
        self.raise_at, self.exit_at, self.marker = raise_at, exit_at, marker
        self.calls = 0
        self.worker = os.environ.get("POSTTRAIN_GEN_WORKER", "0")

    def run(self, examples, n_per_prompt, params):
        self.calls += 1
        if self.worker == "0" and self.raise_at == self.calls:
            raise RuntimeError("scripted failure in generation worker 0")
        dies = self.worker == "0" and self.exit_at == self.calls and self.marker
        if dies and not Path(self.marker).exists():
            Path(self.marker).write_text("died once")
            os._exit(1)
        time.sleep(float(self.delays.get(self.worker, 0.0)))
        return self.inner.run(examples, n_per_prompt, params)


def scripted_runner(
    ctx: Any,
    *,
    delays: dict[str, float] | None = None,
    raise_at: int | None = None,
    exit_at: int | None = None,
    marker: str | None = None,
) -> EpisodeRunner:
    return ScriptedRunner(SingleTurnRunner(ctx.engine, ctx.formatter), delays, raise_at, exit_at, marker)


class CrcParity:
    """Reward: crc32 of the completion mod 2 for odd example ids, 1 for even ones (those groups are
    zero-variance, which the dynamic-sampling filter drops). Deterministic across processes."""

    name = "crc_parity"

    def __call__(self, completion: str, example: Any) -> float:
        idx = int("".join(ch for ch in str(example.id) if ch.isdigit()) or 0)
        if idx % 2 == 0:
            return 1.0
        return float(zlib.crc32(completion.encode()) % 2)
