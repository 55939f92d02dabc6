"""`posttrain bench reward-pool`: what a RewardPool costs per batch, measured against in-process.

Reported side by side in one run (medians over `repeats` batches):

- in-process scoring time of the batch (`num_workers=0`),
- pool time per batch for each worker count, and the overhead over in-process (IPC + wake-ups),
- pool start time (processes up and reward loaded),
- recovery: wall time of a batch in which one item hangs, minus the pool's `timeout_s`
  (kill + replace + finishing the batch).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from posttrain.rewards.base import get_reward
from posttrain.rewards.pool import RewardPool
from posttrain.tasks.base import Example, get_task
from posttrain.utils.errors import InvalidValueError, PosttrainRuntimeError

HANG = "__posttrain_bench_hang__"


class HangOnMarker:
    """Bench helper: exact_match, except a completion equal to `HANG` sleeps for a minute (to measure
    timeout recovery). Top-level so pool workers can unpickle it."""

    name = "hang_on_marker"

    def __init__(self) -> None:
        self.inner = get_reward("exact_match")

    def __call__(self, completion: str, example: Example) -> float:
        if completion == HANG:
            time.sleep(60)
        return self.inner(completion, example)


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def _p90_ms(xs: list[float]) -> float:
    return sorted(xs)[max(0, round(0.9 * len(xs)) - 1)] * 1e3


def run_bench(
    *,
    batch: int = 128,
    workers: list[int] | None = None,
    repeats: int = 30,
    reward: str = "exact_match",
    timeout_s: float = 1.0,
    recovery: bool = True,
) -> dict[str, Any]:
    if batch < 1 or repeats < 1:
        raise InvalidValueError(f"batch and repeats must be >= 1, got {batch}, {repeats}")
    workers = workers or [1, 2]
    if any(n < 1 for n in workers):
        # 0 would be the in-process row (always measured) and has no timeout: the hang would take 60 s
        raise InvalidValueError(f"worker counts must be >= 1 (in-process is always measured), got {workers}")
    task = get_task("arithmetic", format="scratchpad", ops="+-*", n_train=max(batch, 16), n_heldout=0)
    exs = task.split("train")[:batch]
    comps = [task.reference_completion(e, "long") for e in exs]
    fn = get_reward(reward) if reward != "exact_match" else HangOnMarker()
    out: dict[str, Any] = {"batch": batch, "reward": reward, "repeats": repeats, "rows": []}

    with RewardPool(fn, num_workers=0) as inline:
        inline.score(comps, exs)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            inline.score(comps, exs)
            times.append(time.perf_counter() - t0)
    base = _median_ms(times)
    out["rows"].append({"mode": "in-process", "workers": 0, "median_ms": base, "p90_ms": _p90_ms(times)})

    for n in workers:
        t0 = time.perf_counter()
        with RewardPool(fn, num_workers=n, timeout_s=timeout_s) as pool:
            start_s = time.perf_counter() - t0
            pool.score(comps, exs)  # warm
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                res = pool.score(comps, exs)
                times.append(time.perf_counter() - t0)
                if res.errors or res.timeouts:
                    raise PosttrainRuntimeError(f"bench batch had failures: {res.messages}")
            row = {
                "mode": "pool",
                "workers": n,
                "median_ms": _median_ms(times),
                "p90_ms": _p90_ms(times),
                "overhead_ms": _median_ms(times) - base,
                "start_s": start_s,
            }
            if recovery and reward == "exact_match":
                hang = list(comps)
                hang[len(hang) // 2] = HANG
                t0 = time.perf_counter()
                res = pool.score(hang, exs)
                row["recovery_s"] = time.perf_counter() - t0 - timeout_s
                row["recovery_timeouts"] = res.timeouts
                # the replacement worker is up and scoring again
                t0 = time.perf_counter()
                pool.score(comps, exs)
                row["after_recovery_ms"] = (time.perf_counter() - t0) * 1e3
            out["rows"].append(row)
    return out


def print_report(result: dict[str, Any]) -> None:
    from posttrain.utils.tables import print_table

    cols = ["mode", "workers", "median ms/batch", "p90 ms", "overhead ms", "start s", "hang recovery s"]
    rows = []
    for r in result["rows"]:
        rows.append(
            [
                r["mode"],
                r["workers"],
                r["median_ms"],
                r["p90_ms"],
                r.get("overhead_ms"),
                r.get("start_s"),
                r.get("recovery_s"),
            ]
        )
    print_table(
        f"RewardPool: {result['batch']} items of {result['reward']} per batch (median of {result['repeats']})",
        cols,
        rows,
    )
