"""Independent ground truth for the 30 SILO-BENCH tasks.

`solve(task_id, shards, prompt)` recomputes every agent's expected answer from nothing but the N input
shards (in agent order) and the task text one agent sees (its `user_prompt`): task parameters that are
stated in the text (target word, range bounds, K, number of steps, number of graph nodes, the K-Means
initial centroids) are parsed from it. It never looks at a case's `expected_output`.

Where practical each solver takes a different route from the generator's computation (the authors'
generators), so a shared bug would have to be made twice: e.g. union-find (generator) vs BFS (solver) for
components, expand-around-centre vs Manacher for palindromes, a list simulation vs bit-parallel integer
arithmetic for the 1D automaton, left/right-max arrays vs two pointers for rain water, traversal vs pointer
jumping (Wyllie list ranking) for II-18. Where the task's definition *is* a float formula whose last-bit
value can matter after rounding (III-28 PageRank sums, III-29 variance), the solver evaluates the same
formula in the same order after reconstructing its inputs independently.
"""

from __future__ import annotations

import bisect
import heapq
import json
import math
import re
import statistics
from collections import Counter, deque
from collections.abc import Callable
from functools import reduce
from itertools import accumulate, pairwise
from typing import Any

from posttrain.utils.errors import InvalidValueError
from posttrain.utils.registry import Registry
from posttrain_lab.benchmarks.silo.parsing import LiteralError, parse_data_literal

SolverFn = Callable[[list[Any], str], Any]
SOLVERS: Registry[SolverFn] = Registry("SILO-BENCH solver")


def _solver(task_id: str) -> Callable[[SolverFn], SolverFn]:
    return SOLVERS.register(task_id)


def solve(task_id: str, shards: list[Any], prompt: str) -> list[Any]:
    """Per-agent expected values (length N = len(shards)) for `task_id`.

    Global tasks return the same value N times; segmented tasks (II-11, II-14, II-20, III-21) one slice per
    agent. `prompt` is any agent's user prompt (the task parameters are the same for all agents).
    """
    from posttrain_lab.benchmarks.silo.tasks import TASK_IDS, task_info

    if task_id not in SOLVERS:
        raise InvalidValueError(f"unknown SILO-BENCH task {task_id!r}; known: {', '.join(TASK_IDS)}")
    if not isinstance(shards, list) or not shards:
        raise InvalidValueError(f"solve({task_id}): shards must be a non-empty list (one shard per agent)")
    if not isinstance(prompt, str):
        raise InvalidValueError(
            f"solve({task_id}): prompt must be the task text (str), got {type(prompt).__name__}"
        )
    result = SOLVERS.get(task_id)(shards, prompt)
    if task_info(task_id).is_segmented:
        return result
    return [_fresh(result) for _ in shards]


def _fresh(value: Any) -> Any:
    # independent copies, so mutating one agent's expected value cannot change another's
    return json.loads(json.dumps(value)) if isinstance(value, list | dict) else value


def _parse(prompt: str, pattern: str, what: str, task_id: str) -> re.Match[str]:
    m = re.search(pattern, prompt)
    if m is None:
        raise InvalidValueError(
            f"solve({task_id}): cannot find {what} in the task text (pattern {pattern!r})"
        )
    return m


def _flat(shards: list[Any]) -> list[Any]:
    return [x for shard in shards for x in shard]


def _cut_like(values: list[Any], shards: list[Any]) -> list[list[Any]]:
    """`values` cut into consecutive slices as long as the shards (a segmented answer, one per agent)."""
    out, start = [], 0
    for s in shards:
        out.append(values[start : start + len(s)])
        start += len(s)
    return out


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


# ------------------------------------------------------------------------------------------ Level II


@_solver("II-11")
def _ii11(shards, prompt):
    # the chain algorithm: each agent offsets its local running sums by the carry from its left neighbour
    out, carry = [], 0
    for s in shards:
        local = list(accumulate(s))
        out.append([carry + v for v in local])
        carry += local[-1] if local else 0
    return out


@_solver("II-12")
def _ii12(shards, prompt):
    data = _flat(shards)
    out, window = [], sum(data[:3])
    for i in range(1, len(data) - 1):
        if i > 1:
            window += data[i + 1] - data[i - 2]  # sliding integer window sum (exact)
        out.append(round(window / 3, 2))
    return out


@_solver("II-13")
def _ii13(shards, prompt):
    # Manacher's algorithm, O(L)
    text = "".join(shards)
    if not text:
        return 0
    t = "^#" + "#".join(text) + "#$"
    radius = [0] * len(t)
    centre = right = 0
    for i in range(1, len(t) - 1):
        if i < right:
            radius[i] = min(right - i, radius[2 * centre - i])
        while t[i + radius[i] + 1] == t[i - radius[i] - 1]:
            radius[i] += 1
        if i + radius[i] > right:
            centre, right = i, i + radius[i]
    return max(radius)


