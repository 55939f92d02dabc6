"""Level II (Paradigm II, structured mesh) generators: II-11 … II-20.

Agents hold consecutive segments in agent order (the authors' sharding rule, jwyjohn/acl26-silo-bench
`benchmark_generator/paradigm_ii.py`), except II-18 whose linked-list records are scattered by a second
shuffle. The optimal topology is a chain: each agent talks to its neighbours only, O(N) messages. Segmented
answers: II-11, II-14, II-20 (each agent submits its own slice). Random draws follow the authors'
`benchmark_generator/paradigm_ii.py` (jwyjohn/acl26-silo-bench) in their order (parity mode).
"""

from __future__ import annotations

import random
import string

from posttrain_lab.benchmarks.silo.tasks._base import Generated, TaskInfo, contiguous_shards, register

_CHAIN = "chain"
_LC = "https://leetcode.com/problems/"

PALINDROME = "racecar"
LIFE_STEPS = 5
PATTERN_ALPHABET = ("A", "B", "C", "D", "X", "Y", "Z")


def block_hash(prev_hash: int, block: str) -> int:
    """II-20 hash step: h_i = ((Σ ord(c) over block i) mod 10000 XOR h_{i−1}) mod 10000 (the authors'
    `_generate_ii20_pipeline_hash`)."""
    return ((sum(ord(c) for c in block) % 10000) ^ prev_hash) % 10000


def life_step(cells: list[int]) -> list[int]:
    """II-14 rule (the authors' `_generate_ii14_life_game`): new cell = 1 iff left + self + right == 1;
    out-of-range neighbours are 0."""
    padded = [0, *cells, 0]
    return [1 if padded[i - 1] + padded[i] + padded[i + 1] == 1 else 0 for i in range(1, len(padded) - 1)]


def pattern_count(text: str) -> int:
    """II-15 greedy state machine (the authors' `_generate_ii15_pattern_search`): 0 →A→ 1 →B→ 2 →C→ count +=
    1, back to 0."""
    state = count = 0
    for ch in text:
        if state == 0 and ch == "A":
            state = 1
        elif state == 1 and ch == "B":
            state = 2
        elif state == 2 and ch == "C":
            count += 1
            state = 0
    return count


def longest_palindrome_length(text: str) -> int:
    """II-13: length of the longest palindromic substring, by expanding around all 2L − 1 centres
    (O(L²) worst case; the authors' brute force is O(L³))."""
    best = 1 if text else 0
    n = len(text)
    for centre in range(2 * n - 1):
        lo, hi = centre // 2, centre // 2 + centre % 2
        while lo >= 0 and hi < n and text[lo] == text[hi]:
            lo -= 1
            hi += 1
        best = max(best, hi - lo - 1)
    return best


def trapped_water(heights: list[int]) -> int:
    """II-16: Σ_i min(max(h[..i]), max(h[i..])) − h[i] with prefix/suffix maximum arrays."""
    if not heights:
        return 0
    left = list(heights)
    for i in range(1, len(left)):
        left[i] = max(left[i - 1], heights[i])
    right = list(heights)
    for i in range(len(right) - 2, -1, -1):
        right[i] = max(right[i + 1], heights[i])
    return sum(min(lo, hi) - h for lo, hi, h in zip(left, right, heights, strict=True))


def _slices(values: list, n: int) -> list[list]:
    return contiguous_shards(values, n)


def _chain_tail(n: int) -> str:
    return f"{2 * (n - 1)} for boundaries + O(N) for sharing = O(N)"


@register(
    TaskInfo(
        task_id="II-11",
        name="Prefix Sum",
        level=2,
        is_segmented=True,
        leetcode_ref="LC-1480",
        leetcode_url=_LC + "running-sum-of-1d-array/",
        topology_kind=_CHAIN,
        optimal_topology="Chain (Agent 0 → 1 → 2 → ... → N-1)",
        input_summary="L = 15N ints U[1, 50]",
        ground_truth_summary="running sums; agent i submits its 15-element slice",
        shard_rule="contiguous",
        verification_hint="concat(agent answers) == running sums of the global array",
    )
)
def gen_ii11(rng: random.Random, n: int) -> Generated:
    data = [rng.randint(1, 50) for _ in range(15 * n)]
    running, total = [], 0
    for value in data:
        total += value
        running.append(total)
    desc = """**Task: Prefix Sum (Cumulative Sum)**

Compute the prefix sum (cumulative sum) of the entire array.

**Agent Ordering:**
Agent 0 → Agent 1 → ... → Agent {max_id} (sequential segments)

**Your Data (Position {agent_id}):**
{input_shard}

**Algorithm:**
- prefix_sum[i] = sum of all elements from index 0 to i
- You need the TOTAL SUM of all previous agents' data to offset your local prefix sums

**Output:**
Each agent submits ITS OWN portion of the prefix-sum array.

**Communication Protocol:**
Topology: Chain (0 → 1 → 2 → ... → {max_id}). Communicate with neighbours only.
Each agent submits its own segment using submit_result(your_prefix_sum_segment)."""
    return Generated(
        contiguous_shards(data, n), _slices(running, n), desc, f"{n - 1} messages (one per chain link)"
    )


