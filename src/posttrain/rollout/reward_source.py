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

from posttrain.utils.errors import InvalidValueError, PosttrainRuntimeError


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


class _GateHandle(RewardHandle):
    def __init__(self, gate: JudgeGatedRewardSource, base: RewardHandle, judge: RewardHandle, n: int) -> None:
        self._gate, self._base, self._judge, self._n = gate, base, judge, n

    def result(self) -> ScoredBatch:
        return self._gate.combine(self._base.result(), self._judge.result(), self._n)


class JudgeGatedRewardSource(RewardSource):
    """A reward source (``base``, e.g. a verifiable checker with hack probes) gated by a judge (any
    other reward source whose rewards lie in [0, 1], e.g. PaTaRM's generative judge, in-process or
    behind an OpenAI-compatible endpoint): both score every completion, concurrently; a completion
    the judge gives less than ``threshold`` is **flagged** and scores
    :func:`~posttrain.rewards.base.flagged_score` of its base reward under ``mode`` (``veto``:
    ``min(r, 0)``, ``penalty``: ``r - penalty``, ``reject``: ``min(r, -penalty)``), otherwise its base
    reward. posttrain's design (no paper gives this rule): the judge can only lower a reward, so a
    judge that likes a hack cannot raise it above the checker's verdict.

    A completion without a verdict keeps its base reward and is not flagged; ``judge_verdict`` (1 when
    the judge gave one) counts them. The verdict is decided per sample: a judge that scores each
    completion ``samples`` times reports ``judge_verdicts``, how many of them gave a score, and one is
    enough (its reward is then the mean of the scores given, so one unparsable judgment no longer hides
    the other low scores); a judge without that component has a verdict unless ``judge_failed`` = 1 or
    ``judge_parsed`` = 0. Components: the base's, the judge's, ``judge_reward`` (the judge's
    reward), ``judge_verdict`` and ``judge_flagged``; the step logs their means (``reward/judge_flagged``
    is the share the gate acted on). ``timeouts`` / ``errors`` / ``failures`` are the base's: a judge's
    failures never zero a reward (they show as ``judge_verdict`` < 1)."""

    def __init__(
        self,
        base: RewardSource,
        judge: RewardSource,
        *,
        threshold: float = 0.5,
        mode: str = "veto",
        penalty: float = 1.0,
    ) -> None:
        from posttrain.rewards.base import check_flag_settings

        self.mode, self.penalty = check_flag_settings("reward source judged", mode, penalty)
        if not (isinstance(threshold, int | float) and 0.0 <= threshold <= 1.0):
            raise InvalidValueError(
                f"reward source judged: threshold must be a number in [0, 1] (the judge's reward scale), "
                f"got {threshold!r}"
            )
        self.base, self.judge, self.threshold = base, judge, float(threshold)

    def submit(self, completions: list[str], examples: list[Any]) -> RewardHandle:
        if len(completions) != len(examples):
            raise InvalidValueError(
                f"reward source judged: {len(completions)} completions for {len(examples)} examples"
            )
        base = self.base.submit(completions, examples)
        return _GateHandle(self, base, self.judge.submit(completions, examples), len(completions))

    def combine(self, base: ScoredBatch, judge: ScoredBatch, n: int) -> ScoredBatch:
        """The gated batch of ``n`` completions from the base's and the judge's scores."""
        from posttrain.rewards.base import flagged_score

        for who, sb in (("base", base), ("judge", judge)):
            if len(sb.rewards) != n:
                raise PosttrainRuntimeError(
                    f"reward source judged: the {who} source returned {len(sb.rewards)} rewards for {n} completions"
                )
        added = ("judge_reward", "judge_verdict", "judge_flagged")
        b, j = set(base.components), set(judge.components)
        clash = sorted((b & j) | ((b | j) & set(added)))
        if clash:
            raise PosttrainRuntimeError(
                f"reward source judged: component(s) {', '.join(clash)} reported twice (by the base and the "
                f"judge, or by a source and the gate, which adds {', '.join(added)})"
            )
        if "judge_verdicts" in judge.components:  # per sample: any sample's score is a verdict
            has_verdict = [v > 0 for v in judge.components["judge_verdicts"]]
        else:
            failed = judge.components.get("judge_failed", [0.0] * n)
            parsed = judge.components.get("judge_parsed", [1.0] * n)
            has_verdict = [not f and bool(p) for f, p in zip(failed, parsed, strict=True)]
        rewards, verdict, flagged = [], [], []
        for r, s, has in zip(base.rewards, judge.rewards, has_verdict, strict=True):
            flag = has and s < self.threshold
            rewards.append(flagged_score(r, self.mode, self.penalty) if flag else r)
            verdict.append(float(has))
            flagged.append(float(flag))
        return ScoredBatch(
            rewards=rewards,
            timeouts=base.timeouts,
            errors=base.errors,
            components={
                **base.components,
                **judge.components,
                "judge_reward": list(judge.rewards),
                "judge_verdict": verdict,
                "judge_flagged": flagged,
            },
            failures={**base.failures, **{f"judge {k}": v for k, v in judge.failures.items()}},
        )

    def close(self) -> None:
        try:
            self.base.close()
        finally:
            self.judge.close()
