"""XML tool-call parsing for SILO-BENCH agents (the authors' `src/utils/prompts.py` format and
`src/utils/parsing.py`, jwyjohn/acl26-silo-bench).

Wire format (all protocols)::

    <tool_call>
      <tool>tool_name</tool>
      <parameters>
        <param1>value1</param1>
      </parameters>
    </tool_call>

Parameter values are converted like the authors' parser: try ``int`` -> ``float`` -> ``bool`` -> JSON ->
``str``. The raw (stripped) text of every parameter is kept as well, so tools whose parameter is declared
``str`` (message content, file paths) can use the text exactly as written (``"007"`` stays ``"007"``); see
`ToolCall.raw`.

Robustness: the parser never raises on model output. Unclosed blocks, missing ``<tool>`` tags and
junk between tags are skipped; ``<think>...</think>`` reasoning blocks are removed first so tool-call
*examples* inside a model's reasoning are not executed.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from posttrain.utils.errors import PosttrainError

_THINK_RE = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL | re.IGNORECASE)
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_TOOL_RE = re.compile(r"<tool>\s*(.*?)\s*</tool>", re.DOTALL)
_PARAMS_RE = re.compile(r"<parameters>(.*?)</parameters>", re.DOTALL)
_PARAM_RE = re.compile(r"<([A-Za-z_][A-Za-z0-9_\-]*)>(.*?)</\1\s*>", re.DOTALL)
_INT_RE = re.compile(r"[+-]?\d+")
_FLOAT_RE = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool name, converted parameter values and their raw stripped text."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.name, "params": self.params}


def convert_value(text: str) -> Any:
    """int -> float -> bool -> JSON -> str, on the stripped text (the authors' conversion order).

    Non-finite floats (``nan``, ``inf``) stay strings so results remain valid JSON.
    """
    s = text.strip()
    if _INT_RE.fullmatch(s):
        return int(s)
    if _FLOAT_RE.fullmatch(s):
        v = float(s)
        if math.isfinite(v):
            return v
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if s[:1] in ("[", "{", '"') or s == "null":
        try:
            return json.loads(s)
        except (ValueError, RecursionError):
            pass
    return s


def strip_think(text: str) -> str:
    return _THINK_RE.sub("", text)


def parse_tool_calls(text: Any) -> list[ToolCall]:
    """All well-formed ``<tool_call>`` blocks in order. Never raises; non-str input gives ``[]``."""
    if not isinstance(text, str) or "<tool_call>" not in text:
        return []
    calls: list[ToolCall] = []
    for block in _CALL_RE.findall(strip_think(text)):
        m = _TOOL_RE.search(block)
        if m is None or not m.group(1):
            continue
        name = m.group(1).strip()
        params: dict[str, Any] = {}
        raw: dict[str, str] = {}
        pm = _PARAMS_RE.search(block)
        if pm is not None:
            for key, value in _PARAM_RE.findall(pm.group(1)):
                raw[key] = value.strip()
                params[key] = convert_value(value)
        calls.append(ToolCall(name=name, params=params, raw=raw))
    return calls


def format_tool_call(name: str, **params: Any) -> str:
    """The XML text of one call (used by scripted agents and tests). Non-str values are JSON-encoded."""
    lines = ["<tool_call>", f"  <tool>{name}</tool>", "  <parameters>"]
    for k, v in params.items():
        text = v if isinstance(v, str) else json.dumps(v)
        lines.append(f"    <{k}>{text}</{k}>")
    lines += ["  </parameters>", "</tool_call>"]
    return "\n".join(lines)


def format_tool_results(results: list[tuple[str, Any]]) -> str:
    """ONE user message of ``<tool_result>`` blocks separated by blank lines (the authors' `run_round`)."""
    blocks = [
        f"<tool_result>\n  <tool>{name}</tool>\n  <result>{json.dumps(result, default=str)}</result>\n</tool_result>"
        for name, result in results
    ]
    return "\n\n".join(blocks)


_RESULT_RE = re.compile(
    r"<tool_result>\s*<tool>(.*?)</tool>\s*<result>(.*?)</result>\s*</tool_result>", re.DOTALL
)


def parse_tool_results(text: str) -> list[tuple[str, Any]]:
    """Inverse of `format_tool_results` (scripted agents read their own results this way)."""
    out = []
    for name, body in _RESULT_RE.findall(text):
        try:
            out.append((name.strip(), json.loads(body)))
        except ValueError:
            out.append((name.strip(), body))
    return out


# ------------------------------------------------------------------------- data literals in prompts

_OPEN = {"[": "]", "(": ")", "{": "}"}
_CLOSE = set(_OPEN.values())


class LiteralError(PosttrainError, ValueError):
    """Text that does not start with a JSON or Python literal (the message shows its start)."""


def literal_prefix_end(text: str) -> int:
    """End index of the bracketed literal at the start of `text` (``[...]``, ``(...)``, ``{...}``),
    matching brackets outside single- or double-quoted strings (backslash escapes honoured).
    Raises `LiteralError` when `text` does not start with a bracket or the brackets never close."""
    if text[:1] not in _OPEN:
        raise LiteralError(f"{text[:60]!r} does not start with '[', '(' or '{{'")
    stack: list[str] = []
    quote: str | None = None
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if quote is not None:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in ("'", '"'):
            quote = ch
        elif ch in _OPEN:
            stack.append(_OPEN[ch])
        elif ch in _CLOSE:
            if not stack or stack.pop() != ch:
                raise LiteralError(f"{text[:60]!r}: unbalanced {ch!r} at offset {i}")
            if not stack:
                return i + 1
        i += 1
    raise LiteralError(f"{text[:60]!r}: the literal never closes")


def parse_data_literal(text: str) -> Any:
    """The data value at the start of `text`, as JSON-native values; any text after it is ignored.

    Accepts JSON (our case files) and Python literals as the authors' generator prints shards with
    ``str()`` (single quotes, tuples, integer dict keys, ``True``/``None``); the Python form is read
    with `ast.literal_eval` (a literal parser: it evaluates no names, calls or operators). The result is
    JSON-native: tuples become lists and dict keys strings, as a JSON round trip of the authors'
    ``input_shard`` gives. A JSON string literal is returned unquoted. Raises `LiteralError`.
    """
    import ast

    s = text.strip()
    if s[:1] == '"':
        try:
            return json.JSONDecoder().raw_decode(s)[0]
        except ValueError as e:
            raise LiteralError(f"{s[:60]!r} is not a JSON string ({e})") from None
    end = literal_prefix_end(s)
    body = s[:end]
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        pass
    try:
        value = ast.literal_eval(body)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise LiteralError(
            f"{body[:60]!r} is neither JSON nor a Python literal ({type(e).__name__})"
        ) from None
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise LiteralError(f"{body[:60]!r} holds values that are not JSON data ({e})") from None
