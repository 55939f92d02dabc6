"""How a multi-turn conversation becomes tokens: one :class:`Renderer` per template kind.

* :class:`PlainRenderer` (``task.chat_template: false``, the presets): the system texts, then each user
  message as ``user_turn`` (default ``"\\nUser: {observation}\\nAgent:"``); tool results as one
  ``tool_turn`` holding posttrain's ``<tool_response>`` blocks.
* :class:`ChatRenderer`: the model's chat template. The opening is the template with the generation
  prompt; every later environment reply is exactly the text the template puts after an agent turn and
  its EOS when the new messages follow it, rendered after a fixed stand-in conversation (never the real
  one, which a template may re-render differently: Qwen3 drops earlier ``<think>`` blocks), so tokens
  that were generated never change. With ``native_tools`` the template renders the tool schemas and
  the results as ``tool`` messages (its own format: hermes for Qwen2.5/3, llama3); otherwise the
  results are one user message of ``<tool_response>`` blocks (posttrain's fallback format).

:func:`make_renderer` picks one for a formatter. The multi-turn runner (:mod:`posttrain.rollout.multiturn`)
only asks for token ids: ``opening(messages)``, ``reply(observation)``, ``tool_reply(results)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from posttrain.rollout.episodes import PromptFormatter
from posttrain.utils.errors import InvalidValueError


class Renderer(ABC):
    """Token ids of a conversation's parts (module docstring)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def opening(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt tokens of a conversation's opening messages (system and user messages, the last a
        user message), ready for the agent's first turn."""
        if not messages or messages[-1].get("role") != "user":
            raise InvalidValueError("runner 'multi-turn': a conversation must open with a user message last")
        return self._opening(messages)

    @abstractmethod
    def _opening(self, messages: list[dict[str, Any]]) -> list[int]:
        """The opening's token ids (``messages`` checked by :meth:`opening`)."""

    @abstractmethod
    def reply(self, observation: str) -> list[int]:
        """Environment tokens after the agent's turn: the environment's next observation."""

    @abstractmethod
    def tool_reply(self, results: list[tuple[str, str]]) -> list[int]:
        """Environment tokens after a turn with tool calls: the results, as (tool name, text) pairs."""


class PlainRenderer(Renderer):
    """The plain template: ``user_turn`` per observation, ``tool_turn`` for tool results."""

    def __init__(self, tokenizer: Any, user_turn: str, tool_turn: str) -> None:
        super().__init__(tokenizer)
        self.user_turn, self.tool_turn = user_turn, tool_turn

    def _opening(self, messages: list[dict[str, Any]]) -> list[int]:
        return self.encode(
            "".join(
                self.user_turn.replace("{observation}", str(m["content"]))
                if m["role"] == "user"
                else str(m["content"])
                for m in messages
            )
        )

    def reply(self, observation: str) -> list[int]:
        return self.encode(self.user_turn.replace("{observation}", observation))

    def tool_reply(self, results: list[tuple[str, str]]) -> list[int]:
        from posttrain.tools.calls import fallback_results

        return self.encode(self.tool_turn.replace("{observation}", fallback_results([t for _, t in results])))


class ChatRenderer(Renderer):
    """The model's chat template; ``tool_schemas`` given: the template renders the tools itself
    (``native``), else tool results go back in posttrain's fallback format."""

    _ANCHOR = "posttrain-agent-turn-anchor"

    def __init__(self, tokenizer: Any, tool_schemas: list[dict[str, Any]] | None = None) -> None:
        super().__init__(tokenizer)
        self.tool_schemas = tool_schemas
        self.native = tool_schemas is not None

    def _template(self, messages: list[dict[str, Any]], **kw: Any) -> Any:
        if self.native:
            kw["tools"] = self.tool_schemas
        return self.tokenizer.apply_chat_template(messages, **kw)

    def _opening(self, messages: list[dict[str, Any]]) -> list[int]:
        ids = self._template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def after_agent(self, new: list[dict[str, Any]]) -> str:
        """The template's text between an agent turn's EOS and the next generation prompt when ``new``
        messages follow it, rendered after a fixed stand-in conversation (module docstring)."""
        stand_in = [{"role": "user", "content": "?"}, {"role": "assistant", "content": self._ANCHOR}]
        full = self._template([*stand_in, *new], add_generation_prompt=True, tokenize=False)
        anchor = self._ANCHOR + (self.tokenizer.eos_token or "")
        at = full.rfind(anchor)
        if at < 0:
            raise InvalidValueError(
                "runner 'multi-turn': the chat template does not render an agent turn verbatim followed "
                f"by the EOS token {self.tokenizer.eos_token!r}, so the environment's reply cannot be "
                "tokenised after it; use the plain template (task.chat_template=false)"
            )
        return full[at + len(anchor) :]

    def reply(self, observation: str) -> list[int]:
        return self.encode(self.after_agent([{"role": "user", "content": observation}]))

    def tool_reply(self, results: list[tuple[str, str]]) -> list[int]:
        from posttrain.tools.calls import fallback_results

        if self.native:
            msgs = [{"role": "tool", "name": name, "content": text} for name, text in results]
        else:
            msgs = [{"role": "user", "content": fallback_results([t for _, t in results])}]
        return self.encode(self.after_agent(msgs))


def make_renderer(
    formatter: PromptFormatter,
    *,
    user_turn: str,
    tool_turn: str,
    tool_schemas: list[dict[str, Any]] | None = None,
) -> Renderer:
    """The renderer of ``formatter``'s template kind: chat (with ``tool_schemas``: tools rendered by the
    template) or plain."""
    if formatter.chat:
        return ChatRenderer(formatter.tokenizer, tool_schemas)
    return PlainRenderer(formatter.tokenizer, user_turn, tool_turn)
