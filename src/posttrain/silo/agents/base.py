"""The agent interface the SILO-BENCH engine talks to.

An agent is *stateless* from the engine's point of view: the engine owns every agent's chat context
(spec §4.2 step 3) and calls ``await agent.reply(messages)`` once per active round with the full
history (spec §4.3). One agent object may therefore serve all N seats of a case (an LLM client), or the
engine can be given one agent per seat (mixed populations).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


@dataclass
class AgentReply:
    """The assistant text and, when the backend reports it, its usage
    (``{"prompt_tokens": int, "completion_tokens": int}``, OpenAI naming)."""

    text: str
    usage: dict[str, Any] | None = None


class AgentError(RuntimeError):
    """An agent backend failed for good (e.g. an LLM endpoint after the retry cap)."""


class Agent(ABC):
    """``async def reply(messages: list[dict]) -> AgentReply``; messages are ``{"role", "content"}``."""

    name: str = "agent"

    @abstractmethod
    async def reply(self, messages: list[dict[str, str]]) -> AgentReply: ...

    async def aclose(self) -> None:  # noqa: B027 - optional hook for clients holding connections
        """Release resources (HTTP connections, models). Optional."""
