"""Importance weights a policy loss multiplies in (``is_weights``): one provider per reason a row's
tokens were not sampled by π_old, the policy at the start of the step.

* :class:`ReplayWeights`: replayed rows (NexGRPO and other replay buffers) carry the log-probs of the
  past policy that sampled them; the buffer's ``is_weights`` gives π_old / π_past.
* :class:`EngineMismatchWeights`: fresh rows of an engine that computes other probabilities than the
  trainer (vLLM): the engine's truncated IS against the mismatch.
* :class:`BehaviourWeights`: fresh rows of asynchronous rollout, sampled by a policy up to
  ``max_staleness`` versions old: ``min(π_old / μ, C)`` (verl's truncated IS) or AReaL's masking.

The trainer multiplies the providers' weights (:func:`combine_weights`). Every weight uses π_old, never
the current π_θ: the loss's own ratio π_θ / π_old already carries the rest, so with π_θ here the ratio
would be counted twice from the second minibatch or epoch on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from posttrain.algos.importance import truncated_is_weights
from posttrain.hooks import ReplayBuffer
from posttrain.rollout import Episodes, RolloutBatch, RolloutEngine
from posttrain.utils.errors import InvalidValueError


class ImportanceWeights(Protocol):
    """A per-token importance-weight provider: ``(rows, logp, old_logp, mask, episodes, batch)`` ->
    (n, T) weights for those rows, or None when it has nothing to weigh in this micro-batch. The
    trainer multiplies the providers' weights and hands the product to the policy loss."""

    def __call__(
        self,
        rows: torch.Tensor,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        mask: torch.Tensor,
        episodes: Episodes,
        batch: RolloutBatch,
    ) -> torch.Tensor | None: ...


class ReplayWeights:
    """Replayed rows: the buffer's ``is_weights(old_logp, logp_past, mask)`` = π_old / π_past; fresh rows 1.

    The weight uses π_old (the policy that started this step), not the current π_θ: the policy loss
    already multiplies the PPO ratio π_θ / π_old, so the product is π_θ / π_past. With π_θ here the
    ratio would be counted twice from the second minibatch or epoch on (on-policy, one update,
    π_θ = π_old and both agree)."""

    def __init__(self, replay: Callable[[], ReplayBuffer]) -> None:
        self.replay = replay

    def __call__(self, rows, logp, old_logp, mask, episodes, batch):
        if not bool(episodes.replayed.any()):
            return None
        replayed = episodes.replayed.to(logp.device)[rows]
        w = self.replay().is_weights(old_logp.detach(), batch.logprobs[rows], mask)
        return torch.where(replayed[:, None], w, torch.ones_like(w))


class EngineMismatchWeights:
    """Fresh rows: the engine's sampler/trainer-mismatch correction (``rollout_is_weights``, e.g.
    truncated importance sampling, ``posttrain/rollout/vllm.py``); replayed rows 1 (they carry
    past-policy log-probs)."""

    def __init__(self, engine: Callable[[], RolloutEngine]) -> None:
        self.engine = engine

    def __call__(self, rows, logp, old_logp, mask, episodes, batch):
        if batch.logprobs is None:
            return None
        w = self.engine().rollout_is_weights(old_logp, batch.logprobs[rows], mask)
        if w is None:
            return None
        return torch.where(episodes.replayed.to(logp.device)[rows][:, None], torch.ones_like(w), w)


def combine_weights(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The product of the providers' weights (None when none applies)."""
    out = None
    for w in parts:
        if w is not None:
            out = w if out is None else out * w
    return out


class BehaviourWeights:
    """Asynchronous rollout's off-policy correction: on fresh rows the truncated importance weight of
    ``rollout.staleness_is`` (:func:`~posttrain.algos.importance.truncated_is_weights`), e.g.
    ``w_t = min(exp(log π_old_t − log μ_t), C)`` with μ the behaviour log-probs the group carries
    (``RolloutBatch.logprobs``) and π_old the trainer's policy at the start of the step; replayed rows
    1. Detached; the policy loss multiplies it into every term (``is_weights``)."""

    def __init__(self, mode: str, cap: float, floor: float | None) -> None:
        self.mode, self.cap, self.floor = mode, cap, floor

    def __call__(self, rows, logp, old_logp, mask, episodes, batch):
        if batch.logprobs is None:
            raise InvalidValueError(
                "rollout.max_staleness > 0: the episodes carry no behaviour log-probs (RolloutBatch.logprobs "
                "is None); use an engine that records them"
            )
        w = truncated_is_weights(
            old_logp, batch.logprobs[rows], mask, mode=self.mode, cap=self.cap, floor=self.floor
        )
        return torch.where(episodes.replayed.to(logp.device)[rows][:, None], torch.ones_like(w), w)
