"""Level I (Paradigm I, aggregation) generators: I-01 … I-10.

Every agent holds a contiguous slice of one generated list (the authors' sharding rule,
jwyjohn/acl26-silo-bench `benchmark_generator/paradigm_i.py`); the answer is one global value that every
agent must submit (`is_segmented = False`). The optimal topology is a star or tree that aggregates towards
one agent and broadcasts the result back: 2(N − 1) messages.

Inputs, answers and the order of random draws follow the authors' `benchmark_generator/paradigm_i.py`
(jwyjohn/acl26-silo-bench; task list: arXiv 2603.01045 Table 9), so that one shared `random.Random(42)`
replays the authors' stream in parity mode (their modules call `random.seed(42)` at import and share one
stream).
"""

from __future__ import annotations

import math
import random

from posttrain_lab.benchmarks.silo.tasks._base import Generated, TaskInfo, contiguous_shards, register

_TOPOLOGY_LINE = "Topology: Star/Tree aggregation → broadcast."
_STAR = "star/tree"
_LC = "https://leetcode.com/problems/"

WORDS = ("apple", "banana", "cherry", "date", "elderberry", "fig", "grape")
TARGET_WORD = "apple"
CANDIDATES = ("Candidate_A", "Candidate_B", "Candidate_C", "Candidate_D")
LOG_LINES = (
    "INFO: System started",
    "DEBUG: Loading config",
    "WARNING: Low memory",
    "SUCCESS: Task completed",
    "TRACE: Function called",
)
ERROR_LINE = "ERROR: Critical failure detected"
RANGE_LO, RANGE_HI = 100, 500
TOP_K = 10


def _collect_broadcast(n: int) -> str:
    return f"{n - 1} messages to collect + {n - 1} to broadcast = {2 * (n - 1)} total"


@register(
    TaskInfo(
        task_id="I-01",
        name="Global Max",
        level=1,
        is_segmented=False,
        leetcode_ref="LC-414",
        leetcode_url=_LC + "third-maximum-number/",
        topology_kind=_STAR,
        optimal_topology="Star (all agents → leader) or Tree, then broadcast result",
        input_summary="L = 20N ints U[-1000, 1000]",
        ground_truth_summary="max(data); int",
        shard_rule="contiguous",
        verification_hint="every agent submits max(global data)",
    )
)
def gen_i01(rng: random.Random, n: int) -> Generated:
    data = [rng.randint(-1000, 1000) for _ in range(20 * n)]
    desc = f"""**Task: Global Maximum**

Find the GLOBAL MAXIMUM value across all agents' data.

**Your Data:**
You (Agent {{agent_id}}) hold: {{input_shard}}

**Algorithm:**
1. Compute the maximum of your local shard
2. Coordinate with the other agents to determine the global maximum

**Output:**
A single integer: the global maximum value.

**Communication Protocol:**
{_TOPOLOGY_LINE}
All agents must submit the same final answer using submit_result(global_max)."""
    return Generated(contiguous_shards(data, n), max(data), desc, _collect_broadcast(n))


@register(
    TaskInfo(
        task_id="I-02",
        name="Word Frequency",
        level=1,
        is_segmented=False,
        leetcode_ref="LC-2085",
        leetcode_url=_LC + "count-common-words-with-one-occurrence/",
        topology_kind=_STAR,
        optimal_topology="Star (all agents → leader) then broadcast",
        input_summary="L = 30N words from 7 fruit names; indices 0, 10, 20, … forced to 'apple'",
        ground_truth_summary="count of 'apple'; int",
        shard_rule="contiguous",
        verification_hint="every agent submits the global count of the target word",
    )
)
def gen_i02(rng: random.Random, n: int) -> Generated:
    data = [rng.choice(WORDS) for _ in range(30 * n)]
    for i in range(0, len(data), 10):
        data[i] = TARGET_WORD
    count = 0
    for word in data:
        count += word == TARGET_WORD
    desc = f"""**Task: Word Frequency Count**

Count the TOTAL occurrences of the word "{TARGET_WORD}" across all agents' data.

**Your Data:**
You (Agent {{agent_id}}) hold: {{input_shard}}

**Algorithm:**
1. Count how many times "{TARGET_WORD}" appears in your local data
2. Coordinate with the other agents to compute the global count

**Output:**
A single integer: the total count of "{TARGET_WORD}".

**Communication Protocol:**
{_TOPOLOGY_LINE}
All agents must submit the same final answer using submit_result(total_count)."""
    return Generated(contiguous_shards(data, n), count, desc, f"{2 * (n - 1)} messages (collect + broadcast)")


