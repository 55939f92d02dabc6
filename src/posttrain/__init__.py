"""posttrain: LLM post-training that researchers can trust and actually run.

The flat Python API (each name is imported on first use, so ``import posttrain`` stays light)::

    from posttrain import RLTrainer, RLConfig, SFTTrainer, SFTConfig, Task, Example, PosttrainError
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from posttrain.utils.errors import PosttrainError, PosttrainWarning, install_warning_format

__version__ = "0.2.0"

#: public name -> module that defines it (imported on first attribute access)
_API: dict[str, str] = {
    "RLTrainer": "posttrain.train.rl",
    "RLConfig": "posttrain.train.config",
    "SFTTrainer": "posttrain.train.sft",
    "SFTConfig": "posttrain.train.sft",
    "PreferenceTrainer": "posttrain.train.preference",
    "PreferenceConfig": "posttrain.train.preference",
    "load_rl_config": "posttrain.train.config",
    "Task": "posttrain.tasks.base",
    "Example": "posttrain.tasks.base",
    "register_task": "posttrain.tasks.base",
    "register_reward": "posttrain.rewards.base",
    "PromptSampler": "posttrain.hooks.base",
    "GroupFilter": "posttrain.hooks.base",
    "GroupDecision": "posttrain.hooks.base",
    "ReplayBuffer": "posttrain.hooks.base",
    "GroupRewardShaper": "posttrain.hooks.base",
    "Controller": "posttrain.hooks.base",
}

__all__ = [
    "Controller",
    "Example",
    "GroupDecision",
    "GroupFilter",
    "GroupRewardShaper",
    "PosttrainError",
    "PosttrainWarning",
    "PreferenceConfig",
    "PreferenceTrainer",
    "PromptSampler",
    "RLConfig",
    "RLTrainer",
    "ReplayBuffer",
    "SFTConfig",
    "SFTTrainer",
    "Task",
    "__version__",
    "load_rl_config",
    "register_reward",
    "register_task",
]


# posttrain's warnings print as one line `posttrain: <Category>: message` (not file:line + source line)
install_warning_format()


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'posttrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from posttrain.hooks.base import (
        Controller,
        GroupDecision,
        GroupFilter,
        GroupRewardShaper,
        PromptSampler,
        ReplayBuffer,
    )
    from posttrain.rewards.base import register_reward
    from posttrain.tasks.base import Example, Task, register_task
    from posttrain.train.config import RLConfig, load_rl_config
    from posttrain.train.preference import PreferenceConfig, PreferenceTrainer
    from posttrain.train.rl import RLTrainer
    from posttrain.train.sft import SFTConfig, SFTTrainer
