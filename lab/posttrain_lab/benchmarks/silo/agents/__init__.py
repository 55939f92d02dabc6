"""SILO-BENCH agents: the `Agent` interface and its implementations.

* `ScriptedAgent` (``scripted``): reference policy that solves every task through each protocol.
* `AdversarialAgent` (``adversarial:<kind>``): engine robustness tests.
* `OpenAIChatAgent` (``openai``): any OpenAI-compatible ``/v1/chat/completions`` endpoint.
* `HFAgent` (``hf``): a local Hugging Face model directory or a tiny preset.

`AGENTS` is the registry of agent factories (``AGENTS.get(name)(**options)``); `make_agent(name,
**options)` also reads the ``adversarial:<kind>`` form the CLI takes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posttrain.clients.openai_chat import OpenAIChatAgent
from posttrain.utils.errors import InvalidValueError
from posttrain.utils.registry import Registry
from posttrain_lab.benchmarks.silo.agents.adversarial import ADVERSARIAL_KINDS, AdversarialAgent
from posttrain_lab.benchmarks.silo.agents.base import Agent, AgentError, AgentReply, Seat, current_seat
from posttrain_lab.benchmarks.silo.agents.scripted import ANSWER_STYLES, ScriptedAgent

AgentFactory = Callable[..., Agent]
AGENTS: Registry[AgentFactory] = Registry("SILO agent")


@AGENTS.register("scripted")
def _scripted(answer_style: str = "json") -> Agent:
    """answer_style: json (default) | python | int-bools (``scripted:<style>`` on the command line)."""
    return ScriptedAgent(answer_style or "json")


@AGENTS.register("openai")
def _openai(**options: Any) -> Agent:
    """base_url, model, api_key, temperature, concurrency, timeout_s, max_retries, max_tokens."""
    if not options.get("base_url") or not options.get("model"):
        raise InvalidValueError("agent 'openai' needs base_url and model (--base-url, --model)")
    return OpenAIChatAgent(**options)


@AGENTS.register("hf")
def _hf(model: str | None = None, **options: Any) -> Agent:
    """model (a local model directory or a preset), max_new_tokens, temperature, max_context, device."""
    if not model:
        raise InvalidValueError("agent 'hf' needs model (a local model directory or a preset name; --model)")
    from posttrain_lab.benchmarks.silo.agents.hf import HFAgent

    return HFAgent(model, **options)


@AGENTS.register("adversarial")
def _adversarial(kind: str = "random", **options: Any) -> Agent:
    """kind: one of `ADVERSARIAL_KINDS` (``adversarial:<kind>`` on the command line)."""
    return AdversarialAgent(kind or "random", **options)


#: every name ``--agent`` takes (the variants spelled out)
AGENT_KINDS = (
    "scripted",
    *(f"scripted:{s}" for s in ANSWER_STYLES.names() if s != "json"),
    "openai",
    "hf",
    *(f"adversarial:{k}" for k in ADVERSARIAL_KINDS),
)
_VARIANT_OPTION = {"adversarial": "kind", "scripted": "answer_style"}


def make_agent(name: str, **options: Any) -> Agent:
    """The agent `name` from `AGENTS`, built with `options`; ``adversarial:<kind>`` passes ``kind``,
    ``scripted:<style>`` passes ``answer_style``."""
    base, sep, sub = name.partition(":")
    if sep and base in _VARIANT_OPTION:  # adversarial:<kind>, scripted:<answer style>
        return AGENTS.get(base)(**{_VARIANT_OPTION[base]: sub}, **options)
    try:
        factory = AGENTS.get(name)
    except KeyError:
        raise InvalidValueError(f"unknown agent kind {name!r}; known: {', '.join(AGENT_KINDS)}") from None
    return factory(**options)


__all__ = [
    "ADVERSARIAL_KINDS",
    "AGENTS",
    "AGENT_KINDS",
    "AdversarialAgent",
    "Agent",
    "AgentError",
    "AgentReply",
    "OpenAIChatAgent",
    "ScriptedAgent",
    "Seat",
    "current_seat",
    "make_agent",
]
