"""Hook slots of the RL loop: prompt sampler, group filter, controllers, replay buffer, group reward
shapers (the order they act in a step: :mod:`posttrain.hooks.base`).

The interfaces and trivial defaults live in :mod:`posttrain.hooks.base`; method implementations live
in packages that declare them as entry points of these registries' groups, so naming
``hooks.sampler.name: e3`` in a config works while the library never names them. Each registry
also accepts a plug-in ``package.module:Name`` naming a subclass of its interface (e.g.
``hooks.shapers: [{name: my_lab.shaping:LengthPenalty}]``) and reads the entry points of its group
(``posttrain.samplers``, ``posttrain.controllers``, ``posttrain.replay_buffers``, ``posttrain.shapers``,
``posttrain.group_filters``). Every interface is a :class:`Hook` (own metrics, config-time checks).
"""

from posttrain.hooks.base import (
    CONTROLLERS,
    GROUP_FILTERS,
    GROUP_SHAPERS,
    REPLAY_BUFFERS,
    SAMPLERS,
    ConstantTemperature,
    Controller,
    GroupDecision,
    GroupFilter,
    GroupOutcome,
    GroupRewardShaper,
    Hook,
    IdentityShaper,
    KeepAll,
    Knobs,
    NoReplay,
    PromptPlan,
    PromptSampler,
    ReplayBuffer,
    RunInfo,
    Trajectory,
    UniformSampler,
    hook_metrics,
)
from posttrain.hooks.filters import DynamicSamplingFilter, DynamicSamplingWarning
from posttrain.utils.registry import subclass_of

for _reg, _base in (
    (SAMPLERS, PromptSampler),
    (CONTROLLERS, Controller),
    (REPLAY_BUFFERS, ReplayBuffer),
    (GROUP_SHAPERS, GroupRewardShaper),
    (GROUP_FILTERS, GroupFilter),
):
    _reg.accept(subclass_of(_base), f"a subclass of posttrain.hooks.{_base.__name__}")

__all__ = [
    "CONTROLLERS",
    "GROUP_FILTERS",
    "GROUP_SHAPERS",
    "REPLAY_BUFFERS",
    "SAMPLERS",
    "ConstantTemperature",
    "Controller",
    "DynamicSamplingFilter",
    "DynamicSamplingWarning",
    "GroupDecision",
    "GroupFilter",
    "GroupOutcome",
    "GroupRewardShaper",
    "Hook",
    "IdentityShaper",
    "KeepAll",
    "Knobs",
    "NoReplay",
    "PromptPlan",
    "PromptSampler",
    "ReplayBuffer",
    "RunInfo",
    "Trajectory",
    "UniformSampler",
    "hook_metrics",
]
