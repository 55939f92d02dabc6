"""The agent interface the SILO-BENCH engine talks to.

An agent is *stateless* from the engine's point of view: the engine owns every agent's chat context (the
authors' `src/engine.py` `init_case`, jwyjohn/acl26-silo-bench) and calls ``await agent.reply(messages)``
once per active round with the full history (their `run_round`). One agent object may therefore serve all N
seats of a case (an LLM client), or the engine can be given one agent per seat (mixed populations).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from posttrain.clients.base import Agent, AgentError, AgentReply

__all__ = ["Agent", "AgentError", "AgentReply", "Seat", "current_seat", "reply_as"]


@dataclass(frozen=True)
class Seat:
    """Which seat of which case an agent plays (`current_seat`). `task_id` comes from the case's
    ``case_id`` (``"II-12"``, ``"III-25_n5"`` -> ``"III-25"``), never from the prompt's wording."""

    case_id: str
    task_id: str
    agent_id: int
    num_agents: int


_CURRENT_SEAT: ContextVar[Seat | None] = ContextVar("silo_current_seat", default=None)


def current_seat() -> Seat | None:
    """The seat whose reply is being computed, inside ``Agent.reply`` called by the engine (None
    elsewhere). LLM agents ignore it and see only their chat; the scripted reference agent uses it to
    know the task from the case's ``case_id`` instead of recognising the prompt's title."""
    return _CURRENT_SEAT.get()


async def reply_as(agent: Agent, seat: Seat, messages: list[dict[str, str]]) -> AgentReply:
    """``await agent.reply(messages)`` with `current_seat()` = `seat` (the engine's call; each
    concurrent call runs in its own asyncio task, so seats never leak into each other)."""
    token = _CURRENT_SEAT.set(seat)
    try:
        return await agent.reply(messages)
    finally:
        _CURRENT_SEAT.reset(token)
