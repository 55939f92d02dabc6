"""Small shared helpers for `posttrain.algos`: masked statistics, input checks, parameter checks.

Everything here is pure tensor math; nothing is registered.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from posttrain.utils.errors import InvalidTypeError, InvalidValueError

Tensor = torch.Tensor


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Σ m·x / max(Σ m, 1) over all elements, with `mask` read as boolean (nonzero = valid).

    Positions with mask == 0 are selected away with `torch.where`, so inf/nan there cannot leak in.
    An all-zero mask gives 0.
    """
    valid = as_bool_mask(mask)
    total = torch.where(valid, values, torch.zeros_like(values)).sum()
    count = valid.sum().clamp(min=1).to(total.dtype)
    return total / count


def check_param_names(kind: str, name: str, given: Mapping[str, Any], accepted: Mapping[str, Any]) -> None:
    """Raise TypeError naming each unknown keyword and listing the accepted ones."""
    unknown = [k for k in given if k not in accepted]
    if not unknown:
        return
    acc = ", ".join(sorted(accepted)) or "(none)"
    parts = []
    for k in unknown:
        close = difflib.get_close_matches(k, list(accepted), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        parts.append(f"{k!r}{hint}")
    raise InvalidTypeError(
        f"{kind} {name!r}: unknown parameter {', '.join(parts)}; accepted parameters: {acc}"
    )


def keyword_defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    """{name: default} of the keyword-only parameters of `fn` (the tunable knobs of a loss/estimator)."""
    out = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            if p.default is inspect.Parameter.empty:
                raise InvalidTypeError(f"{fn.__name__}: keyword-only parameter {p.name!r} needs a default")
            out[p.name] = p.default
    return out


def require(cond: bool, kind: str, name: str, key: str, expected: str, got: Any) -> None:
    """Raise ValueError `"<kind> <name>: <key> must be <expected>, got <got>"` unless `cond`."""
    if not cond:
        raise InvalidValueError(f"{kind} {name!r}: {key} must be {expected}, got {got!r}")


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def as_bool_mask(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def check_2d(name: str, t: Any, shape: torch.Size | None = None) -> Tensor:
    if not isinstance(t, Tensor):
        raise InvalidTypeError(f"{name}: expected a torch.Tensor of shape (B, T), got {type(t).__name__}")
    if shape is None and t.dim() != 2:
        raise InvalidValueError(f"{name}: expected shape (B, T), got {tuple(t.shape)}")
    if shape is not None and t.shape != shape:
        raise InvalidValueError(f"{name}: expected shape {tuple(shape)} (same as logp), got {tuple(t.shape)}")
    return t


def check_float(name: str, t: Tensor) -> None:
    if not torch.is_floating_point(t):
        raise InvalidTypeError(
            f"{name}: expected a floating-point tensor (float32 or float64), got {t.dtype}"
        )
