"""Rollout: engines that sample completions, episode runners, reward sources."""

from posttrain.rollout.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    RolloutBatch,
    RolloutEngine,
    SamplingParams,
    pad_left,
)
from posttrain.rollout.episodes import EpisodeRunner, Episodes, PromptFormatter, SingleTurnRunner
from posttrain.rollout.hf import HFEngine
from posttrain.rollout.reward_source import FunctionRewardSource, RewardHandle, RewardSource, ScoredBatch

__all__ = [
    "FINISH_LENGTH",
    "FINISH_STOP",
    "EpisodeRunner",
    "Episodes",
    "FunctionRewardSource",
    "HFEngine",
    "PromptFormatter",
    "RewardHandle",
    "RewardSource",
    "RolloutBatch",
    "RolloutEngine",
    "SamplingParams",
    "ScoredBatch",
    "SingleTurnRunner",
    "pad_left",
]
