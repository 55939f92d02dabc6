"""Tool calls in model output: the formats model families write them in, parsed; malformed calls kept.

A call format turns an assistant turn's text into the calls it makes::

    fmt = get_call_format("hermes")
    fmt.parse('<tool_call>\\n{"name": "calculator", "arguments": {"expression": "12*7"}}\\n</tool_call>')
    # -> [ToolCall(name="calculator", arguments={"expression": "12*7"}, raw=...)]

``parse`` never raises: text it cannot read as a call it was clearly meant to be (an opening tag
without its closing one, JSON that does not parse, no ``name``) comes back as a :class:`MalformedCall`
with the reason, which the multi-turn runner returns to the model as a tool error. Text without any
call gives ``[]`` (the turn is the agent's message, not a call).

Formats (``CALL_FORMATS``):

* ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call, as the
  chat templates of Qwen2.5 and Qwen3 (Hermes-style function calling) render and expect them; a JSON
  list of calls inside one block (SmolLM2-1.7B's form) is accepted too.
* ``llama3``: Llama 3.1/3.2/3.3 JSON tool calling: the whole turn is one JSON object
  ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``; several calls are
  separated by ``;``.
* ``fallback``: posttrain's format for models whose chat template has no tool support (SmolLM2-135M's,
  the tiny preset's). Calls are written as in ``hermes``; the tool descriptions go into the system
  message (:func:`fallback_instructions`) and tool results come back as a user turn wrapped in
  ``<tool_response>`` (:func:`fallback_results`).

:func:`detect_call_format` picks the format a tokenizer's chat template speaks (``auto``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.utils.errors import InvalidValueError

__all__ = [
    "CALL_FORMATS",
    "MalformedCall",
    "ToolCall",
    "detect_call_format",
    "fallback_instructions",
    "fallback_results",
    "get_call_format",
    "parse_hermes",
    "parse_llama3",
]


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: the tool's ``name`` and its ``arguments`` (a JSON object, unchecked here:
    the tool checks them), with the ``raw`` text it was read from."""

    name: str
    arguments: Any
    raw: str


@dataclass(frozen=True)
class MalformedCall:
    """Text meant as a call that cannot be read as one; ``error`` says why (returned to the model)."""

    raw: str
    error: str


Parsed = ToolCall | MalformedCall

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(_OPEN) + r"(.*?)" + re.escape(_CLOSE), re.DOTALL)


def _from_json(raw: str, obj: Any, args_keys: Sequence[str]) -> Parsed:
    if not isinstance(obj, dict):
        return MalformedCall(raw, f"a tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return MalformedCall(raw, 'a tool call needs a "name" (the tool\'s name, a string)')
    args: Any = {}
    for key in args_keys:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return MalformedCall(raw, f'the "arguments" string is not valid JSON ({e.msg})')
    if not isinstance(args, dict):
        return MalformedCall(raw, f'"arguments" must be a JSON object, got {type(args).__name__}')
    return ToolCall(name.strip(), args, raw)


def _loads(raw: str) -> tuple[Any, str | None]:
    try:
        return json.loads(raw), None
    except json.JSONDecodeError as e:
        return None, f"the call is not valid JSON ({e.msg} at character {e.pos})"


def parse_hermes(text: str) -> list[Parsed]:
    """Every ``<tool_call>...</tool_call>`` block of ``text`` (see the module docstring)."""
    out: list[Parsed] = []
    end = 0
    for m in _BLOCK.finditer(text):
        end = m.end()
        raw = m.group(1).strip()
        obj, err = _loads(raw)
        if err is not None:
            out.append(MalformedCall(raw, err))
        elif isinstance(obj, list):
            if not obj:
                out.append(MalformedCall(raw, "an empty list of calls"))
            out.extend(_from_json(json.dumps(o), o, ("arguments", "parameters")) for o in obj)
        else:
            out.append(_from_json(raw, obj, ("arguments", "parameters")))
    rest = text[end:]
    if _OPEN in rest:  # an opening tag never closed (e.g. the turn was cut at the token cap)
        raw = rest[rest.index(_OPEN) + len(_OPEN) :].strip()
        out.append(MalformedCall(raw, f"{_OPEN} without its closing {_CLOSE}"))
    return out


_PYTHON_TAG = "<|python_tag|>"


def parse_llama3(text: str) -> list[Parsed]:
    """Llama 3's JSON tool call: the whole turn (after an optional ``<|python_tag|>``) is a JSON object
    with ``name`` and ``parameters``, or several separated by ``;``. A turn that does not start with
    ``{`` is a message, not a call."""
    body = text.strip()
    tagged = body.startswith(_PYTHON_TAG)
    if tagged:
        body = body[len(_PYTHON_TAG) :].strip()
    if not body.startswith("{"):
        return [MalformedCall(body, f"{_PYTHON_TAG} not followed by a JSON call")] if tagged else []
    obj, err = _loads(body)
    if err is None:
        return [_from_json(body, obj, ("parameters", "arguments"))]
    parts = [p.strip() for p in body.split(";") if p.strip()]
    if len(parts) > 1:
        out: list[Parsed] = []
        for p in parts:
            o, e = _loads(p)
            out.append(
                MalformedCall(p, e) if e is not None else _from_json(p, o, ("parameters", "arguments"))
            )
        return out
    return [MalformedCall(body, err or "not a call")]


CALL_FORMATS: dict[str, Callable[[str], list[Parsed]]] = {
    "hermes": parse_hermes,
    "llama3": parse_llama3,
    "fallback": parse_hermes,
}
"""Format name -> parser. ``fallback`` writes calls as ``hermes`` does (module docstring)."""


def get_call_format(name: str) -> Callable[[str], list[Parsed]]:
    try:
        return CALL_FORMATS[name]
    except KeyError:
        raise InvalidValueError(
            f"tool call format must be one of {sorted(CALL_FORMATS)} or 'auto', got {name!r}"
        ) from None


def detect_call_format(chat_template: str | None) -> str:
    """The format a chat template renders tools in: ``hermes`` when it writes ``<tool_call>`` (Qwen2.5,
    Qwen3), ``llama3`` when it writes ``<|python_tag|>`` or an ``ipython`` turn (Llama 3.x), else
    ``fallback`` (no tool support: SmolLM2-135M, the tiny preset)."""
    t = chat_template or ""
    if "tools" in t and _OPEN in t:
        return "hermes"
    if "tools" in t and (_PYTHON_TAG in t or "ipython" in t):
        return "llama3"
    return "fallback"


def fallback_instructions(schemas: Sequence[dict[str, Any]]) -> str:
    """The system-message text that describes the tools and the call format, for templates without
    tool support (posttrain's wording; the same layout as Qwen's Hermes-style tool prompt)."""
    lines = [
        "You may call tools to help you. Tools available (JSON schema):",
        *(json.dumps(s, ensure_ascii=False) for s in schemas),
        "To call a tool, write exactly:",
        _OPEN + '{"name": <tool name>, "arguments": <JSON object>}' + _CLOSE,
        "The result comes back in <tool_response></tool_response>. Without a tool call, your message is "
        "your answer.",
    ]
    return "\n".join(lines)


def fallback_results(texts: Sequence[str]) -> str:
    """Tool results as the text of one user turn (the ``fallback`` format)."""
    return "\n".join(f"<tool_response>\n{t}\n</tool_response>" for t in texts)
