"""Compute precision (``model.precision``): fp32, or bf16 autocast over fp32 master weights.

``precision`` is separate from ``model.dtype`` (the dtype the weights are *stored* in):

* ``fp32`` (default): every matmul in float32.
* ``bf16``: the weights, their gradients and the AdamW state stay float32 (``model.dtype`` must be
  float32); the rollout and the training forward/backward run under ``torch.autocast(device,
  bfloat16)``, so the matmuls of the decoder run in bfloat16 (each weight is cast once per autocast
  region, torch's autocast weight cache), while the LM head feeds :func:`token_logprobs` bf16 operands
  whose softmax, log-softmax, entropy and every loss are computed in float32. The same setting means
  the same thing on CPU and CUDA (torch autocast on either device; on CPU it needs a CPU with bf16
  support to be fast, but is correct anywhere).

Pure bf16 *storage* (``model.dtype: bfloat16``) is still available and different: weights and the
optimizer state are then bf16 too (no fp32 master copy).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from posttrain.utils.errors import InvalidValueError

PRECISIONS = ("fp32", "bf16")


def check_precision(value: str) -> str:
    """``value`` lower-cased if it is one of :data:`PRECISIONS`, else a ValueError naming them."""
    v = str(value).lower()
    if v not in PRECISIONS:
        raise InvalidValueError(f"unknown precision {value!r}; accepted: {', '.join(PRECISIONS)}")
    return v


def _device_type(device: Any) -> str:
    if isinstance(device, torch.device):
        return device.type
    return torch.device(device).type


def precision_autocast(device: Any, precision: str) -> contextlib.AbstractContextManager:
    """The autocast context of ``precision`` on ``device`` (a no-op context for fp32)."""
    if check_precision(precision) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(_device_type(device), dtype=torch.bfloat16)


def autocast_dtype(device: Any) -> torch.dtype | None:
    """The dtype autocast is active with on ``device``'s type right now, or None."""
    dt = _device_type(device)
    if not torch.is_autocast_enabled(dt):
        return None
    return torch.get_autocast_dtype(dt)
