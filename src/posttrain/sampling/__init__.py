"""Sampling-side hooks of the RL loop: prompt samplers, controllers, replay buffers, group shapers."""

from posttrain.sampling.hooks import (
    CONTROLLERS,
    GROUP_SHAPERS,
    REPLAY_BUFFERS,
    SAMPLERS,
    ConstantTemperature,
    Controller,
    GroupOutcome,
    GroupRewardShaper,
    IdentityShaper,
    Knobs,
    NoReplay,
    PromptPlan,
    PromptSampler,
    ReplayBuffer,
    Trajectory,
    UniformSampler,
)

__all__ = [
    "CONTROLLERS",
    "GROUP_SHAPERS",
    "REPLAY_BUFFERS",
    "SAMPLERS",
    "ConstantTemperature",
    "Controller",
    "GroupOutcome",
    "GroupRewardShaper",
    "IdentityShaper",
    "Knobs",
    "NoReplay",
    "PromptPlan",
    "PromptSampler",
    "ReplayBuffer",
    "Trajectory",
    "UniformSampler",
]
