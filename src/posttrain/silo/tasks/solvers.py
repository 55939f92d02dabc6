"""Independent ground truth for the 30 SILO-BENCH tasks.

`solve(task_id, shards, prompt)` recomputes every agent's expected answer from nothing but the N input
shards (in agent order) and the task text one agent sees (its `user_prompt`): task parameters that are
stated in the text (target word, range bounds, K, number of steps, number of graph nodes, the K-Means
initial centroids) are parsed from it. It never looks at a case's `expected_output`.

Where practical each solver takes a different route from the generator's computation (spec §3), so a
shared bug would have to be made twice: e.g. union-find (generator) vs BFS (solver) for components,
expand-around-centre vs Manacher for palindromes, a list simulation vs bit-parallel integer arithmetic for
the 1D automaton, left/right-max arrays vs two pointers for rain water, traversal vs pointer jumping
(Wyllie list ranking) for II-18. Where the task's definition *is* a float formula whose last-bit value can
matter after rounding (III-28 PageRank sums, III-29 variance), the solver evaluates the same formula in
the same order after reconstructing its inputs independently.
"""

from __future__ import annotations

import bisect
import heapq
import json
import math
import re
import statistics
from collections import Counter
from collections.abc import Callable
from functools import reduce
from typing import Any

SolverFn = Callable[[list[Any], str], Any]
_SOLVERS: dict[str, SolverFn] = {}


def _solver(task_id: str) -> Callable[[SolverFn], SolverFn]:
    def deco(fn: SolverFn) -> SolverFn:
        _SOLVERS[task_id] = fn
        return fn

    return deco


def solve(task_id: str, shards: list[Any], prompt: str) -> list[Any]:
    """Per-agent expected values (length N = len(shards)) for `task_id`.

    Global tasks return the same value N times; segmented tasks (II-11, II-14, II-20, III-21) one slice per
    agent. `prompt` is any agent's user prompt (the task parameters are the same for all agents).
    """
    from posttrain.silo.tasks import TASK_IDS, task_info

    if task_id not in _SOLVERS:
        raise ValueError(f"unknown SILO-BENCH task {task_id!r}; known: {', '.join(TASK_IDS)}")
    if not isinstance(shards, list) or not shards:
        raise ValueError(f"solve({task_id}): shards must be a non-empty list (one shard per agent)")
    if not isinstance(prompt, str):
        raise ValueError(f"solve({task_id}): prompt must be the task text (str), got {type(prompt).__name__}")
    result = _SOLVERS[task_id](shards, prompt)
    if task_info(task_id).is_segmented:
        return result
    return [_fresh(result) for _ in shards]


def _fresh(value: Any) -> Any:
    # independent copies, so mutating one agent's expected value cannot change another's
    return json.loads(json.dumps(value)) if isinstance(value, list | dict) else value


def _parse(prompt: str, pattern: str, what: str, task_id: str) -> re.Match[str]:
    m = re.search(pattern, prompt)
    if m is None:
        raise ValueError(f"solve({task_id}): cannot find {what} in the task text (pattern {pattern!r})")
    return m


def _flat(shards: list[Any]) -> list[Any]:
    return [x for shard in shards for x in shard]


# ------------------------------------------------------------------------------------------- Level I


@_solver("I-01")
def _i01(shards, prompt):
    # local maxima, then a reduction over agents (the star/tree algorithm itself)
    return reduce(lambda a, b: a if a >= b else b, (max(s) for s in shards if s))


@_solver("I-02")
def _i02(shards, prompt):
    word = _parse(prompt, r'occurrences of the word "([^"]+)"', "the target word", "I-02").group(1)
    return sum(Counter(s)[word] for s in shards)


@_solver("I-03")
def _i03(shards, prompt):
    tally = Counter()
    for s in shards:
        tally.update(s)
    top = max(tally.values())
    return min(c for c, v in tally.items() if v == top)  # tie → first candidate in A..D order


@_solver("I-04")
def _i04(shards, prompt):
    return sum(line.find("ERROR") >= 0 for s in shards for line in s) > 0


@_solver("I-05")
def _i05(shards, prompt):
    m = _parse(prompt, r"range \[(-?\d+), (-?\d+)\]", "the range [lo, hi]", "I-05")
    lo, hi = int(m.group(1)), int(m.group(2))
    total = 0
    for s in shards:
        ordered = sorted(s)
        total += bisect.bisect_right(ordered, hi) - bisect.bisect_left(ordered, lo)
    return total


@_solver("I-06")
def _i06(shards, prompt):
    # bit-parity: bit b of the XOR is the parity of how many values have bit b set
    values = _flat(shards)
    return sum((1 << b) for b in range(max(v.bit_length() for v in values) + 1)
               if sum((v >> b) & 1 for v in values) % 2)  # fmt: skip


@_solver("I-07")
def _i07(shards, prompt):
    sums = [math.fsum(s) for s in shards]
    return round(math.fsum(sums) / sum(len(s) for s in shards), 2)


@_solver("I-08")
def _i08(shards, prompt):
    ordered = sorted(_flat(shards))
    return sum(1 for i, v in enumerate(ordered) if i == 0 or v != ordered[i - 1])


@_solver("I-09")
def _i09(shards, prompt):
    k = int(_parse(prompt, r"Find the (\d+) largest", "K", "I-09").group(1))
    local_tops = [heapq.nlargest(k, s) for s in shards]
    return heapq.nlargest(k, (v for top in local_tops for v in top))


@_solver("I-10")
def _i10(shards, prompt):
    return round(statistics.pstdev(_flat(shards)), 2)  # exact rational arithmetic inside statistics
