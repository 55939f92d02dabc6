"""Sampling-side hooks of the RL loop: prompt samplers, controllers, replay buffers, group shapers.

Each registry also accepts a plug-in ``package.module:Name`` naming a subclass of its interface
(e.g. ``hooks.shaper.name: my_lab.shaping:LengthPenalty``).
"""

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
from posttrain.utils.registry import subclass_of

for _reg, _base in (
    (SAMPLERS, PromptSampler),
    (CONTROLLERS, Controller),
    (REPLAY_BUFFERS, ReplayBuffer),
    (GROUP_SHAPERS, GroupRewardShaper),
):
    _reg.accept(subclass_of(_base), f"a subclass of posttrain.sampling.{_base.__name__}")

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