@register(
    TaskInfo(
        task_id="I-03",
        name="Distributed Vote",
        level=1,
        is_segmented=False,
        leetcode_ref="LC-169",
        leetcode_url=_LC + "majority-element/",
        topology_kind=_STAR,
        optimal_topology="Star or Tree with histogram aggregation, then broadcast",
        input_summary="L = 25N votes over Candidate_A..D; a random winner overwrites every even index",
        ground_truth_summary="most frequent candidate (ties → first in A..D order); str",
        shard_rule="contiguous",
        verification_hint="every agent submits the candidate with the most votes",
    )
)
def gen_i03(rng: random.Random, n: int) -> Generated:
    votes = [rng.choice(CANDIDATES) for _ in range(25 * n)]
    winner = rng.choice(CANDIDATES)
    for i in range(0, len(votes), 2):
        votes[i] = winner
    tally = {c: votes.count(c) for c in CANDIDATES}
    best = max(CANDIDATES, key=lambda c: tally[c])  # max() keeps the first maximal candidate
    desc = f"""**Task: Distributed Voting**

Determine which candidate received the MOST votes across all agents' data.

**Your Data:**
You (Agent {{agent_id}}) hold: {{input_shard}}

**Algorithm:**
1. Count the votes for each candidate in your local shard
2. Collaborate with the other agents to determine the global winner

**Output:**
A string with the name of the candidate who received the most votes (e.g., "Candidate_A").

**Communication Protocol:**
{_TOPOLOGY_LINE}
All agents must submit the same final answer using submit_result("Candidate_X")."""
    return Generated(contiguous_shards(votes, n), best, desc, f"{2 * (n - 1)} messages")


@register(
    TaskInfo(
        task_id="I-04",
        name="Any Match",
        level=1,
        is_segmented=False,
        leetcode_ref="LC-28",
        leetcode_url=_LC + "find-the-index-of-the-first-occurrence-in-a-string/",
        topology_kind=_STAR,
        optimal_topology="Star with early termination or broadcast",
        input_summary="L = 15N log lines from 5 non-error lines; with p = 0.5 one position becomes an ERROR line",
        ground_truth_summary="any line contains 'ERROR'; bool",
        shard_rule="contiguous",
        verification_hint="every agent submits True iff any line contains ERROR",
    )
)
def gen_i04(rng: random.Random, n: int) -> Generated:
    data = [rng.choice(LOG_LINES) for _ in range(15 * n)]
    if rng.choice([True, False]):
        data[rng.randint(0, len(data) - 1)] = ERROR_LINE
    found = any("ERROR" in line for line in data)
    desc = """**Task: Error Detection**

Determine whether ANY string in the global dataset contains the substring "ERROR".

**Your Data:**
You (Agent {agent_id}) hold: {input_shard}

**Algorithm:**
1. Check whether any string in your local data contains "ERROR"
2. Coordinate with the other agents to determine whether ERROR occurs anywhere
3. Early termination: once ANY agent finds "ERROR", the answer is True

**Output:**
A boolean (True/False): whether "ERROR" was found anywhere.

**Communication Protocol:**
Topology: Star/Tree with early termination → broadcast.
All agents must submit the same final answer using submit_result(True/False)."""
    return Generated(
        contiguous_shards(data, n),
        found,
        desc,
        f"1 to {2 * (n - 1)} messages (early termination + broadcast if found)",
    )


