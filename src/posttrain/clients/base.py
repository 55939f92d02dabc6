"""The chat-agent interface: ``async def reply(messages) -> AgentReply``, shared by the OpenAI-compatible
HTTP client (:mod:`posttrain.clients.openai_chat`), SILO-BENCH's agents, the sales environment's LLM
buyer and PaTaRM's remote judge.

The engine that calls an agent owns the chat context and passes the full history each time, so an
agent is stateless from the caller's point of view.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from posttrain.utils.errors import PosttrainError


@dataclass
class AgentReply:
    """The assistant text and, when the backend reports it, its usage
    (``{"prompt_tokens": int, "completion_tokens": int}``, OpenAI naming)."""

    text: str
    usage: dict[str, Any] | None = None


class AgentError(PosttrainError, RuntimeError):
    """An agent backend failed for good (e.g. an LLM endpoint after the retry cap)."""


class Agent(ABC):
    """``async def reply(messages: list[dict]) -> AgentReply``; messages are ``{"role", "content"}``."""

    name: str = "agent"

    @abstractmethod
    async def reply(self, messages: list[dict[str, str]]) -> AgentReply: ...

    async def aclose(self) -> None:  # noqa: B027 - optional hook for clients holding connections
        """Release resources (HTTP connections, models). Optional."""
