"""SILO-BENCH agents: the `Agent` interface and its implementations.

* `ScriptedAgent` (``scripted``): reference policy that solves every task through each protocol.
* `AdversarialAgent` (``adversarial:<kind>``): engine robustness tests.
* `OpenAIChatAgent` (``openai``): any OpenAI-compatible ``/v1/chat/completions`` endpoint.
* `HFAgent` (``hf``): a local Hugging Face model directory or a tiny preset.

`build_agent(kind, **options)` builds one from its name (the CLI and the runner use it).
"""

from __future__ import annotations

from typing import Any

from posttrain.silo.agents.adversarial import ADVERSARIAL_KINDS, AdversarialAgent
from posttrain.silo.agents.base import Agent, AgentError, AgentReply
from posttrain.silo.agents.openai_client import OpenAIChatAgent
from posttrain.silo.agents.scripted import ScriptedAgent

AGENT_KINDS = ("scripted", "openai", "hf", *(f"adversarial:{k}" for k in ADVERSARIAL_KINDS))


def build_agent(kind: str, **options: Any) -> Agent:
    """``scripted`` | ``openai`` (base_url, model, api_key, temperature, concurrency, timeout_s,
    max_retries, max_tokens) | ``hf`` (model, max_new_tokens, temperature, max_context, device) |
    ``adversarial:<kind>``."""
    if kind == "scripted":
        return ScriptedAgent()
    if kind == "openai":
        if not options.get("base_url") or not options.get("model"):
            raise ValueError("agent 'openai' needs base_url and model (--base-url, --model)")
        return OpenAIChatAgent(**options)
    if kind == "hf":
        if not options.get("model"):
            raise ValueError("agent 'hf' needs model (a local model directory or a preset name; --model)")
        from posttrain.silo.agents.hf import HFAgent

        model = options.pop("model")
        return HFAgent(model, **options)
    if kind.startswith("adversarial"):
        _, _, sub = kind.partition(":")
        return AdversarialAgent(sub or "random", **options)
    raise ValueError(f"unknown agent kind {kind!r}; known: {', '.join(AGENT_KINDS)}")


__all__ = [
    "ADVERSARIAL_KINDS",
    "AGENT_KINDS",
    "AdversarialAgent",
    "Agent",
    "AgentError",
    "AgentReply",
    "OpenAIChatAgent",
    "ScriptedAgent",
    "build_agent",
]