@register(
    TaskInfo(
        task_id="I-05",
        name="Range Count",
        level=1,
        is_segmented=False,
        leetcode_ref="LC-327",
        leetcode_url=_LC + "count-of-range-sum/",
        topology_kind=_STAR,
        optimal_topology="Star (all agents → leader) then broadcast",
        input_summary="L = 30N ints U[0, 1000]",
        ground_truth_summary="#x with 100 ≤ x ≤ 500; int",
        shard_rule="contiguous",
        verification_hint="every agent submits the global range count",
    )
)
def gen_i05(rng: random.Random, n: int) -> Generated:
    data = [rng.randint(0, 1000) for _ in range(30 * n)]
    count = sum(1 for x in data if RANGE_LO <= x <= RANGE_HI)
    desc = f"""**Task: Range Count**

Count how many numbers in the global dataset fall within the range [{RANGE_LO}, {RANGE_HI}] (inclusive).

**Your Data:**
You (Agent {{agent_id}}) hold: {{input_shard}}

**Algorithm:**
1. Count how many numbers in your local data satisfy {RANGE_LO} ≤ x ≤ {RANGE_HI}
2. Coordinate with the other agents to compute the global count

**Output:**
A single integer: the total count of numbers in range [{RANGE_LO}, {RANGE_HI}].

**Communication Protocol:**
{_TOPOLOGY_LINE}
All agents must submit the same final answer using submit_result(total_count)."""
    return Generated(contiguous_shards(data, n), count, desc, f"{2 * (n - 1)} messages")


@register(
    TaskInfo(
        task_id="I-06",
        name="Checksum XOR",
        level=1,
        is_segmented=False,
        leetcode_ref="LC-136",
        leetcode_url=_LC + "single-number/",
        topology_kind=_STAR,
        optimal_topology="Star (all agents → leader) then broadcast",
        input_summary="L = 20N ints U[0, 255]",
        ground_truth_summary="XOR of all; int",
        shard_rule="contiguous",
        verification_hint="every agent submits the XOR of all bytes",
    )
)
def gen_i06(rng: random.Random, n: int) -> Generated:
    data = [rng.randint(0, 255) for _ in range(20 * n)]
    checksum = 0
    for value in data:
        checksum ^= value
    desc = f"""**Task: XOR Checksum**

Compute the XOR checksum of all data bytes across all agents.

**Your Data:**
You (Agent {{agent_id}}) hold: {{input_shard}}

**Algorithm:**
1. Compute your local XOR: local_xor = byte1 ^ byte2 ^ ... ^ byteM
2. Coordinate with the other agents to compute the global XOR
3. XOR is associative and commutative, so global_xor = xor_0 ^ xor_1 ^ ... ^ xor_{{max_id}}

**Output:**
A single integer (0-255): the global XOR checksum.

**Communication Protocol:**
{_TOPOLOGY_LINE}
All agents must submit the same final answer using submit_result(global_checksum)."""
    return Generated(contiguous_shards(data, n), checksum, desc, f"{2 * (n - 1)} messages")


@register(
    TaskInfo(
        task_id="I-07",
        name="Average Value",
        level=1,
        is_segmented=False,
        leetcode_ref="LC-1491",
        leetcode_url=_LC + "average-salary-excluding-the-minimum-and-maximum-salary/",
        topology_kind=_STAR,
        optimal_topology="Star (all agents → leader with (sum, count)) then broadcast",
        input_summary="L = 25N floats U(0, 100)",
        ground_truth_summary="mean rounded to 2 dp; float",
        shard_rule="contiguous",
        verification_hint="every agent submits round(mean, 2)",
    )
)
def gen_i07(rng: random.Random, n: int) -> Generated:
    data = [rng.uniform(0, 100) for _ in range(25 * n)]
    desc = f"""**Task: Global Average**

Compute the average (mean) of all numbers across all agents' data.

**Your Data:**
You (Agent {{agent_id}}) hold: {{input_shard}}

**Algorithm:**
1. Compute local_sum and local_count
2. Coordinate with the other agents to compute global_sum and global_count
3. global_average = global_sum / global_count

**Output:**
A floating-point number: the global average rounded to 2 decimal places.

**Communication Protocol:**
{_TOPOLOGY_LINE}
All agents must submit the same final answer using submit_result(global_average)."""
    return Generated(
        contiguous_shards(data, n), round(sum(data) / len(data), 2), desc, f"{2 * (n - 1)} messages"
    )


