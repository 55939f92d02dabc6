"""The tool registry: a tool is a plain Python function with a docstring and annotated parameters.

Register one by name (``@register_tool("lookup")``) or name it in a config as ``package.module:function``
(resolved by :func:`posttrain.utils.registry.import_object`, as every other registry does)::

    @register_tool("lookup")
    def lookup(word: str, limit: int = 3) -> str:
        '''Look a word up in the glossary.

        Args:
            word: the word to look up
            limit: how many entries to return
        '''

    tool = get_tool("lookup")              # or get_tool("my_pkg.tools:lookup")
    tool.schema                            # the JSON schema apply_chat_template(tools=[...]) takes
    tool.call({"word": "entropy"})         # or a JSON string, as a model writes it

Parameters may be ``str``, ``int``, ``float`` or ``bool`` (JSON ``string``, ``integer``, ``number``,
``boolean``); a parameter without a default is required. The description is the docstring's first
paragraph; a Google-style ``Args:`` section gives each parameter's description. :func:`tool_schema`
writes the same dict as ``transformers.utils.get_json_schema``.

Arguments are checked before the function runs: an unknown key, a missing required one or a value of
the wrong type raises :class:`ToolError` naming the tool and the argument; an exception inside the
tool is also re-raised as a :class:`ToolError`. :meth:`Tool.invoke` never raises at all: it returns a
:class:`ToolResult` whose text is the output or the error message, to hand back to the model.

**Every call has a deadline** (:class:`ToolSettings`: ``timeout_s``, default 10 s; and ``sandbox``, the
backend of the ``python`` tool, default ``auto``). A tool runs in a worker process that is killed at
the deadline (:mod:`posttrain.tools.deadline`); past it the call raises :class:`ToolTimeout` and
:meth:`Tool.invoke` returns ``ToolResult(message, ok=False, timed_out=True)``. Settings apply to all
tools of a runner (``get_tool(spec, timeout_s=..., sandbox=...)``) and can be overridden per tool with a
mapping spec: ``{"name": "python", "timeout_s": 20, "sandbox": "bwrap"}``. A tool function may take a
keyword-only parameter ``settings: ToolSettings`` (not part of its schema) to read them. Tools registered
with ``inline=True`` (``calculator``, ``python``) bound themselves and run in the caller.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from posttrain.tools.backends import BACKEND_NAMES
from posttrain.tools.deadline import DeadlineExceeded, ToolRaised, call_with_deadline
from posttrain.tools.sandbox import get_backend
from posttrain.utils.errors import InvalidValueError, PosttrainError
from posttrain.utils.registry import Registry, is_import_path

__all__ = [
    "TOOLS",
    "Tool",
    "ToolError",
    "ToolResult",
    "ToolSettings",
    "ToolTimeout",
    "get_tool",
    "register_tool",
    "tool_schema",
]


class ToolError(PosttrainError, ValueError):
    """A tool that cannot be built (bad signature) or called (bad arguments, or it raised)."""


class ToolTimeout(ToolError):
    """A call cut at its deadline (``timeout_s``); the message is for the model, with ``output``, what
    the tool printed before the cut (the ``python`` tool's sandbox), if any."""

    def __init__(self, tool: str, timeout_s: float, output: str = "", cancelled: bool = False) -> None:
        what = "was cancelled (the run is stopping)" if cancelled else f"timed out after {timeout_s:g} s"
        msg = f"tool {tool!r} {what}; the call was cut and gave no result"
        super().__init__(f"{msg}. Output before the cut:\n{output}" if output.strip() else msg)
        self.tool = tool
        self.timeout_s = timeout_s
        self.output = output


@dataclass(frozen=True)
class ToolSettings:
    """How a tool's calls run: ``timeout_s``, the deadline of each call in seconds (the ``python``
    tool's sandbox time limit too); ``sandbox``, the backend of the ``python`` tool (``auto``,
    ``bwrap``, ``guard``: :mod:`posttrain.tools.backends`)."""

    timeout_s: float = 10.0
    sandbox: str = "auto"

    def __post_init__(self) -> None:
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0 or t == float("inf"):
            raise InvalidValueError(f"tool timeout_s must be a number of seconds > 0, got {t!r}")
        if self.sandbox not in BACKEND_NAMES:
            raise InvalidValueError(
                f"tool sandbox must be one of {list(BACKEND_NAMES)}, got {self.sandbox!r}"
            )


#: Python annotation -> JSON-schema type.
JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}

TOOLS: Registry[Callable[..., Any]] = Registry("tool", group="posttrain.tools")
TOOLS.accept(
    lambda obj: obj if inspect.isfunction(obj) else None,
    "a function with a docstring and annotated str/int/float/bool parameters",
)


