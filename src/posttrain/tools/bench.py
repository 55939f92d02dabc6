"""Cost per tool call of each sandbox backend and of the deadline's worker process, measured.

    python -m posttrain.tools.bench --n 50

Runs ``n`` calls of each, interleaved (after one warm-up call each), and prints the median and the 90th percentile in
milliseconds, with the CPU: the ``python`` tool's sandbox running ``print(1)`` under ``guard`` and
under ``bwrap`` (where it runs), and a custom tool (a module-level function returning its argument) in
its worker process, warm and freshly started; the calculator inline for scale. docs/tools.md quotes the numbers.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import statistics
import time
from collections.abc import Callable

from posttrain.tools.deadline import call_with_deadline, shutdown_workers
from posttrain.tools.registry import get_tool
from posttrain.tools.sandbox import SandboxLimits, bwrap_problem, run_sandboxed

__all__ = ["cpu_name", "echo", "fresh_worker_call", "main", "measure"]


def echo(text: str) -> str:
    """Return the text (a custom tool of no cost of its own)."""
    return text


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(fns: list[Callable[[], object]], n: int) -> list[tuple[float, float]]:
    """(median, 90th percentile) in ms of ``n`` calls of each of ``fns``, after one warm-up call each;
    the calls are interleaved (one of each, ``n`` times), so a change of the machine's load during the
    run weighs on all of them alike."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(n):
        for fn, out in zip(fns, times, strict=True):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1000)
    return [(statistics.median(ts), sorted(ts)[min(n - 1, int(0.9 * n))]) for ts in times]


def fresh_worker_call(tool: Callable[..., str]) -> str:
    """One call in a worker started for it (the idle workers are shut down first)."""
    shutdown_workers()
    return call_with_deadline(tool, {"text": "x"}, 10.0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=50, help="calls per row (default 50)")
    args = ap.parse_args(argv)
    limits = SandboxLimits(timeout_s=10)
    rows: list[tuple[str, Callable[[], object]]] = [
        ("python tool, sandbox guard: print(1)", lambda: run_sandboxed("print(1)", limits, backend="guard")),
    ]
    problem = bwrap_problem()
    if problem is None:
        rows.append(
            (
                "python tool, sandbox bwrap: print(1)",
                lambda: run_sandboxed("print(1)", limits, backend="bwrap"),
            )
        )
    # by its module's name (under ``python -m`` this module is ``__main__``, which a worker cannot import)
    tool = importlib.import_module("posttrain.tools.bench").echo
    rows += [
        ("custom tool in its worker (warm)", lambda: call_with_deadline(tool, {"text": "x"}, 10.0)),
        ("custom tool in a fresh worker (its first call)", lambda: fresh_worker_call(tool)),
        ("calculator, inline", lambda: get_tool("calculator").call({"expression": "6*7"})),
    ]
    load = (
        f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        if hasattr(os, "getloadavg")
        else ""
    )
    print(f"CPU: {cpu_name()}; Python {platform.python_version()}; n = {args.n} calls per row{load}")
    print("| call | median ms | p90 ms |\n|---|---|---|")
    for (name, _), (med, p90) in zip(rows, measure([fn for _, fn in rows], args.n), strict=True):
        print(f"| {name} | {med:.1f} | {p90:.1f} |")
    if problem is not None:
        print(f"(bwrap not measured: {problem})")
    shutdown_workers()


if __name__ == "__main__":
    main()