@register(
    TaskInfo(
        task_id="I-08",
        name="Set Union Size",
        level=1,
        is_segmented=False,
        leetcode_ref="LC-217",
        leetcode_url=_LC + "contains-duplicate/",
        topology_kind=_STAR,
        optimal_topology="Star or hash-based partitioning, then broadcast",
        input_summary="L = 30N ints drawn with replacement from range(15N)",
        ground_truth_summary="number of distinct values; int",
        shard_rule="contiguous",
        verification_hint="every agent submits len(set(global data))",
    )
)
def gen_i08(rng: random.Random, n: int) -> Generated:
    total = 30 * n
    pool = range(total // 2)
    data = [rng.choice(pool) for _ in range(total)]
    desc = """**Task: Global Distinct Count**

Count the total number of DISTINCT (unique) elements across all agents' data.

**Your Data:**
You (Agent {agent_id}) hold (may contain duplicates): {input_shard}

**Algorithm:**
1. Identify the unique elements of your local data: local_set = set(your_data)
2. Coordinate with the other agents to find the global set of distinct elements
3. Note: an element may appear in several agents' data - global deduplication is needed

**Output:**
A single integer: the total count of distinct elements.

**Communication Protocol:**
Topology: Star/Tree aggregation or hash-based partitioning → broadcast.
All agents must submit the same final answer using submit_result(global_distinct_count)."""
    return Generated(
        contiguous_shards(data, n),
        len(set(data)),
        desc,
        f"{n - 1} to O(N²) depending on strategy, plus broadcast",
    )


@register(
    TaskInfo(
        task_id="I-09",
        name="Top-K Select",
        level=1,
        is_segmented=False,
        leetcode_ref="LC-215",
        leetcode_url=_LC + "kth-largest-element-in-an-array/",
        topology_kind=_STAR,
        optimal_topology="Star (all agents → leader with local top-K) then broadcast",
        input_summary="K = 10; L = 30N ints U[1, 1000]",
        ground_truth_summary="the 10 largest values, descending; list",
        shard_rule="contiguous",
        verification_hint="every agent submits sorted(global data, reverse=True)[:10]",
    )
)
def gen_i09(rng: random.Random, n: int) -> Generated:
    data = [rng.randint(1, 1000) for _ in range(30 * n)]
    k = TOP_K
    desc = f"""**Task: Top-K Selection**

Find the {k} largest values across all agents' data.

**Your Data:**
You (Agent {{agent_id}}) hold: {{input_shard}}

**Algorithm:**
1. Find the top {k} values in your local data
2. Coordinate with the other agents to find the global top-{k}
3. Each agent only needs to send at most {k} values to a coordinator

**Output:**
A list of {k} integers, sorted in descending order.

**Communication Protocol:**
{_TOPOLOGY_LINE}
All agents must submit the same final answer using submit_result([val1, val2, ..., val{k}])."""
    return Generated(
        contiguous_shards(data, n), sorted(data, reverse=True)[:k], desc, f"{2 * (n - 1)} messages"
    )


@register(
    TaskInfo(
        task_id="I-10",
        name="Standard Deviation",
        level=1,
        is_segmented=False,
        leetcode_ref=None,
        leetcode_url=_LC + "average-salary-excluding-the-minimum-and-maximum-salary/",
        topology_kind=_STAR,
        optimal_topology="Star with two-phase protocol and broadcast",
        input_summary="L = 30N floats U(0, 100)",
        ground_truth_summary="population std rounded to 2 dp; float",
        shard_rule="contiguous",
        verification_hint="every agent submits round(pstdev, 2)",
    )
)
def gen_i10(rng: random.Random, n: int) -> Generated:
    data = [rng.uniform(0, 100) for _ in range(30 * n)]
    mean = sum(data) / len(data)
    variance = sum((x - mean) ** 2 for x in data) / len(data)
    desc = """**Task: Standard Deviation (Two-Phase)**

Compute the population standard deviation of all numbers across all agents' data.

**Your Data:**
You (Agent {agent_id}) hold: {input_shard}

**Algorithm (Two Phases):**
**Phase 1: Compute the Global Mean**
- Calculate local_sum and local_count
- Coordinate to compute global_mean = total_sum / total_count

**Phase 2: Compute the Variance**
- Calculate your local contribution: sum((x - global_mean)² for x in local_data)
- Coordinate to sum all contributions
- std_dev = sqrt(total_contribution / total_count)

**Output:**
A floating-point number rounded to 2 decimal places.

**Communication Protocol:**
Topology: Star/Tree with a two-phase protocol → broadcast after each phase.
All agents must submit the same final answer using submit_result(std_dev)."""
    return Generated(
        contiguous_shards(data, n),
        round(math.sqrt(variance), 2),
        desc,
        f"2 × {2 * (n - 1)} = {4 * (n - 1)} messages (two rounds, each collect + broadcast)",
    )
