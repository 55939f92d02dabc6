"""Environments for multi-turn agent RL (simulated users, tools): the :class:`Env` interface and the
:data:`ENVS` registry (entry point group ``posttrain.envs``). The lab's DuCA recipe ships the ``sales``
customer simulators; the library ships ``answer`` (one scored message, e.g. after tool calls). See
docs/multi-turn.md and docs/tools.md."""

from posttrain.envs import answer as _answer  # noqa: F401  (registers "answer")
from posttrain.envs.base import (
    ENVS,
    Env,
    MultiAgentEnv,
    SeatsResult,
    StepResult,
    check_seats,
    check_step,
    env_factory,
    list_envs,
    register_env,
)

__all__ = [
    "ENVS",
    "Env",
    "MultiAgentEnv",
    "SeatsResult",
    "StepResult",
    "check_seats",
    "check_step",
    "env_factory",
    "list_envs",
    "register_env",
]
