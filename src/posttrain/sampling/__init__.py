"""Sampling-side hooks of the RL loop: prompt samplers, controllers, replay buffers, group shapers.

Each registry also accepts a plug-in ``package.module:Name`` naming a subclass of its interface
(e.g. ``hooks.shaper.name: my_lab.shaping:LengthPenalty``).
"""

from posttrain.sampling import aparl as _aparl  # noqa: F401  (registers 'aparl')
from posttrain.sampling import nexgrpo as _nexgrpo  # noqa: F401  (registers the replay buffers)
from posttrain.sampling.asrr import NO_THINKING_PREFIX, NO_THINKING_TEMPLATE, ASRRShaper, asrr_length_penalty
from posttrain.sampling.dapo import DAPOOverlongShaper, DAPOSampler, dapo_overlong_penalty
from posttrain.sampling.e3 import (
    E3Sampler,
    E3Temperature,
    allocate_rollouts,
    e3_annealed_target,
    e3_temperature_step,
)
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
    RunInfo,
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
    "NO_THINKING_PREFIX",
    "NO_THINKING_TEMPLATE",
    "REPLAY_BUFFERS",
    "SAMPLERS",
    "ASRRShaper",
    "ConstantTemperature",
    "Controller",
    "DAPOOverlongShaper",
    "DAPOSampler",
    "E3Sampler",
    "E3Temperature",
    "GroupOutcome",
    "GroupRewardShaper",
    "IdentityShaper",
    "Knobs",
    "NoReplay",
    "PromptPlan",
    "PromptSampler",
    "ReplayBuffer",
    "RunInfo",
    "Trajectory",
    "UniformSampler",
    "allocate_rollouts",
    "asrr_length_penalty",
    "dapo_overlong_penalty",
    "e3_annealed_target",
    "e3_temperature_step",
]