@_solver("II-14")
def _ii14(shards, prompt):
    steps = int(_parse(prompt, r"for (\d+) steps", "the number of steps", "II-14").group(1))
    cells = _flat(shards)
    width = len(cells)
    mask = (1 << width) - 1
    # bit j of `state` is cell j; "exactly one of (left, self, right)" = parity & ~(all three) & ~(pairs)
    state = sum(bit << j for j, bit in enumerate(cells))
    for _ in range(steps):
        left, right = (state << 1) & mask, state >> 1  # neighbour j-1 and j+1 moved onto bit j
        exactly_one = (left ^ state ^ right) & ~(left & state & right)
        state = exactly_one & mask
    return _cut_like([(state >> j) & 1 for j in range(width)], shards)


@_solver("II-15")
def _ii15(shards, prompt):
    # the greedy machine as a regular expression: first A, then the first B after it, then the first C
    return len(re.findall(r"A[^B]*B[^C]*C", "".join(shards)))


@_solver("II-16")
def _ii16(shards, prompt):
    # two pointers, O(1) extra space
    h = _flat(shards)
    lo, hi, left_max, right_max, water = 0, len(h) - 1, 0, 0, 0
    while lo < hi:
        if h[lo] < h[hi]:
            left_max = max(left_max, h[lo])
            water += left_max - h[lo]
            lo += 1
        else:
            right_max = max(right_max, h[hi])
            water += right_max - h[hi]
            hi -= 1
    return water


@_solver("II-17")
def _ii17(shards, prompt):
    # per-segment differences plus one boundary difference per chain link
    out: list[int] = []
    prev_last = None
    for s in shards:
        if s and prev_last is not None:
            out.append(s[0] - prev_last)
        out.extend(b - a for a, b in pairwise(s))
        if s:
            prev_last = s[-1]
    return out


@_solver("II-18")
def _ii18(shards, prompt):
    # Wyllie's pointer jumping: distance to the tail in O(log L) doubling rounds; rank = (L - 1) - distance
    nxt = {}
    for s in shards:
        for rec in s:
            nxt[rec["id"]] = rec["next"]
    dist = {v: 0 if w == -1 else 1 for v, w in nxt.items()}
    jump = dict(nxt)
    while any(w != -1 for w in jump.values()):
        new_dist, new_jump = {}, {}
        for v, w in jump.items():
            if w == -1:
                new_dist[v], new_jump[v] = dist[v], -1
            else:
                new_dist[v], new_jump[v] = dist[v] + dist[w], jump[w]
        dist, jump = new_dist, new_jump
    last = len(nxt) - 1
    return {str(v): last - dist[v] for v in sorted(nxt, key=lambda v: last - dist[v])}


@_solver("II-19")
def _ii19(shards, prompt):
    return sorted(set(_flat(shards)))


@_solver("II-20")
def _ii20(shards, prompt):
    out, carry = [], 0
    for s in shards:
        hashes = list(
            accumulate(s, lambda h, block: (h ^ (sum(block.encode("ascii")) % 10000)) % 10000, initial=carry)
        )[1:]
        out.append(hashes)
        if hashes:
            carry = hashes[-1]
    return out


# ----------------------------------------------------------------------------------------- Level III


def _num_nodes(prompt: str, task_id: str) -> int:
    return int(_parse(prompt, r"Total nodes: (\d+)", "'Total nodes: V'", task_id).group(1))


@_solver("III-21")
def _iii21(shards, prompt):
    # k-way merge of locally sorted shards, cut to each agent's current shard size
    return _cut_like(list(heapq.merge(*(sorted(s) for s in shards))), shards)


