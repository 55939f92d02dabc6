"""A plug-in module OUTSIDE the posttrain package, one entry per extension point.

The tests put this folder on ``sys.path`` and name the entries by import path in run configs
(``rollout.engine.name=my_plugins:CountingEngine`` ...), exactly as a user's own package would.
``CALLS`` counts what was used, so a test can tell the plug-ins really ran.
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.algos import Terms, group_stats, register_advantage, register_policy_loss
from posttrain.hooks import GroupRewardShaper
from posttrain.rollout import (
    EngineContext,
    EpisodeRunner,
    Episodes,
    HFEngine,
    RewardHandle,
    RewardSource,
    RewardSourceContext,
    RunnerContext,
    SamplingParams,
    ScoredBatch,
    SingleTurnRunner,
)
from posttrain.tasks import Example, Task

CALLS: dict[str, int] = {"engine": 0, "runner": 0, "source": 0, "shaper": 0, "loss": 0, "advantage": 0}
SEEN: dict[str, Any] = {}


# ---------------------------------------------------------------- engine: a class used as a factory
class CountingEngine(HFEngine):
    """The default Hugging Face engine, counting ``generate`` calls; ``tag`` is a param from the config."""

    def __init__(self, ctx: EngineContext, *, tag: str = "counting") -> None:
        super().__init__(ctx.model, ctx.tokenizer, seed=ctx.seed, max_batch_size=ctx.max_batch_size)
        self.tag = tag
        SEEN["engine_tag"] = tag

    def generate(self, prompt_ids, n_per_prompt, params: SamplingParams):
        CALLS["engine"] += 1
        return super().generate(prompt_ids, n_per_prompt, params)


# ------------------------------------------------------------- runner: a function used as a factory
class _CountingRunner(SingleTurnRunner):
    def run(self, examples: list[Any], n_per_prompt: list[int], params: SamplingParams) -> Episodes:
        CALLS["runner"] += 1
        return super().run(examples, n_per_prompt, params)


def counting_runner(ctx: RunnerContext) -> EpisodeRunner:
    SEEN["runner_engine"] = type(ctx.engine).__name__
    return _CountingRunner(ctx.engine, ctx.formatter)


def not_a_runner(ctx: RunnerContext) -> object:
    """A broken factory: returns something that is not an EpisodeRunner."""
    return 42


# ------------------------------------------------------------------------ reward source: a class
class _Done(RewardHandle):
    def __init__(self, scored: ScoredBatch) -> None:
        self.scored = scored

    def result(self) -> ScoredBatch:
        return self.scored


class ConstantSource(RewardSource):
    """Scores every completion ``value`` (a stand-in for a judge model)."""

    def __init__(self, ctx: RewardSourceContext, *, value: float = 0.5) -> None:
        self.value = value

    def submit(self, completions: list[str], examples: list[Any]) -> RewardHandle:
        CALLS["source"] += len(completions)
        return _Done(ScoredBatch(rewards=[self.value] * len(completions)))


# --------------------------------------------------------------------------- loss and advantage
def _any(name: str, params: dict) -> None:
    return None


@register_policy_loss("plugin-reinforce", validate=_any)
def plugin_reinforce(batch, *, gain: float = 1.0) -> Terms:
    """ℓ_t = −gain · A_t · r_t (importance-weighted REINFORCE, no clipping)."""
    CALLS["loss"] += 1
    ratio = torch.exp(batch.log_ratio)
    none = torch.zeros_like(batch.valid)
    return Terms(
        loss=-gain * batch.adv * ratio,
        weight=(gain * ratio).detach(),
        ratio=ratio.detach(),
        clip_low=none,
        clip_high=none,
    )


@register_advantage("plugin-centered")
def centered(r: torch.Tensor, inv: torch.Tensor, n_groups: int, *, shift: float = 0.0) -> torch.Tensor:
    """A_i = R_i − mean_g(R) + shift."""
    CALLS["advantage"] += 1
    _, mean, _ = group_stats(r, inv, n_groups)
    return r - mean[inv] + shift


# ------------------------------------------------------------------------------------ hook: shaper
class ClipShaper(GroupRewardShaper):
    """Clamps rewards to [low, high]."""

    def __init__(self, *, low: float = 0.0, high: float = 1.0) -> None:
        self.low, self.high = low, high

    def shape(self, rewards, group_ids, *, correct, lengths, truncated):
        CALLS["shaper"] += 1
        return rewards.clamp(self.low, self.high)


# ------------------------------------------------------------------------------- task and reward
class CountTask(Task):
    """'n, n+1, n+2, ' -> 'n+3' (one-digit answers), ``n_heldout`` held-out prompts."""

    name = "count"
    default_reward = "my_plugins:StartsWithDigit"

    def __init__(self, *, n_heldout: int = 3) -> None:
        super().__init__()
        self.n_heldout = n_heldout

    def _build_splits(self) -> dict[str, list[Example]]:
        ex = [Example(f"c{i}", f"{i}, {i + 1}, {i + 2}, ", str(i + 3)) for i in range(7)]
        return {"train": ex[self.n_heldout :], "heldout": ex[: self.n_heldout]}

    def params(self) -> dict[str, Any]:
        return {"n_heldout": self.n_heldout}


class StartsWithDigit:
    """1 if the completion starts with a decimal digit."""

    def __call__(self, completion: str, example: Example) -> float:
        return 1.0 if completion[:1].isdigit() else 0.0


NOT_A_CLASS = 3