@register(
    TaskInfo(
        task_id="II-12",
        name="Moving Average",
        level=2,
        is_segmented=False,
        leetcode_ref="LC-346",
        leetcode_url=_LC + "moving-average-from-data-stream/",
        topology_kind=_CHAIN,
        optimal_topology="Chain with bidirectional boundary exchange, then share result",
        input_summary="L = 15N ints U[1, 100]",
        ground_truth_summary="centred window-3 means at positions 1..L-2, each rounded to 2 dp; list of L-2",
        shard_rule="contiguous",
        verification_hint="every agent submits the full window-3 moving-average list",
    )
)
def gen_ii12(rng: random.Random, n: int) -> Generated:
    data = [rng.randint(1, 100) for _ in range(15 * n)]
    averages = [round((data[i - 1] + data[i] + data[i + 1]) / 3.0, 2) for i in range(1, len(data) - 1)]
    desc = """**Task: Moving Average (Window = 3)**

Compute a moving average with window size 3 for all valid positions.

**Agent Ordering:**
Agents in a LINE: 0 ↔ 1 ↔ 2 ↔ ... ↔ {max_id} (consecutive data)

**Your Data (Position {agent_id}):**
{input_shard}

**Algorithm:**
For each element except the global first and last: avg = (prev + curr + next) / 3, rounded to 2 decimals
- You need BOUNDARY elements from your neighbours to compute the averages at your segment's edges

**Output:**
The complete moving-average array (excluding the first and last positions).

**Communication Protocol:**
Topology: Chain (0 ↔ 1 ↔ ... ↔ {max_id}). Exchange boundaries with neighbours.
All agents must submit the same final answer using submit_result(global_moving_averages)."""
    return Generated(contiguous_shards(data, n), averages, desc, _chain_tail(n))


@register(
    TaskInfo(
        task_id="II-13",
        name="Longest Palindrome",
        level=2,
        is_segmented=False,
        leetcode_ref="LC-5",
        leetcode_url=_LC + "longest-palindromic-substring/",
        topology_kind=_CHAIN,
        optimal_topology="Chain with prefix/suffix exchange, then broadcast result",
        input_summary="L = 15N random lowercase letters with 'racecar' written at a random position",
        ground_truth_summary="length of the longest palindromic substring; int",
        shard_rule="contiguous (by characters)",
        verification_hint="every agent submits the longest palindromic substring length",
    )
)
def gen_ii13(rng: random.Random, n: int) -> Generated:
    chars = [rng.choice(string.ascii_lowercase) for _ in range(15 * n)]
    at = rng.randint(0, len(chars) - len(PALINDROME))
    chars[at : at + len(PALINDROME)] = PALINDROME
    text = "".join(chars)
    desc = """**Task: Longest Palindrome (Cross-Boundary)**

Find the length of the longest palindromic substring, including palindromes spanning agent boundaries.

**Agent Ordering:**
Agents hold CONSECUTIVE parts of one string: 0 → 1 → ... → {max_id}

**Your Data (Position {agent_id}):**
String segment: {input_shard}

**Algorithm:**
1. Find the longest palindrome within your local segment
2. Exchange BOUNDARY CHARACTERS with neighbours to detect cross-boundary palindromes
3. Coordinate to find the global maximum length

**Output:**
A single integer: the length of the longest palindrome.

**Communication Protocol:**
Topology: Chain (0 ↔ 1 ↔ ... ↔ {max_id}). Exchange prefix/suffix with neighbours.
All agents must submit the same final answer using submit_result(max_palindrome_length)."""
    return Generated(contiguous_shards(text, n), longest_palindrome_length(text), desc, _chain_tail(n))


