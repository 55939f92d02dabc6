"""Held-out evaluation: greedy pass@1 and sampled pass@k.

pass@k uses the unbiased estimator of Chen et al. 2021 (Codex, arXiv 2107.03374, Eq. 1): with n
samples of which c are correct,

    pass@k = 1 − C(n − c, k) / C(n, k) = 1 − Π_{i = n−c+1}^{n} (1 − k / i)

averaged over problems (the product form is the numerically stable one from the paper's code).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from posttrain.rollout.base import SamplingParams
from posttrain.rollout.episodes import PromptFormatter, SingleTurnRunner
from posttrain.rollout.hf import HFEngine
from posttrain.rollout.reward_source import RewardSource


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples, c correct (Chen et al. 2021)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def evaluate(
    model: Any,
    tokenizer: Any,
    examples: list[Any],
    reward_source: RewardSource,
    *,
    formatter: PromptFormatter | None = None,
    max_new_tokens: int = 16,
    success_threshold: float = 1.0,
    k: int = 1,
    samples: int = 1,
    temperature: float = 1.0,
    batch_size: int | None = 256,
    seed: int = 1234,
) -> dict[str, Any]:
    """Greedy pass@1 (``accuracy``), mean reward and length on ``examples``; with ``k > 1`` also
    ``pass@k`` from ``samples`` completions per example at ``temperature``. Uses its own sampling
    generator (seeded with ``seed``), so evaluating never perturbs a training run's RNG streams."""
    if not examples:
        raise ValueError("evaluate: no examples")
    formatter = formatter or PromptFormatter(tokenizer)
    engine = HFEngine(model, tokenizer, seed=seed, max_batch_size=batch_size)
    runner = SingleTurnRunner(engine, formatter)
    t0 = time.perf_counter()
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, logprobs=False)
    eps = runner.run(examples, [1] * len(examples), greedy)
    scored = reward_source.score(eps.texts, eps.examples)
    rewards = np.asarray(scored.rewards, dtype=float)
    correct = rewards >= success_threshold
    out: dict[str, Any] = {
        "n": len(examples),
        "accuracy": float(correct.mean()),
        "reward_mean": float(rewards.mean()),
        "length_mean": float(eps.batch.lengths.float().mean()),
        "truncated": float(eps.batch.truncated.float().mean()),
        "reward_timeouts": scored.timeouts,
        "reward_errors": scored.errors,
    }
    if k > 1:
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, logprobs=False)
        seps = runner.run(examples, [samples] * len(examples), params)
        s = np.asarray(reward_source.score(seps.texts, seps.examples).rewards) >= success_threshold
        per_group = np.zeros(len(examples), dtype=int)
        np.add.at(per_group, seps.batch.group_ids.numpy(), s.astype(int))
        out[f"pass@{k}"] = float(np.mean([pass_at_k(samples, int(c), k) for c in per_group]))
        out["sampled_accuracy"] = float(s.mean())
    out["wall_s"] = time.perf_counter() - t0
    out["samples"] = [
        {"prompt": e.prompt, "completion": t, "answer": e.answer}
        for e, t in zip(eps.examples[:5], eps.texts[:5], strict=True)
    ]
    return out
