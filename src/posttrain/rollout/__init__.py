"""Rollout: engines that sample completions, episode runners, reward sources, and their registries
(``ENGINES``, ``RUNNERS``, ``REWARD_SOURCES``: config-selected factories, see ``registry.py``)."""

from posttrain.rollout.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    RolloutBatch,
    RolloutEngine,
    SamplingParams,
    pad_left,
)
from posttrain.rollout.episodes import EpisodeRunner, Episodes, PromptFormatter, SingleTurnRunner
from posttrain.rollout.fast import FastEngine
from posttrain.rollout.hf import HFEngine, generate_completions
from posttrain.rollout.registry import (
    ENGINES,
    REWARD_SOURCES,
    RUNNERS,
    EngineContext,
    RewardSourceContext,
    RunnerContext,
    build_engine,
    build_reward_source,
    build_runner,
)
from posttrain.rollout.reward_source import (
    FunctionRewardSource,
    JudgeGatedRewardSource,
    RewardHandle,
    RewardSource,
    ScoredBatch,
)
from posttrain.rollout.spec import Rollout, RolloutSpec

__all__ = [
    "ENGINES",
    "FINISH_LENGTH",
    "FINISH_STOP",
    "REWARD_SOURCES",
    "RUNNERS",
    "EngineContext",
    "EpisodeRunner",
    "Episodes",
    "FastEngine",
    "FunctionRewardSource",
    "HFEngine",
    "JudgeGatedRewardSource",
    "PromptFormatter",
    "RewardHandle",
    "RewardSource",
    "RewardSourceContext",
    "Rollout",
    "RolloutBatch",
    "RolloutEngine",
    "RolloutSpec",
    "RunnerContext",
    "SamplingParams",
    "ScoredBatch",
    "SingleTurnRunner",
    "build_engine",
    "build_reward_source",
    "build_runner",
    "generate_completions",
    "pad_left",
]