@register(
    TaskInfo(
        task_id="II-14",
        name="1D Life Game",
        level=2,
        is_segmented=True,
        leetcode_ref="LC-289",
        leetcode_url=_LC + "game-of-life/",
        topology_kind=_CHAIN,
        optimal_topology="Chain with repeated boundary exchange",
        input_summary="L = 10N bits U{0, 1}; 5 steps",
        ground_truth_summary="state after 5 steps (cell = 1 iff left + self + right == 1); agent i submits its 10 cells",
        shard_rule="contiguous",
        verification_hint="concat(agent answers) == automaton state after 5 steps",
    )
)
def gen_ii14(rng: random.Random, n: int) -> Generated:
    state = [rng.randint(0, 1) for _ in range(10 * n)]
    final = state
    for _ in range(LIFE_STEPS):
        final = life_step(final)
    desc = f"""**Task: 1D Life Game (Cellular Automaton)**

Simulate a 1D cellular automaton for {LIFE_STEPS} steps.

**Agent Ordering:**
Agents arranged sequentially: 0 ↔ 1 ↔ 2 ↔ ... ↔ {{max_id}}

**Your Data (Position {{agent_id}}):**
Initial segment: {{input_shard}}

**Algorithm:**
- Each cell's next state depends on (left, self, right); cells beyond the global ends count as 0
- Rule: a cell becomes 1 iff exactly one of (left, self, right) is 1
- Exchange boundary cells with neighbours at EACH step

**Output:**
Each agent submits its own final segment after {LIFE_STEPS} steps.

**Communication Protocol:**
Topology: Chain (0 ↔ 1 ↔ ... ↔ {{max_id}}). Repeated boundary exchange.
Each agent submits its own segment using submit_result(your_final_segment)."""
    return Generated(
        contiguous_shards(state, n),
        _slices(final, n),
        desc,
        f"O({LIFE_STEPS} * (N-1)) = {LIFE_STEPS * (n - 1)}",
    )


@register(
    TaskInfo(
        task_id="II-15",
        name="Pattern Search",
        level=2,
        is_segmented=False,
        leetcode_ref="LC-392",
        leetcode_url=_LC + "is-subsequence/",
        topology_kind=_CHAIN,
        optimal_topology="Chain with state passing (0 → 1 → 2 → ...), then broadcast result",
        input_summary="L = 20N chars over {A,B,C,D,X,Y,Z}; twice: A at p, B at p+U[1,5], C at p+U[6,10]",
        ground_truth_summary="greedy A→B→C state-machine match count; int",
        shard_rule="contiguous (by characters)",
        verification_hint="every agent submits the greedy A...B...C count",
    )
)
def gen_ii15(rng: random.Random, n: int) -> Generated:
    chars = [rng.choice(PATTERN_ALPHABET) for _ in range(20 * n)]
    for _ in range(2):
        pos = rng.randint(0, len(chars) - 15)
        chars[pos] = "A"
        chars[pos + rng.randint(1, 5)] = "B"
        chars[pos + rng.randint(6, 10)] = "C"
    text = "".join(chars)
    desc = """**Task: Subsequence Pattern Search**

Count how many times the subsequence pattern "A...B...C" appears in the global string
(A followed eventually by B followed eventually by C).

**Agent Ordering:**
Agents hold CONSECUTIVE parts: 0 → 1 → 2 → ... → {max_id}

**Your Data (Position {agent_id}):**
String segment: {input_shard}

**Algorithm:**
Track a state machine: 0 (looking for A) → 1 (found A, looking for B) → 2 (found B, looking for C);
in state 2 a C completes one match and resets the state to 0
- The state must be PASSED FORWARD through the chain (pipeline pattern)

**Output:**
A single integer: the number of "A...B...C" matches.

**Communication Protocol:**
Topology: Chain (0 → 1 → 2 → ... → {max_id}). Pass state forward.
All agents must submit the same final answer using submit_result(total_pattern_count)."""
    return Generated(
        contiguous_shards(text, n), pattern_count(text), desc, f"{n - 1} for pipeline + O(N) for sharing"
    )


