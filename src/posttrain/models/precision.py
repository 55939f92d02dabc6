"""Compute precision (``model.precision``): fp32, or bf16 autocast over fp32 master weights.

``precision`` is separate from ``model.dtype`` (the dtype the weights are *stored* in):

* ``auto`` (default): ``bf16`` where the hardware computes it natively (a CUDA GPU with bf16 support;
  a CPU with AVX512-BF16 or AMX), ``fp32`` elsewhere — on a CPU without native bf16 (AVX2 only) a bf16
  matmul runs several times *slower* than fp32 (measured 8x at 576x576 on an AMD EPYC). Resolved
  where the model is built (:func:`run_precision`, called by the trainers' builders), not when the
  config is validated: importing or validating a config probes nothing and prints nothing. The
  config keeps the setting (``auto``); what the run computes in, and why, is printed once per run
  and recorded in the run folder's ``run.json``.
* ``fp32``: every matmul in float32.
* ``bf16``: the weights, their gradients and the AdamW state stay float32 (``model.dtype`` must be
  float32); the rollout and the training forward/backward run under ``torch.autocast(device,
  bfloat16)``, so the matmuls of the decoder run in bfloat16 (each weight is cast once per autocast
  region, torch's autocast weight cache), while the LM head feeds :func:`token_logprobs` bf16 operands
  whose softmax, log-softmax, entropy and every loss are computed in float32. The same setting means
  the same thing on CPU and CUDA (torch autocast on either device; on CPU it needs a CPU with bf16
  support to be fast, but is correct anywhere).

The environment variable ``POSTTRAIN_AUTO_PRECISION`` (``fp32`` or ``bf16``), when set, is what ``auto``
resolves to on every machine (the test suite sets ``fp32``, so its fp32-tolerance checks do not depend
on the CPU it runs on).

Pure bf16 *storage* (``model.dtype: bfloat16``) is still available and different: weights and the
optimizer state are then bf16 too (no fp32 master copy).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from posttrain.utils.errors import InvalidValueError

PRECISIONS = ("fp32", "bf16")
#: what ``model.precision`` accepts: a precision, or ``auto`` (resolved by :func:`resolve_precision`)
SETTINGS = ("auto", *PRECISIONS)
_NATIVE_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
#: environment variable that, when set, fixes what ``auto`` resolves to
AUTO_ENV = "POSTTRAIN_AUTO_PRECISION"


def check_precision(value: str, *, allow_auto: bool = False) -> str:
    """``value`` lower-cased if it is one of :data:`PRECISIONS` (or ``auto`` with ``allow_auto``), else
    a ValueError naming them."""
    v = str(value).lower()
    accepted = SETTINGS if allow_auto else PRECISIONS
    if v not in accepted:
        raise InvalidValueError(f"unknown precision {value!r}; accepted: {', '.join(accepted)}")
    return v


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU feature flags of ``/proc/cpuinfo`` (or of the text given); empty where it is unreadable."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                cpuinfo = f.read()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def cpu_capability() -> str:
    """PyTorch's CPU kernel level (``torch.backends.cpu.get_cpu_capability()``: DEFAULT, AVX2, AVX512 ...)
    and the native-bf16 flags of the CPU, e.g. ``"AVX2 (no avx512_bf16/amx_bf16)"``; benches print it."""
    native = sorted(set(_NATIVE_CPU_FLAGS) & cpu_flags())
    return f"{torch.backends.cpu.get_cpu_capability()} ({', '.join(native) if native else 'no ' + '/'.join(_NATIVE_CPU_FLAGS)})"


def native_bf16(device: Any, *, flags: set[str] | None = None) -> tuple[bool, str]:
    """(whether ``device`` computes bf16 natively, the reason in words). CUDA: ``is_bf16_supported``;
    CPU: the AVX512-BF16 or AMX flags (``flags`` overrides the CPU's own, for tests); others: no."""
    kind = _device_type(device)
    if kind == "cuda":
        ok = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        return ok, "CUDA GPU with bf16" if ok else "CUDA device without bf16 support"
    if kind == "cpu":
        have = sorted(set(_NATIVE_CPU_FLAGS) & (cpu_flags() if flags is None else flags))
        if have:
            return True, f"CPU with {', '.join(have)}"
        return (
            False,
            f"CPU without native bf16 ({torch.backends.cpu.get_cpu_capability()}, no avx512_bf16/amx_bf16)",
        )
    return False, f"{kind} device: bf16 autocast not assumed native"


def resolve_precision(
    setting: str, device: Any = "auto", dtype: str = "float32", *, flags: set[str] | None = None
) -> tuple[str, str]:
    """The precision a run uses for ``model.precision`` ``setting`` on ``device`` (``auto``: cuda when
    available, else cpu), and why. ``auto`` gives ``bf16`` only with float32 weights on a device with
    native bf16 (:func:`native_bf16`), else ``fp32``; with float32 weights, ``POSTTRAIN_AUTO_PRECISION``
    (when set) replaces the device's answer; an explicit ``fp32``/``bf16`` is kept."""
    setting = check_precision(setting, allow_auto=True)
    if setting != "auto":
        return setting, "set explicitly"
    from posttrain.models.loading import DTYPE_NAMES

    if DTYPE_NAMES.get(str(dtype).lower()) != "float32":
        return "fp32", f"weights stored in {dtype} (bf16 autocast needs float32 master weights)"
    forced = os.environ.get(AUTO_ENV, "").strip()
    if forced:  # one precision for `auto` on every machine (the test suite sets fp32)
        try:
            return check_precision(forced), f"{AUTO_ENV}={forced.lower()}"
        except InvalidValueError as e:
            raise InvalidValueError(f"environment variable {AUTO_ENV}={forced!r}: {e}") from None
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if str(device) == "auto" else device
    ok, why = native_bf16(dev, flags=flags)
    return ("bf16" if ok else "fp32"), why


def run_precision(
    setting: str, device: Any, dtype: str = "float32", *, quiet: bool = False
) -> tuple[str, str]:
    """What a run computes in for ``model.precision`` ``setting`` on ``device`` with weights stored in
    ``dtype`` (:func:`resolve_precision`), and why; printed on stderr as ``note: computing in bf16
    (model.precision auto: CPU with avx512_bf16)`` unless ``quiet``. The trainers' builders call it once
    per run, when the model is built, so the note names what the run really uses."""
    import sys

    resolved, why = resolve_precision(setting, device, dtype)
    if not quiet:
        print(f"note: computing in {resolved} (model.precision {setting}: {why})", file=sys.stderr)
    return resolved, why


def model_precision(setting: str, model: Any, *, quiet: bool = True) -> tuple[str, str]:
    """:func:`run_precision` for ``model`` as loaded: the device and storage dtype of its parameters."""
    param = next(model.parameters())
    return run_precision(setting, param.device, str(param.dtype).removeprefix("torch."), quiet=quiet)


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
