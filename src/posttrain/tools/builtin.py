"""The built-in tools: ``python`` (a sandboxed interpreter) and ``calculator`` (safe arithmetic).

Both run inline (in the caller, not a worker process): ``calculator`` refuses big numbers before it
computes them, and ``python`` kills its sandbox at the call's deadline (``settings.timeout_s``, which is
the sandbox's time limit) and then raises :class:`~posttrain.tools.registry.ToolTimeout` with the output
so far. ``settings.sandbox`` picks the sandbox's backend.

``calculate`` evaluates an arithmetic expression with the :mod:`ast` module, never ``eval``: numbers,
``+ - * / // % **``, unary ``+``/``-`` and parentheses, nothing else (no names, calls, attributes,
subscripts, comparisons or strings). Integers stay exact; an operation whose result would exceed
:data:`MAX_INT_BITS` bits (``2**10**10``) is refused before it is computed. Every problem comes back
as a message starting ``error:``, never as an exception.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from posttrain.tools.registry import ToolSettings, ToolTimeout, register_tool
from posttrain.tools.sandbox import SandboxLimits, run_sandboxed

__all__ = ["MAX_EXPRESSION_CHARS", "MAX_INT_BITS", "calculate", "python"]

#: The longest expression ``calculate`` reads.
MAX_EXPRESSION_CHARS = 2000
#: The largest integer (in bits, about 3,000 decimal digits) ``calculate`` computes.
MAX_INT_BITS = 10_000

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_SYMBOL = {
    ast.BitXor: "^ (use ** for powers)",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.MatMult: "@",
    ast.Invert: "~",
    ast.Not: "not",
}


class _CalcError(Exception):
    """A refusal of ``calculate`` (reported as ``error: <message>``)."""


def _bits(x: Any) -> float:
    """log2 of an integer's size (0 for floats and for 0, 1, -1)."""
    return math.log2(abs(x)) if isinstance(x, int) and abs(x) > 1 else 0.0


def _check_size(op: type, a: Any, b: Any) -> None:
    """Refuse an integer operation whose result would exceed MAX_INT_BITS, before computing it."""
    if op is ast.Pow:
        if isinstance(b, int) and isinstance(a, int):
            if b < 0 or abs(a) <= 1:
                return
            if _bits(a) * b > MAX_INT_BITS:
                shown = a if _bits(a) < 64 else "a large number"
                raise _CalcError(f"the result of {shown} ** {b} is too large")
        elif isinstance(b, (int, float)) and abs(b) > 10_000 and isinstance(a, (int, float)) and abs(a) > 1:
            raise _CalcError("the exponent is too large")
    elif op is ast.Mult and _bits(a) + _bits(b) > MAX_INT_BITS:
        raise _CalcError("the result is too large")


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        raise _CalcError(f"only numbers are allowed, not {node.value!r}")
    if isinstance(node, ast.BinOp):
        fn = _BINARY.get(type(node.op))
        if fn is None:
            raise _CalcError(f"operator {_SYMBOL.get(type(node.op), type(node.op).__name__)} is not allowed")
        a, b = _eval(node.left), _eval(node.right)
        _check_size(type(node.op), a, b)
        out = fn(a, b)
        if isinstance(out, complex):
            raise _CalcError("the result is not a real number")
        if isinstance(out, float) and not math.isfinite(out):
            raise _CalcError("the result is too large")
        if isinstance(out, int) and out.bit_length() > MAX_INT_BITS:
            raise _CalcError("the result is too large")
        return out
    if isinstance(node, ast.UnaryOp):
        fn = _UNARY.get(type(node.op))
        if fn is None:
            raise _CalcError(f"operator {_SYMBOL.get(type(node.op), type(node.op).__name__)} is not allowed")
        return fn(_eval(node.operand))
    what = {
        ast.Name: "names",
        ast.Call: "function calls",
        ast.Attribute: "attributes",
        ast.Subscript: "subscripts",
        ast.Compare: "comparisons",
        ast.Tuple: "tuples (write numbers without thousands separators)",
    }.get(type(node), type(node).__name__)
    raise _CalcError(f"{what} are not allowed; use numbers, + - * / // % ** and parentheses")


def _format(x: Any) -> str:
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return str(x)
        return f"{x:.15g}"
    return str(x)


@register_tool("calculator", inline=True)
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Supports numbers, + - * / // % ** and parentheses, e.g. "(1234 * 5678 - 91) / 7".

    Args:
        expression: the arithmetic expression to evaluate
    """
    text = expression.strip()
    if not text:
        return "error: empty expression"
    if len(text) > MAX_EXPRESSION_CHARS:
        return f"error: the expression is longer than {MAX_EXPRESSION_CHARS} characters"
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        return f"error: invalid expression ({e.msg})"
    except (RecursionError, MemoryError, ValueError):
        return "error: the expression is too deeply nested"
    try:
        return _format(_eval(tree))
    except _CalcError as e:
        return f"error: {e}"
    except ZeroDivisionError:
        return "error: division by zero"
    except OverflowError:
        return "error: the result is too large"
    except RecursionError:
        return "error: the expression is too deeply nested"


@register_tool("python", inline=True)
def python(code: str, *, settings: ToolSettings = ToolSettings()) -> str:
    """Run a Python program in a sandbox and return what it printed.

    The program runs in a fresh process with a time limit, a memory limit and no network access;
    print() the values you need. Use it for arithmetic and other exact computation.

    Args:
        code: the Python program to run
    """
    res = run_sandboxed(code, SandboxLimits(timeout_s=settings.timeout_s), settings.sandbox)
    if res.limit == "time":  # the call's deadline: counted as a timeout by the runner
        raise ToolTimeout("python", settings.timeout_s, res.text)
    return res.text
