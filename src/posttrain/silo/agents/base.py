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


@dataclass(frozen=True)
class Seat:
    """Which seat of which case an agent plays (`Agent.for_seat`). `task_id` comes from the case's
    ``case_id`` (``"II-12"``, ``"III-25_n5"`` -> ``"III-25"``), never from the prompt's wording."""

    case_id: str
    task_id: str
    agent_id: int
    num_agents: int


class AgentError(RuntimeError):
    """An agent backend failed for good (e.g. an LLM endpoint after the retry cap)."""


class Agent(ABC):
    """``async def reply(messages: list[dict]) -> AgentReply``; messages are ``{"role", "content"}``."""

    name: str = "agent"

    @abstractmethod
    async def reply(self, messages: list[dict[str, str]]) -> AgentReply: ...

    def for_seat(self, seat: Seat) -> Agent:
        """The agent object that plays `seat` (called once per seat when an engine is built).

        Default: this same object, so an LLM client serves every seat and sees only its chat context.
        The scripted reference agent returns a copy that knows the task id (`Seat.task_id`), so it
        never has to recognise a task by its title; its data still come only from the chat.
        """
        return self

    async def aclose(self) -> None:  # noqa: B027 - optional hook for clients holding connections
        """Release resources (HTTP connections, models). Optional."""
