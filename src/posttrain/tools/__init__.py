"""Tools a policy can call: a registry of tool functions, a sandboxed Python interpreter and a calculator.

* :mod:`posttrain.tools.registry`: :func:`register_tool`, :func:`get_tool` (a registered name or
  ``package.module:function``), :func:`tool_schema` (the JSON schema chat templates take),
  :class:`Tool`, :class:`ToolError`.
* :mod:`posttrain.tools.sandbox`: :func:`run_python` runs code in a separate, limited process
  (:class:`SandboxLimits`); its docstring says what that does and does not protect against.
* :mod:`posttrain.tools.builtin`: the ``python`` and ``calculator`` tools.

This package imports only the standard library and :mod:`posttrain.utils`.
"""

from __future__ import annotations

from posttrain.tools.builtin import calculate, python
from posttrain.tools.registry import TOOLS, Tool, ToolError, ToolResult, get_tool, register_tool, tool_schema
from posttrain.tools.sandbox import SandboxLimits, SandboxResult, run_python, run_sandboxed

__all__ = [
    "TOOLS",
    "SandboxLimits",
    "SandboxResult",
    "Tool",
    "ToolError",
    "ToolResult",
    "calculate",
    "get_tool",
    "python",
    "register_tool",
    "run_python",
    "run_sandboxed",
    "tool_schema",
]