@_solver("III-22")
def _iii22(shards, prompt):
    values = _flat(shards)
    return heapq.nsmallest(len(values) // 2 + 1, values)[-1]  # selection without a full sort


@_solver("III-23")
def _iii23(shards, prompt):
    # breadth-first search over an adjacency list (the generator uses union-find)
    num_nodes = _num_nodes(prompt, "III-23")
    adjacency: list[list[int]] = [[] for _ in range(num_nodes)]
    for s in shards:
        for u, v in s:
            adjacency[u].append(v)
            adjacency[v].append(u)
    seen = [False] * num_nodes
    components = 0
    for start in range(num_nodes):
        if seen[start]:
            continue
        components += 1
        seen[start] = True
        queue = deque([start])
        while queue:
            for w in adjacency[queue.popleft()]:
                if not seen[w]:
                    seen[w] = True
                    queue.append(w)
    return components


@_solver("III-24")
def _iii24(shards, prompt):
    # Bellman-Ford style relaxation over the edge list until a fixpoint (the generator runs BFS)
    num_nodes = _num_nodes(prompt, "III-24")
    edges = [(u, v) for s in shards for u, v in s]
    inf = num_nodes + 1
    dist = [inf] * num_nodes
    dist[0] = 0
    changed = True
    while changed:
        changed = False
        for u, v in edges:
            if dist[u] + 1 < dist[v]:
                dist[v], changed = dist[u] + 1, True
            if dist[v] + 1 < dist[u]:
                dist[u], changed = dist[v] + 1, True
    return {str(v): (d if d < inf else -1) for v, d in enumerate(dist)}


@_solver("III-25")
def _iii25(shards, prompt):
    # ours print the centroids as JSON ([[x, y], ...]), the authors' with str() ([(x, y), ...])
    m = _parse(prompt, r"Initial centroids: (\[[^\n]*[\])]\])", "the initial centroids", "III-25")
    try:
        centroids = parse_data_literal(m.group(1))
    except LiteralError as e:
        raise InvalidValueError(
            f"solve(III-25): the initial centroids are not a list of [x, y] ({e})"
        ) from None
    k = len(centroids)
    sums = [[0.0, 0.0, 0] for _ in range(k)]  # per-cluster (Σx, Σy, count) partial sums, agent by agent
    for s in shards:
        for x, y in s:
            d2 = [(x - cx) ** 2 + (y - cy) ** 2 for cx, cy in centroids]
            best = d2.index(min(d2))  # lowest index among equal distances
            sums[best][0] += x
            sums[best][1] += y
            sums[best][2] += 1
    out = []
    for (sx, sy, count), (cx, cy) in zip(sums, centroids, strict=True):
        out.append([round(sx / count, 2), round(sy / count, 2)] if count else [round(cx, 2), round(cy, 2)])
    return out


@_solver("III-26")
def _iii26(shards, prompt):
    # hash partitioning as the prompt describes: bucket = value % N, dedupe per bucket, add up
    n = len(shards)
    buckets: list[set[int]] = [set() for _ in range(n)]
    for s in shards:
        for v in s:
            buckets[v % n].add(v)
    return sum(len(b) for b in buckets)


@_solver("III-27")
def _iii27(shards, prompt):
    k = int(_parse(prompt, r"Find the top (\d+) user-item pairs", "K", "III-27").group(1))
    users: dict[int, list[float]] = {}
    items: dict[int, list[float]] = {}
    for s in shards:
        users.update({int(u): vec for u, vec in s["users"].items()})
        items.update({int(i): vec for i, vec in s["items"].items()})

    def pairs():
        for uid, uvec in users.items():
            for iid, ivec in items.items():
                yield round(sum(a * b for a, b in zip(uvec, ivec, strict=True)), 4), uid, iid

    best = heapq.nlargest(k, pairs(), key=lambda t: (t[0], -t[1], -t[2]))
    return [[uid, iid, score] for score, uid, iid in best]


@_solver("III-28")
def _iii28(shards, prompt):
    # rebuild out-degrees and in-edge lists from the scattered edge list; the float sum per node is
    # accumulated in increasing source order, which is the task's definition evaluated exactly as specified
    num_nodes = _num_nodes(prompt, "III-28")
    d = float(_parse(prompt, r"d = ([0-9.]+)", "the damping factor", "III-28").group(1))
    out_degree = Counter(u for s in shards for u, _ in s)
    incoming: dict[int, list[int]] = {}
    for s in shards:
        for u, v in s:
            incoming.setdefault(v, []).append(u)
    ranks = {}
    for v in range(num_nodes):
        r = (1 - d) / num_nodes
        for u in sorted(incoming.get(v, [])):
            r += d * (1.0 / num_nodes) / out_degree[u]
        ranks[str(v)] = round(r, 6)
    return ranks


@_solver("III-29")
def _iii29(shards, prompt):
    # LPT with a (load, agent id) min-heap; tasks ordered by (-duration, original id) = stable sort
    n = len(shards)
    tasks = sorted((t for s in shards for t in s), key=lambda t: (-t["duration"], t["id"]))
    heap = [(0, i) for i in range(n)]
    for t in tasks:
        load, agent = heapq.heappop(heap)
        heapq.heappush(heap, (load + t["duration"], agent))
    loads = [load for load, _ in sorted(heap, key=lambda e: e[1])]
    mean = sum(t["duration"] for t in tasks) / n
    variance = sum((load - mean) ** 2 for load in loads) / n  # the task's float formula, same order
    return {"variance": round(variance, 2), "max_load": max(loads), "min_load": min(loads)}


@_solver("III-30")
def _iii30(shards, prompt):
    b = shards[0]["B_matrix"]
    columns = list(zip(*b, strict=True))
    rows: dict[int, list[int]] = {}
    for s in shards:
        for idx, row in zip(s["A_row_indices"], s["A_rows"], strict=True):
            rows[idx] = [sum(x * y for x, y in zip(row, col, strict=True)) for col in columns]
    return [rows[i] for i in range(len(rows))]
