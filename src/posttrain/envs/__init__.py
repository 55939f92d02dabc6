"""Environments for multi-turn agent RL (simulated users, tools): the :class:`Env` interface, the
:data:`ENVS` registry and the built-in ``sales`` customer simulator. See docs/multi-turn.md."""

from posttrain.envs.base import ENVS, Env, StepResult, check_step, env_factory, list_envs, register_env
from posttrain.envs.sales import CATALOG, CRITERIA, STORE_PROMPT, SalesEnv, SalesTask, ScriptedSeller

# the LLM-played buyer needs an HTTP client (httpx): listed, imported on first use
ENVS.register_lazy("sales-llm", "posttrain.envs.sales_llm:SalesLLMEnv")


def __getattr__(name: str) -> object:
    if name == "SalesLLMEnv":  # imported on first use (keeps httpx out of `import posttrain.envs`)
        from posttrain.envs.sales_llm import SalesLLMEnv

        return SalesLLMEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
