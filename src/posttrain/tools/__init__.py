"""Tools a policy can call: a registry of tool functions, a sandboxed Python interpreter and a calculator.

* :mod:`posttrain.tools.registry`: :func:`register_tool`, :func:`get_tool` (a registered name or
  ``package.module:function``), :func:`tool_schema` (the JSON schema chat templates take),
  :class:`Tool`, :class:`ToolError`.
* :mod:`posttrain.tools.sandbox`: :func:`run_python` runs code in a separate, limited process
  (:class:`SandboxLimits`); its docstring says what that does and does not protect against.
* :mod:`posttrain.tools.backends`: where that process runs (``sandbox``: ``bwrap`` kernel namespaces,
  ``guard`` the in-process guard, ``auto``), :func:`get_backend`.
* :mod:`posttrain.tools.deadline`: the deadline of every call (:class:`ToolSettings` ``timeout_s``): a
  custom tool runs in a worker process killed at the deadline; :func:`cancel_calls` for a stopping run.
* :mod:`posttrain.tools.builtin`: the ``python`` and ``calculator`` tools.

This package imports only the standard library and :mod:`posttrain.utils`.
"""

from __future__ import annotations

from posttrain.tools.backends import SandboxUnavailableError
from posttrain.tools.builtin import calculate, python
from posttrain.tools.deadline import cancel_calls
from posttrain.tools.registry import (
    TOOLS,
    Tool,
    ToolError,
    ToolResult,
    ToolSettings,
    ToolTimeout,
    get_tool,
    register_tool,
    tool_schema,
)
from posttrain.tools.sandbox import SandboxLimits, SandboxResult, get_backend, run_python, run_sandboxed

__all__ = [
    "TOOLS",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "Tool",
    "ToolError",
    "ToolResult",
    "ToolSettings",
    "ToolTimeout",
    "calculate",
    "cancel_calls",
    "get_backend",
    "get_tool",
    "python",
    "register_tool",
    "run_python",
    "run_sandboxed",
    "tool_schema",
]