def register_tool(
    name: str, *, aliases: tuple[str, ...] = (), inline: bool = False
) -> Callable[[Callable[..., Any]], Any]:
    """Decorator: register a function as a tool under ``name`` (its signature is checked now).
    ``inline``: the function bounds its own run time and runs in the caller, not a worker process."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        tool_schema(fn, name=name)  # raises ToolError on an unusable signature or docstring
        if inline:
            fn.__posttrain_inline__ = True  # type: ignore[attr-defined]
        return TOOLS.register(name, aliases=aliases)(fn)

    return deco


# ------------------------------------------------------------------------------------------ schema
def _doc_parts(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """(first paragraph, {parameter: description from the ``Args:`` section})."""
    doc = inspect.getdoc(fn) or ""
    paragraphs = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)
    description = " ".join(paragraphs[0].split()) if paragraphs and paragraphs[0] else ""
    args: dict[str, str] = {}
    lines = doc.splitlines()
    i = next((k for k, line in enumerate(lines) if line.strip() in ("Args:", "Arguments:")), None)
    if i is not None:
        indent: int | None = None
        current: str | None = None
        for line in lines[i + 1 :]:
            if not line.strip():
                current = None
                continue
            ind = len(line) - len(line.lstrip())
            if indent is None:
                indent = ind
            if ind < indent:
                break
            m = re.match(r"\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if ind == indent and m:
                current = m.group(1)
                args[current] = m.group(2).strip()
            elif current is not None:
                args[current] = f"{args[current]} {line.strip()}".strip()
    return description, args


def _params(fn: Callable[..., Any], name: str) -> list[tuple[str, type, bool]]:
    """[(parameter, python type, required)] of a tool function; ToolError on what JSON cannot carry."""
    try:
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
    except Exception as e:
        raise ToolError(f"tool {name!r}: cannot read the signature ({type(e).__name__}: {e})") from None
    out = []
    for p in sig.parameters.values():
        if p.kind == p.KEYWORD_ONLY and p.name == "settings" and hints.get(p.name) is ToolSettings:
            continue  # the call's settings (module docstring), not an argument of the model
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise ToolError(f"tool {name!r}: parameter {p.name!r} must be a plain named parameter")
        if p.name not in hints:
            raise ToolError(f"tool {name!r}: parameter {p.name!r} has no type annotation")
        tp = hints[p.name]
        if tp not in JSON_TYPES:
            raise ToolError(
                f"tool {name!r}: parameter {p.name!r} is annotated {tp!r}; a tool takes str, int, float "
                "or bool"
            )
        out.append((p.name, tp, p.default is p.empty))
    return out


def tool_schema(fn: Callable[..., Any], *, name: str | None = None) -> dict[str, Any]:
    """The OpenAI / JSON-schema function description of ``fn``, as ``apply_chat_template(tools=...)``
    and ``transformers.utils.get_json_schema`` write it::

        {"type": "function", "function": {"name": ..., "description": ..., "parameters":
            {"type": "object", "properties": {...}, "required": [...]}}}

    ``name`` defaults to the function's ``__name__``. Raises :class:`ToolError` when ``fn`` has no
    docstring or a parameter is unannotated or of a type JSON cannot carry."""
    name = name or getattr(fn, "__name__", "tool")
    if not callable(fn):
        raise ToolError(f"tool {name!r}: {type(fn).__name__} is not callable")
    description, arg_docs = _doc_parts(fn)
    if not description:
        raise ToolError(f"tool {name!r}: the function needs a docstring (its first paragraph describes it)")
    properties: dict[str, Any] = {}
    required = []
    for pname, tp, req in _params(fn, name):
        prop: dict[str, Any] = {"type": JSON_TYPES[tp]}
        if arg_docs.get(pname):
            prop["description"] = arg_docs[pname]
        properties[pname] = prop
        if req:
            required.append(pname)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


# -------------------------------------------------------------------------------------------- calls
@dataclass(frozen=True)
class ToolResult:
    """What a call gave: ``text`` (the output, or the error message when ``ok`` is False);
    ``timed_out``: the call was cut at its deadline (then ``ok`` is False)."""

    text: str
    ok: bool
    timed_out: bool = False


def _coerce(tool: str, arg: str, tp: type, value: Any) -> Any:
    """``value`` as ``tp`` (an int for a float parameter, an integral float for an int one), else
    ToolError naming the tool and the argument."""
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        if isinstance(value, float) and not isinstance(value, bool) and value.is_integer():
            value = int(value)
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, tp)
    if not ok:
        raise ToolError(
            f"tool {tool!r}: argument {arg!r} must be {JSON_TYPES[tp]}, got {type(value).__name__} "
            f"{value!r:.60}"
        )
    return value


def _takes_settings(fn: Callable[..., Any]) -> bool:
    try:
        p = inspect.signature(fn).parameters.get("settings")
        return (
            p is not None
            and p.kind == p.KEYWORD_ONLY
            and typing.get_type_hints(fn).get("settings") is ToolSettings
        )
    except Exception:
        return False


@dataclass(frozen=True)
class Tool:
    """A registered or imported tool function with its name, schema and call settings."""

    name: str
    fn: Callable[..., Any]
    settings: ToolSettings = field(default_factory=ToolSettings)

    @property
    def inline(self) -> bool:
        return bool(getattr(self.fn, "__posttrain_inline__", False))

    @property
    def schema(self) -> dict[str, Any]:
        return tool_schema(self.fn, name=self.name)

    def check_arguments(self, arguments: Mapping[str, Any] | str | None) -> dict[str, Any]:
        """The arguments as keyword arguments of the function (a JSON string is parsed first);
        ToolError names an unknown, missing or mistyped argument."""
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as e:
                raise ToolError(f"tool {self.name!r}: arguments are not valid JSON ({e})") from None
        if not isinstance(arguments, Mapping):
            raise ToolError(
                f"tool {self.name!r}: arguments must be a JSON object, got {type(arguments).__name__}"
            )
        params = _params(self.fn, self.name)
        known = {p for p, _, _ in params}
        unknown = [k for k in arguments if k not in known]
        if unknown:
            raise ToolError(
                f"tool {self.name!r}: unknown argument(s) {', '.join(map(repr, unknown))}; "
                f"accepted: {', '.join(sorted(known)) or '(none)'}"
            )
        missing = [p for p, _, req in params if req and p not in arguments]
        if missing:
            raise ToolError(
                f"tool {self.name!r}: missing required argument(s) {', '.join(map(repr, missing))}"
            )
        types = {p: tp for p, tp, _ in params}
        return {k: _coerce(self.name, k, types[k], v) for k, v in arguments.items()}

    def call(self, arguments: Mapping[str, Any] | str | None = None) -> str:
        """Check the arguments, run the tool, return its output as text; ToolError on bad arguments
        or when the tool raises."""
        kwargs = self.check_arguments(arguments)
        if _takes_settings(self.fn):
            kwargs["settings"] = self.settings
        timeout = self.settings.timeout_s
        try:
            return call_with_deadline(self.fn, kwargs, timeout, inline=self.inline)
        except ToolTimeout as e:  # an inline tool's own deadline
            raise ToolTimeout(self.name, e.timeout_s, e.output) from None
        except ToolError:
            raise
        except DeadlineExceeded as e:
            raise ToolTimeout(self.name, timeout, cancelled=e.cancelled) from None
        except ToolRaised as e:
            if e.kind in ("ToolError", "ToolTimeout"):
                raise ToolError(e.message) from None
            raise ToolError(f"tool {self.name!r} raised {e.kind}: {e.message}") from None
        except Exception as e:
            raise ToolError(f"tool {self.name!r} raised {type(e).__name__}: {e}") from e

    def __call__(self, **kwargs: Any) -> str:
        return self.call(kwargs)

    def invoke(self, arguments: Mapping[str, Any] | str | None = None) -> ToolResult:
        """Like :meth:`call`, but never raises: a ToolError becomes ``ToolResult(message, ok=False)``,
        a :class:`ToolTimeout` ``ToolResult(message, ok=False, timed_out=True)``."""
        try:
            return ToolResult(self.call(arguments), True)
        except ToolTimeout as e:
            return ToolResult(str(e), False, timed_out=True)
        except ToolError as e:
            return ToolResult(str(e), False)


_SPEC_KEYS = ("name", "timeout_s", "sandbox")


def get_tool(
    spec: str | Callable[..., Any] | Tool | Mapping[str, Any],
    *,
    timeout_s: float | None = None,
    sandbox: str | None = None,
) -> Tool:
    """A :class:`Tool` for a registered name, a ``package.module:function`` path, a function, or a
    mapping ``{"name": ..., "timeout_s": ..., "sandbox": ...}`` whose settings override the keyword
    ones (the defaults of every tool of a runner; None: :class:`ToolSettings`' defaults). A tool that
    runs the sandbox resolves its backend now: ``sandbox: bwrap`` where bubblewrap cannot run raises
    :class:`~posttrain.tools.backends.SandboxUnavailableError`."""
    if isinstance(spec, Mapping):
        unknown = [k for k in spec if k not in _SPEC_KEYS]
        if unknown or "name" not in spec:
            raise ToolError(
                f"a tool given as a mapping needs 'name' and takes only {list(_SPEC_KEYS)}; got {sorted(spec)}"
            )
        timeout_s = spec.get("timeout_s", timeout_s)
        sandbox = spec.get("sandbox", sandbox)
        spec = spec["name"]
    base = spec.settings if isinstance(spec, Tool) else ToolSettings()
    settings = ToolSettings(
        timeout_s=base.timeout_s if timeout_s is None else timeout_s,
        sandbox=base.sandbox if sandbox is None else sandbox,
    )
    if isinstance(spec, Tool):
        tool = Tool(spec.name, spec.fn, settings)
        if _takes_settings(tool.fn):
            get_backend(settings.sandbox)
        return tool
    if callable(spec) and not isinstance(spec, str):
        fn, name = spec, getattr(spec, "__name__", "tool")
    elif isinstance(spec, str):
        fn = TOOLS.get(spec)
        name = getattr(fn, "__name__", spec) if is_import_path(spec) else TOOLS.canonical(spec)
    else:
        raise ToolError(f"tool spec must be a name, 'package.module:function' or a function, got {spec!r}")
    tool = Tool(name, fn, settings)
    tool_schema(fn, name=name)  # validate now, not at the first call
    if _takes_settings(fn):
        get_backend(settings.sandbox)  # refuse a required backend that cannot run, warn on a fallback
    return tool