@register(
    TaskInfo(
        task_id="II-16",
        name="Trapping Rain",
        level=2,
        is_segmented=False,
        leetcode_ref="LC-42",
        leetcode_url=_LC + "trapping-rain-water/",
        topology_kind=_CHAIN,
        optimal_topology="Chain with bidirectional pass, then aggregate and broadcast",
        input_summary="L = 10N ints U[0, 10]; positions 1, 6, 11, … (< L-1) reset to U[0, 3]",
        ground_truth_summary="total trapped water; int",
        shard_rule="contiguous",
        verification_hint="every agent submits the total trapped water",
    )
)
def gen_ii16(rng: random.Random, n: int) -> Generated:
    heights = [rng.randint(0, 10) for _ in range(10 * n)]
    for i in range(1, len(heights) - 1, 5):
        heights[i] = rng.randint(0, 3)
    desc = """**Task: Trapping Rain Water**

Given an elevation map, compute how much water is trapped after raining.

**Agent Ordering:**
Agents hold CONSECUTIVE segments: 0 ↔ 1 ↔ ... ↔ {max_id}

**Your Data (Position {agent_id}):**
Elevation heights: {input_shard}

**Algorithm:**
- water_at_i = min(max_height_to_left, max_height_to_right) - height[i]
- Requires TWO PASSES: left-to-right (left_max) and right-to-left (right_max)

**Output:**
A single integer: the total trapped water units.

**Communication Protocol:**
Topology: Chain (0 ↔ 1 ↔ ... ↔ {max_id}). Bidirectional pass.
All agents must submit the same final answer using submit_result(total_water)."""
    return Generated(
        contiguous_shards(heights, n),
        trapped_water(heights),
        desc,
        f"{2 * (n - 1)} for passes + O(N) for sharing",
    )


@register(
    TaskInfo(
        task_id="II-17",
        name="Diff Array",
        level=2,
        is_segmented=False,
        leetcode_ref="LC-1094",
        leetcode_url=_LC + "car-pooling/",
        topology_kind=_CHAIN,
        optimal_topology="Chain (each agent → next agent), then collect and broadcast",
        input_summary="L = 15N ints U[1, 100]",
        ground_truth_summary="[a[i] - a[i-1] for i >= 1]; list of L-1",
        shard_rule="contiguous",
        verification_hint="every agent submits the full difference array",
    )
)
def gen_ii17(rng: random.Random, n: int) -> Generated:
    data = [rng.randint(1, 100) for _ in range(15 * n)]
    diffs = [data[i] - data[i - 1] for i in range(1, len(data))]
    desc = """**Task: Difference Array**

Compute the difference array: diff[i] = arr[i] - arr[i-1] for all i >= 1.

**Agent Ordering:**
Agents hold CONSECUTIVE elements: 0 → 1 → ... → {max_id}

**Your Data (Position {agent_id}):**
{input_shard}

**Algorithm:**
- Compute the differences within your segment
- The first element of your segment needs the LAST element of the previous agent

**Output:**
The complete difference array (length = total elements - 1).

**Communication Protocol:**
Topology: Chain (0 → 1 → ... → {max_id}). Get the boundary from the left neighbour.
All agents must submit the same final answer using submit_result(global_diff_array)."""
    return Generated(contiguous_shards(data, n), diffs, desc, f"{n - 1} for boundaries + O(N) for sharing")


@register(
    TaskInfo(
        task_id="II-18",
        name="List Ranking",
        level=2,
        is_segmented=False,
        leetcode_ref="LC-542",
        leetcode_url=_LC + "linked-list-cycle/",
        topology_kind=_CHAIN,
        optimal_topology="Chain or pointer-jumping tree",
        input_summary="8N node ids; shuffle 1 fixes the chain order (next pointers, last -> -1); "
        "shuffle 2 scatters {id, next} records",
        ground_truth_summary="dict node_id (str) -> 0-based rank from the head",
        shard_rule="second shuffle, then contiguous chunks of 8 records",
        verification_hint="every agent submits {node_id: rank} for all nodes",
    )
)
def gen_ii18(rng: random.Random, n: int) -> Generated:
    total = 8 * n
    order = list(range(total))
    rng.shuffle(order)  # shuffle 1: the logical chain order
    nxt = {node: order[i + 1] for i, node in enumerate(order[:-1])}
    nxt[order[-1]] = -1
    head = order[0]
    scattered = list(order)
    rng.shuffle(scattered)  # shuffle 2: which agent holds which record
    shards = [
        [{"id": node, "next": nxt[node]} for node in chunk] for chunk in contiguous_shards(scattered, n)
    ]
    ranks, node, rank = {}, head, 0
    while node != -1:
        ranks[str(node)] = rank
        node, rank = nxt[node], rank + 1
    desc = f"""**Task: List Ranking (Rank from Head)**

Reconstruct a distributed linked list and compute each node's rank from the head.

**Data Distribution:**
- Total nodes: {total}, SCATTERED across agents
- Each node has an "id" and a "next" pointer (-1 marks the end)
- All nodes form ONE logical chain

**Your Data:**
Agent {{agent_id}} holds: {{input_shard}}

**Algorithm:**
1. Reconstruct the logical chain starting from the head node
2. Compute each node's rank (head = 0, next = 1, ...)

**Output:**
A dictionary mapping node_id to its rank: {{node_id: rank, ...}}

**Communication Protocol:**
Topology: Share pointers to reconstruct the chain, then broadcast the ranks.
All agents must submit the same final answer using submit_result({{node_id: rank, ...}})."""
    return Generated(shards, ranks, desc, "O(N) to share pointers + O(log N) pointer jumping")


