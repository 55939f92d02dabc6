"""Environments for multi-turn agent RL (simulated users, tools): the :class:`Env` interface and the
:data:`ENVS` registry (entry point group ``posttrain.envs``). The lab's DuCA recipe ships the ``sales``
customer simulators. See docs/multi-turn.md."""

from posttrain.envs.base import ENVS, Env, StepResult, check_step, env_factory, list_envs, register_env

__all__ = ["ENVS", "Env", "StepResult", "check_step", "env_factory", "list_envs", "register_env"]
