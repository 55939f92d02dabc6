"""HTTP clients: the OpenAI-compatible chat client (:class:`OpenAIChatAgent`) and the chat-agent
interface it implements (:class:`Agent`, :class:`AgentReply`, :class:`AgentError`).

Any environment, benchmark or judge that talks to a chat endpoint uses it (SILO-BENCH's agents, an
LLM-played customer, a remote judge), so none of them has to import another's package.
"""

from posttrain.clients.base import Agent, AgentError, AgentReply
from posttrain.clients.batch import EndpointGenerator
from posttrain.clients.openai_chat import RETRY_STATUS, OpenAIChatAgent

__all__ = ["RETRY_STATUS", "Agent", "AgentError", "AgentReply", "EndpointGenerator", "OpenAIChatAgent"]
