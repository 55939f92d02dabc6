"""``posttrain.sampling`` (until 0.2): the hook interfaces, now :mod:`posttrain.hooks`, and the method
hooks, now in ``posttrain.recipes.<method>``. Importing ``posttrain.sampling`` gives this module (with a
DeprecationWarning, :mod:`posttrain._compat`): the same names as before, from their new homes.
"""

from posttrain.hooks import (
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
from posttrain.recipes.aparl import sampler as _aparl  # noqa: F401  (registers 'aparl')
from posttrain.recipes.asrr.hooks import (
    NO_THINKING_PREFIX,
    NO_THINKING_TEMPLATE,
    ASRRShaper,
    asrr_length_penalty,
)
from posttrain.recipes.dapo.hooks import DAPOOverlongShaper, DAPOSampler, dapo_overlong_penalty
from posttrain.recipes.e3.hooks import (
    E3Sampler,
    E3Temperature,
    allocate_rollouts,
    e3_annealed_target,
    e3_temperature_step,
)
from posttrain.recipes.nexgrpo import replay as _nexgrpo  # noqa: F401  (registers the replay buffers)

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
