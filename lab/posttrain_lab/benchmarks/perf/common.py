"""Shared measurement helpers for `posttrain bench ...`: wall-clock timing and peak memory.

Peak memory, measured honestly on both device kinds:

- CUDA: `torch.cuda.reset_peak_memory_stats()` then `max_memory_allocated() − memory_allocated()` at
  the start (bytes held by live tensors at the peak, above what existed before the measured call).
- CPU: torch has no allocator statistics, so we read the kernel's resident-set high-water mark.
  Writing "5" to `/proc/self/clear_refs` resets `VmHWM` to the current RSS (Linux >= 4.0); the peak is
  `VmHWM − VmRSS` read just before the measured call. This counts every page the process touched,
  including allocator slack and library workspaces, so it is an upper bound on tensor bytes. Run each
  variant in a fresh process (`run_isolated`) so one variant's freed-but-cached memory cannot hide
  in the other's baseline. If `clear_refs` is not writable, the lifetime peak
  (`getrusage().ru_maxrss`) minus the RSS before the call is used and the method string says so.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from posttrain.utils.errors import InvalidValueError, PosttrainError, PosttrainRuntimeError

_RESULT_MARK = "@@POSTTRAIN_BENCH_RESULT@@"


def _proc_status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """`with PeakMemory(device) as pm: work()` then `pm.peak_bytes` (above the start) and `pm.method`."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = str(device)
        self.peak_bytes: int = 0
        self.method: str = ""
        self._base = 0
        self._ru = False  # fall back to the lifetime peak (ru_maxrss)

    def __enter__(self) -> PeakMemory:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            self.method = "torch.cuda.max_memory_allocated above the allocated bytes at start"
        elif _reset_hwm() and _proc_status_kb("VmHWM") is not None:
            self._base = (_proc_status_kb("VmRSS") or 0) * 1024
            self.method = "peak RSS (VmHWM after clear_refs reset) above RSS at start, fresh process"
        else:
            self._base = (_proc_status_kb("VmRSS") or 0) * 1024
            self._ru = True
            self.method = "lifetime peak RSS (ru_maxrss) above RSS at start; clear_refs unavailable"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            self.peak_bytes = max(0, torch.cuda.max_memory_allocated() - self._base)
        elif self._ru:
            import resource

            self.peak_bytes = max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self._base)
        else:
            self.peak_bytes = max(0, (_proc_status_kb("VmHWM") or 0) * 1024 - self._base)


def synchronize(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def time_fn(
    fn: Callable[[], Any], *, repeats: int = 3, warmup: int = 1, device: str = "cpu"
) -> dict[str, list[float]]:
    """Time `repeats` calls of `fn` after `warmup` untimed calls (device-synchronised).

    Returns {"wall_s": [...], "cpu_s": [...]}: wall-clock seconds and this process's CPU seconds
    (all threads). On a shared CPU machine the wall time includes waiting for other processes;
    CPU time does not, so report both."""
    if repeats < 1:
        raise InvalidValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        synchronize(device)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"wall_s": wall, "cpu_s": cpu}


def summarize_times(timing: dict[str, list[float]]) -> dict[str, Any]:
    """Medians (and the raw lists) of a `time_fn` result."""
    return {
        "median_s": statistics.median(timing["wall_s"]),
        "min_s": min(timing["wall_s"]),
        "times_s": list(timing["wall_s"]),
        "cpu_median_s": statistics.median(timing["cpu_s"]),
        "cpu_times_s": list(timing["cpu_s"]),
    }


def train_timed(
    trainer: Any,
    end: Callable[[int, float], None],
    begin: Callable[[int], None] | None = None,
) -> int:
    """A TRL / Hugging Face ``trainer.train()`` with every optimizer step timed by a callback
    (``on_step_begin`` -> ``on_step_end``): ``begin(i)`` before and ``end(i, seconds)`` after the i-th
    step, both outside the timed window (a bench runs its other sides there). Returns the steps run;
    fewer than ``args.max_steps`` is an error."""
    import warnings

    from transformers import TrainerCallback

    class _Timer(TrainerCallback):
        def __init__(self) -> None:
            self.t0 = 0.0
            self.steps = 0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if begin is not None:
                begin(self.steps)
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            dt = time.perf_counter() - self.t0
            end(self.steps, dt)
            self.steps += 1

    timer = _Timer()
    trainer.add_callback(timer)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # transformers v6 deprecations inside TRL
            trainer.train()
    finally:
        trainer.remove_callback(timer)
    if timer.steps != trainer.args.max_steps:
        raise PosttrainRuntimeError(
            f"TRL {type(trainer).__name__} ran {timer.steps} optimizer steps, expected {trainer.args.max_steps}"
        )
    return timer.steps


def probe_allocation(mibs: list[int], device: str = "cpu") -> list[dict[str, Any]]:
    """Self-check of `PeakMemory`: for each size, allocate (and touch) that many MiB inside a fresh
    probe, free it, and report what the probe saw."""
    import torch

    torch.zeros(16, device=device).sum()  # initialise torch before the baselines
    out = []
    for mib in mibs:
        with PeakMemory(device) as pm:
            x = torch.ones(mib * 2**20 // 4, device=device)
            del x
        out.append({"mib": mib, "peak_bytes": pm.peak_bytes, "method": pm.method})
    return out


def run_isolated(target: str, kwargs: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
    """Call `target` ("posttrain.module:function", JSON-able kwargs -> JSON-able dict) in a fresh Python
    process and return its result. Only functions inside the `posttrain` package can be targets."""
    _check_target(target)
    payload = json.dumps({"target": target, "kwargs": kwargs})
    proc = subprocess.run(
        [sys.executable, "-m", "posttrain_lab.benchmarks.perf.common"],
        input=payload,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_RESULT_MARK):
            return json.loads(line[len(_RESULT_MARK) :])
    tail = (proc.stderr or proc.stdout)[-2000:]
    if proc.returncode < 0:  # killed by a signal: SIGKILL without a traceback is the OOM killer's mark
        raise ChildKilled(target, -proc.returncode, tail)
    raise PosttrainRuntimeError(f"benchmark child {target} failed (exit {proc.returncode}):\n{tail}")


class ChildKilled(PosttrainError, RuntimeError):
    """A benchmark child process was killed by a signal (SIGKILL: most likely out of memory)."""

    def __init__(self, target: str, signum: int, tail: str = "") -> None:
        import signal as _signal

        try:
            name = _signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        self.target, self.signum, self.signal_name, self.tail = target, signum, name, tail
        why = " (most likely the kernel's out-of-memory killer)" if signum == _signal.SIGKILL else ""
        super().__init__(f"benchmark child {target} was killed by {name}{why}")


def _check_target(target: str) -> tuple[str, str]:
    module, sep, func = target.partition(":")
    if not sep or not module.startswith(("posttrain.", "posttrain_lab.")) or not func.isidentifier():
        raise InvalidValueError(
            f"benchmark target must look like 'posttrain[_lab].module:function', got {target!r}"
        )
    return module, func


def _child_main() -> None:
    request = json.loads(sys.stdin.read())
    module, func = _check_target(request["target"])
    fn = getattr(importlib.import_module(module), func)
    result = fn(**request["kwargs"])
    sys.stdout.write(_RESULT_MARK + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    _child_main()
