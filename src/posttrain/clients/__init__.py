"""HTTP clients: the OpenAI-compatible chat client (:class:`OpenAIChatAgent`) and the chat-agent
interface it implements (:class:`Agent`, :class:`AgentReply`, :class:`AgentError`).

Used by SILO-BENCH (``posttrain_lab.benchmarks.silo``), the LLM buyer of the sales environment
(``posttrain_lab.recipes.duca.sales_llm``) and PaTaRM's remote judge; it lives in the core so none of them has to
import another's package.
"""

from posttrain.clients.base import Agent, AgentError, AgentReply
from posttrain.clients.batch import EndpointGenerator
from posttrain.clients.openai_chat import RETRY_STATUS, OpenAIChatAgent

__all__ = ["RETRY_STATUS", "Agent", "AgentError", "AgentReply", "EndpointGenerator", "OpenAIChatAgent"]