@register(
    TaskInfo(
        task_id="II-19",
        name="Merge Neighbors",
        level=2,
        is_segmented=False,
        leetcode_ref=None,
        leetcode_url=_LC + "remove-duplicates-from-sorted-array/",
        topology_kind=_CHAIN,
        optimal_topology="Chain with boundary comparison, then collect and broadcast",
        input_summary="L = 15N ints U[1, 50], sorted globally",
        ground_truth_summary="consecutive de-duplication (= sorted unique values); list",
        shard_rule="contiguous",
        verification_hint="every agent submits the de-duplicated sorted array",
    )
)
def gen_ii19(rng: random.Random, n: int) -> Generated:
    data = sorted(rng.randint(1, 50) for _ in range(15 * n))
    deduped = [v for i, v in enumerate(data) if i == 0 or v != data[i - 1]]
    desc = """**Task: Deduplicate Consecutive Elements**

Given sorted consecutive segments, remove consecutive duplicate elements globally.

**Agent Ordering:**
Agents hold SORTED CONSECUTIVE segments: 0 → 1 → ... → {max_id}

**Your Data (Position {agent_id}):**
Sorted segment: {input_shard}

**Algorithm:**
1. Remove consecutive duplicates within your segment
2. Check the boundaries with your neighbours to remove cross-boundary duplicates

**Output:**
A sorted array with no consecutive duplicates.

**Communication Protocol:**
Topology: Chain (0 ↔ 1 ↔ ... ↔ {max_id}). Compare boundaries with neighbours.
All agents must submit the same final answer using submit_result(global_deduped_array)."""
    return Generated(contiguous_shards(data, n), deduped, desc, _chain_tail(n))


@register(
    TaskInfo(
        task_id="II-20",
        name="Pipeline Hash",
        level=2,
        is_segmented=True,
        leetcode_ref=None,
        leetcode_url="https://en.wikipedia.org/wiki/Blockchain",
        topology_kind=_CHAIN,
        optimal_topology="Chain with strict sequential processing",
        input_summary='L = 5N blocks "Block_{i}_Data"',
        ground_truth_summary="h_i = ((Σ ord(block i)) mod 10000 XOR h_{i-1}) mod 10000, h_{-1} = 0; "
        "agent i submits its 5 hashes",
        shard_rule="contiguous",
        verification_hint="concat(agent answers) == the hash chain",
    )
)
def gen_ii20(rng: random.Random, n: int) -> Generated:
    blocks = [f"Block_{i}_Data" for i in range(5 * n)]
    hashes, h = [], 0
    for block in blocks:
        h = block_hash(h, block)
        hashes.append(h)
    desc = """**Task: Pipeline Hash (Blockchain Simulation)**

Compute a hash chain in which each block's hash depends on the previous block's hash.

**Agent Ordering:**
Agents hold CONSECUTIVE blocks: 0 → 1 → 2 → ... → {max_id}

**Your Data (Position {agent_id}):**
Blocks: {input_shard}

**Algorithm:**
hash[i] = ((sum of the ASCII codes of block[i]) % 10000 XOR hash[i-1]) % 10000
hash[-1] = 0 (genesis), so hash[0] = sum of the ASCII codes of block[0] % 10000
- Agent i needs the FINAL HASH of Agent i-1 to start computing

**Output:**
Each agent submits its portion of the hash values.

**Communication Protocol:**
Topology: Chain (0 → 1 → 2 → ... → {max_id}). Strict sequential dependency.
Each agent submits its own segment using submit_result(your_computed_hashes)."""
    return Generated(
        contiguous_shards(blocks, n), _slices(hashes, n), desc, f"{n - 1} messages (hash pipeline)"
    )
