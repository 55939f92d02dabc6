"""Reward sources: completions in, scalar rewards out, possibly asynchronously.

The RL loop submits a batch right after generation and collects it later (after the first policy
forward pass), so scoring overlaps with compute. :class:`FunctionRewardSource` runs a verifier
function in a worker pool with a per-call timeout (``posttrain.rewards.RewardPool``). A judge model
(e.g. a PaTaRM generative reward model, arXiv 2510.24235) implements the same two methods: ``submit``
returns a handle whose ``result()`` blocks until the :class:`ScoredBatch` is ready. Sources are
selected by config (``reward.source``); see :mod:`posttrain.rollout.registry`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.utils.errors import PosttrainRuntimeError


@dataclass
class ScoredBatch:
    """rewards[i] for completion i; timeouts / errors: how many calls timed out or raised (those got
    reward 0 from the pool); components: optional named per-completion parts (e.g. format, answer);
    failures: the first failure of each kind with its traceback (``posttrain.rewards.failures``)."""

    rewards: list[float]
    timeouts: int = 0
    errors: int = 0
    components: dict[str, list[float]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


class RewardHandle(ABC):
    @abstractmethod
    def result(self) -> ScoredBatch: ...


class _Ready(RewardHandle):
    def __init__(self, scored: ScoredBatch) -> None:
        self._scored = scored

    def result(self) -> ScoredBatch:
        return self._scored


class RewardSource(ABC):
    """Scores completions of examples. ``submit`` must not block for long; ``result()`` may."""

    @abstractmethod
    def submit(self, completions: list[str], examples: list[Any]) -> RewardHandle: ...

    def score(self, completions: list[str], examples: list[Any]) -> ScoredBatch:
        return self.submit(completions, examples).result()

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release workers."""


def _count(x: Any) -> int:
    if x is None:
        return 0
    if isinstance(x, int | float):
        return int(x)
    return int(sum(bool(v) for v in x))


def _to_scored(res: Any) -> ScoredBatch:
    comps = getattr(res, "components", None) or {}
    return ScoredBatch(
        rewards=[float(r) for r in res.rewards],
        timeouts=_count(getattr(res, "timeouts", 0)),
        errors=_count(getattr(res, "errors", 0)),
        components={k: [float(v) for v in vals] for k, vals in comps.items()}
        if isinstance(comps, dict)
        else {},
        failures=dict(getattr(res, "failures", None) or {}),
    )


class _PoolHandle(RewardHandle):
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def result(self) -> ScoredBatch:
        return _to_scored(self._inner.result())


class FunctionRewardSource(RewardSource):
    """A picklable ``fn(completion, example) -> float`` run by ``posttrain.rewards.RewardPool``
    (``num_workers`` processes, ``timeout_s`` per call; a timed-out or failing call scores 0 and is
    counted). ``num_workers = 0`` scores in-process when ``result()`` is called (no timeout)."""

    def __init__(
        self, fn: Callable[[str, Any], float], *, num_workers: int = 2, timeout_s: float = 5.0
    ) -> None:
        from posttrain.rewards import RewardPool

        self.fn = fn
        self._pool = RewardPool(fn, num_workers=num_workers, timeout_s=timeout_s)

    def submit(self, completions: list[str], examples: list[Any]) -> RewardHandle:
        if self._pool is None:
            raise PosttrainRuntimeError("FunctionRewardSource is closed")
        return _PoolHandle(self._pool.submit(completions, examples))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        self._pool = None
