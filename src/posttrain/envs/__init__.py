"""Environments for multi-turn agent RL (simulated users, tools): the :class:`Env` interface, the
:data:`ENVS` registry and the built-in ``sales`` customer simulator. See docs/multi-turn.md."""

from posttrain.envs.base import ENVS, Env, StepResult, check_step, env_factory, list_envs, register_env
from posttrain.envs.sales import CATALOG, CRITERIA, STORE_PROMPT, SalesEnv, SalesTask, ScriptedSeller
from posttrain.envs.sales_llm import SalesLLMEnv  # registers 'sales-llm'

__all__ = [
    "CATALOG",
    "CRITERIA",
    "ENVS",
    "STORE_PROMPT",
    "Env",
    "SalesEnv",
    "SalesLLMEnv",
    "SalesTask",
    "ScriptedSeller",
    "StepResult",
    "check_step",
    "env_factory",
    "list_envs",
    "register_env",
]
