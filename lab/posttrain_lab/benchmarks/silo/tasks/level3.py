"""Level III (Paradigm III, global shuffle) generators: III-21 … III-30.

The data is shuffled before the default contiguous sharding (jwyjohn/acl26-silo-bench
`benchmark_generator/paradigm_iii.py`), except III-27 (tagged user/item records, shuffled then grouped per
agent), III-29 (agent 0 holds all heavy tasks) and III-30 (one row of A plus the full B per agent). Optimal
topologies are all-to-all / shuffle: O(N log N)–O(N²) messages. Segmented answer: III-21 only. Random draws
follow the authors' `benchmark_generator/paradigm_iii.py` in their order (parity mode).
"""

from __future__ import annotations

import json
import math
import random

from posttrain_lab.benchmarks.silo.tasks._base import Generated, TaskInfo, contiguous_shards, register

_ALL = "all-to-all"
_LC = "https://leetcode.com/problems/"

KMEANS_K = 3
CF_TOP_K = 3
CF_DIM = 5
DAMPING = 0.85


def _random_edges(rng: random.Random, num_nodes: int, *, skip_duplicates: bool, undirected: bool):
    """2V attempts u, v ~ U[0, V-1]; self-loops dropped; with `skip_duplicates` an edge is skipped when v
    is already in u's adjacency list (for undirected graphs that list holds both directions)."""
    adjacency: dict[int, list[int]] = {i: [] for i in range(num_nodes)}
    edges = []
    for _ in range(2 * num_nodes):
        u = rng.randint(0, num_nodes - 1)
        v = rng.randint(0, num_nodes - 1)
        if u == v or (skip_duplicates and v in adjacency[u]):
            continue
        adjacency[u].append(v)
        if undirected:
            adjacency[v].append(u)
        edges.append([u, v])
    return edges, adjacency


def count_components(num_nodes: int, edges: list[list[int]]) -> int:
    """III-23: connected components (isolated nodes included) by union-find with path halving."""
    parent = list(range(num_nodes))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for u, v in edges:
        ru, rv = find(u), find(v)
        if ru != rv:
            parent[ru] = rv
    return sum(1 for x in range(num_nodes) if find(x) == x)


def pagerank_step(num_nodes: int, adjacency: dict[int, list[int]], damping: float = DAMPING) -> list[float]:
    """III-28: one iteration r'(v) = (1 − d)/V + d · Σ_{u→v} r(u)/outdeg(u) from r = 1/V, without
    redistributing the mass of dangling nodes (the authors' `_generate_iii28_pagerank`). Accumulates in node
    order, like the authors."""
    rank0 = 1.0 / num_nodes
    new = [(1 - damping) / num_nodes] * num_nodes
    for u in range(num_nodes):
        if adjacency[u]:
            share = damping * rank0 / len(adjacency[u])
            for v in adjacency[u]:
                new[v] += share
    return new


def lpt_stats(durations: list[int], num_agents: int) -> dict[str, float | int]:
    """III-29: LPT greedy (sort by duration descending, stable; each task to the least-loaded agent,
    ties → smallest id), then {variance: round(mean((load − total/N)²), 2), max_load, min_load}."""
    loads = [0] * num_agents
    for d in sorted(durations, reverse=True):
        target = min(range(num_agents), key=lambda i: loads[i])
        loads[target] += d
    mean = sum(durations) / num_agents
    variance = sum((load - mean) ** 2 for load in loads) / num_agents
    return {"variance": round(variance, 2), "max_load": max(loads), "min_load": min(loads)}


@register(
    TaskInfo(
        task_id="III-21",
        name="Distributed Sort",
        level=3,
        is_segmented=True,
        leetcode_ref="LC-912",
        leetcode_url=_LC + "sort-an-array/",
        topology_kind=_ALL,
        optimal_topology="All-to-all or sample-based partitioning",
        input_summary="L = 20N ints U[1, 1000], shuffled",
        ground_truth_summary="sorted(data) cut with the same chunking; agent i submits sorted slice i",
        shard_rule="shuffle, then contiguous",
        verification_hint="concat(agent answers) == sorted(global data), cut like the input",
    )
)
def gen_iii21(rng: random.Random, n: int) -> Generated:
    data = [rng.randint(1, 1000) for _ in range(20 * n)]
    rng.shuffle(data)
    desc = """**Task: Distributed Sorting**

Sort the global dataset so that Agent 0 holds the smallest values and Agent {max_id} the largest;
every agent ends up with as many values as it holds now.

**Data Distribution:**
RANDOM - your data may belong to other agents' final ranges.

**Your Data (RANDOM):**
Agent {agent_id} holds: {input_shard}

**Algorithm:**
1. Determine the value range of each agent
2. SHUFFLE data between agents
3. Each agent sorts its final range

**Output:**
Each agent submits its sorted portion (the concatenation in agent order must be fully sorted).

**Communication Protocol:**
Topology: All-to-All / hash-based shuffle. Global data exchange required.
Each agent submits its own segment using submit_result(your_sorted_range)."""
    return Generated(
        contiguous_shards(data, n),
        contiguous_shards(sorted(data), n),
        desc,
        "O(N) to O(N²) depending on strategy",
    )


@register(
    TaskInfo(
        task_id="III-22",
        name="Median of Medians",
        level=3,
        is_segmented=False,
        leetcode_ref="LC-295",
        leetcode_url=_LC + "find-median-from-data-stream/",
        topology_kind=_ALL,
        optimal_topology="Iterative broadcast and aggregation",
        input_summary="L = 25N ints U[1, 1000], shuffled",
        ground_truth_summary="sorted(data)[L // 2] (upper median); int",
        shard_rule="shuffle, then contiguous",
        verification_hint="every agent submits sorted(global data)[L // 2]",
    )
)
def gen_iii22(rng: random.Random, n: int) -> Generated:
    total = 25 * n
    data = [rng.randint(1, 1000) for _ in range(total)]
    rng.shuffle(data)
    median_idx = total // 2
    desc = f"""**Task: Global Median (Iterative)**

Find the median value without collecting all the data (use iterative consensus).

**Data Distribution:**
RANDOM across agents. Total elements: {total}, median at position {median_idx} (0-based, in sorted order).

**Your Data (RANDOM):**
Agent {{agent_id}} holds: {{input_shard}}

**Algorithm (Iterative):**
1. Each agent computes its local median / quantiles
2. Estimate a global pivot from the local medians
3. Each agent counts its values < pivot, = pivot, > pivot
4. Determine which range contains the median; repeat until convergence

**Output:**
A single integer: the global median.

**Communication Protocol:**
Topology: All-to-All. Multiple rounds of coordination required.
All agents must submit the same final answer using submit_result(median_value)."""
    return Generated(
        contiguous_shards(data, n), sorted(data)[median_idx], desc, "O(N log N) - multiple rounds"
    )


@register(
    TaskInfo(
        task_id="III-23",
        name="Graph Components",
        level=3,
        is_segmented=False,
        leetcode_ref="LC-323",
        leetcode_url=_LC + "number-of-connected-components-in-an-undirected-graph/",
        topology_kind=_ALL,
        optimal_topology="Hash-based partitioning or all-to-all coordination",
        input_summary="V = 10N nodes; 2V attempts (u, v), kept if u != v (duplicates allowed)",
        ground_truth_summary="number of connected components incl. isolated nodes; int",
        shard_rule="edges shuffled, then contiguous",
        verification_hint="every agent submits the number of connected components",
    )
)
def gen_iii23(rng: random.Random, n: int) -> Generated:
    num_nodes = 10 * n
    edges, _ = _random_edges(rng, num_nodes, skip_duplicates=False, undirected=True)
    rng.shuffle(edges)
    desc = f"""**Task: Graph Connected Components**

Find the number of connected components of an undirected graph whose edges are randomly distributed.

**Data Distribution:**
Total nodes: {num_nodes} (ids 0..{num_nodes - 1}; nodes without edges are components of their own).
Edges RANDOMLY distributed across agents.

**Your Data (RANDOM edges):**
Agent {{agent_id}} holds: {{input_shard}} (each edge is a pair [u, v])

**Algorithm:**
Use Union-Find. Coordinate to merge components connected through edges held by different agents.

**Output:**
A single integer: the number of connected components.

**Communication Protocol:**
Topology: All-to-All or hash-based. Share component membership information.
All agents must submit the same final answer using submit_result(component_count)."""
    return Generated(
        contiguous_shards(edges, n), count_components(num_nodes, edges), desc,
        "O(N) to O(N²) depending on coordination strategy",
    )  # fmt: skip


@register(
    TaskInfo(
        task_id="III-24",
        name="BFS Distance",
        level=3,
        is_segmented=False,
        leetcode_ref="LC-542",
        leetcode_url=_LC + "01-matrix/",
        topology_kind=_ALL,
        optimal_topology="Dynamic message routing along graph edges",
        input_summary="V = 8N; 2V attempts; undirected; edge skipped if v is already adjacent to u",
        ground_truth_summary="dict node (str) -> hop distance from node 0, -1 if unreachable",
        shard_rule="edges shuffled, then contiguous",
        verification_hint="every agent submits the full BFS distance dict from node 0",
    )
)
def gen_iii24(rng: random.Random, n: int) -> Generated:
    num_nodes = 8 * n
    edges, adjacency = _random_edges(rng, num_nodes, skip_duplicates=True, undirected=True)
    rng.shuffle(edges)
    dist = [-1] * num_nodes
    dist[0] = 0
    frontier = [0]
    while frontier:  # level-synchronous BFS
        nxt = []
        for u in frontier:
            for v in adjacency[u]:
                if dist[v] == -1:
                    dist[v] = dist[u] + 1
                    nxt.append(v)
        frontier = nxt
    desc = f"""**Task: BFS Distance (Single-Source Shortest Path)**

Compute the shortest hop distance from source node 0 to every node of an unweighted, undirected graph.

**Data Distribution:**
Total nodes: {num_nodes} (ids 0..{num_nodes - 1}). Edges RANDOMLY distributed. Source: node 0.

**Your Data (RANDOM edges):**
Agent {{agent_id}} holds: {{input_shard}}

**Algorithm:**
BFS wave propagation. Messages must propagate along edges held by different agents.

**Output:**
A dictionary mapping every node_id to its distance from the source (-1 if unreachable).

**Communication Protocol:**
Topology: Multi-hop message passing along the graph structure.
All agents must submit the same final answer using submit_result(complete_distance_dict)."""
    answer = {str(v): d for v, d in enumerate(dist)}
    return Generated(contiguous_shards(edges, n), answer, desc, "O(N × E) - proportional to graph edges")


@register(
    TaskInfo(
        task_id="III-25",
        name="K-Means Iteration",
        level=3,
        is_segmented=False,
        leetcode_ref="LC-296",
        leetcode_url=_LC + "best-meeting-point/",
        topology_kind=_ALL,
        optimal_topology="Shuffle by cluster ID or all-to-all",
        input_summary="K = 3; 20N points U(0, 100)²; 3 initial centroids U(0, 100)² stated in the prompt",
        ground_truth_summary="one Lloyd step (ties -> lowest k; empty cluster keeps its centroid), "
        "centroids rounded to 2 dp; list of 3 [x, y]",
        shard_rule="points shuffled, then contiguous",
        verification_hint="every agent submits the 3 updated centroids",
    )
)
def gen_iii25(rng: random.Random, n: int) -> Generated:
    points = [[rng.uniform(0, 100), rng.uniform(0, 100)] for _ in range(20 * n)]
    centroids = [[rng.uniform(0, 100), rng.uniform(0, 100)] for _ in range(KMEANS_K)]
    rng.shuffle(points)
    members: list[list[list[float]]] = [[] for _ in range(KMEANS_K)]
    for p in points:
        best = min(range(KMEANS_K), key=lambda k: math.hypot(p[0] - centroids[k][0], p[1] - centroids[k][1]))
        members[best].append(p)
    new = []
    for k in range(KMEANS_K):
        cluster = members[k]
        if cluster:
            cx = sum(p[0] for p in cluster) / len(cluster)
            cy = sum(p[1] for p in cluster) / len(cluster)
        else:
            cx, cy = centroids[k]
        new.append([round(cx, 2), round(cy, 2)])
    desc = f"""**Task: K-Means Clustering (One Iteration)**

Perform ONE iteration of K-Means (Euclidean distance) to update {KMEANS_K} cluster centroids.

**Data Distribution:**
2D points RANDOMLY distributed. Initial centroids: {json.dumps(centroids)}

**Your Data (RANDOM points):**
Agent {{agent_id}} holds: {{input_shard}}

**Algorithm:**
1. Assign each point to its nearest initial centroid (ties go to the lower centroid index)
2. Compute each new centroid as the mean of its assigned points (a cluster with no points keeps its
   initial centroid); round the coordinates to 2 decimal places
3. Aggregate statistics across agents (sum_x, sum_y, count per cluster)

**Output:**
A list of {KMEANS_K} centroids: [[x0, y0], [x1, y1], [x2, y2]]

**Communication Protocol:**
Topology: All-to-All or cluster-based shuffle. Aggregate by cluster ID.
All agents must submit the same final answer using submit_result([[x0, y0], ...])."""
    return Generated(
        contiguous_shards(points, n), new, desc, f"O(K × N) = O({KMEANS_K * n}) cluster statistics",
        extra={"initial_centroids": centroids},
    )  # fmt: skip


@register(
    TaskInfo(
        task_id="III-26",
        name="Global Distinct",
        level=3,
        is_segmented=False,
        leetcode_ref="LC-349",
        leetcode_url=_LC + "intersection-of-two-arrays/",
        topology_kind=_ALL,
        optimal_topology="Hash-based shuffle (all-to-all by hash)",
        input_summary="L = 30N ints with replacement from range(15N), shuffled",
        ground_truth_summary="number of distinct values; int",
        shard_rule="shuffle, then contiguous",
        verification_hint="every agent submits len(set(global data))",
    )
)
def gen_iii26(rng: random.Random, n: int) -> Generated:
    total = 30 * n
    pool = range(total // 2)
    data = [rng.choice(pool) for _ in range(total)]
    rng.shuffle(data)
    desc = """**Task: Global Distinct Count (Hash-Based)**

Count the total number of DISTINCT elements using hash-based deduplication.

**Data Distribution:**
RANDOM with duplicates. The same element may appear at several agents.

**Your Data (RANDOM with duplicates):**
Agent {agent_id} holds: {input_shard}

**Algorithm:**
1. Hash-based partitioning: bucket_id = element % {num_agents}
2. SHUFFLE elements to their owner agents
3. Each agent deduplicates its buckets
4. Aggregate the counts

**Output:**
A single integer: the global distinct count.

**Communication Protocol:**
Topology: All-to-All shuffle by hash.
All agents must submit the same final answer using submit_result(global_distinct_count)."""
    return Generated(contiguous_shards(data, n), len(set(data)), desc, "O(N) elements shuffled")


@register(
    TaskInfo(
        task_id="III-27",
        name="Collaborative Filtering",
        level=3,
        is_segmented=False,
        leetcode_ref="LC-1",
        leetcode_url=_LC + "two-sum/",
        topology_kind=_ALL,
        optimal_topology="Broadcast or hash-based partitioning",
        input_summary="3N users + 3N items with 5-dim U(0, 1) vectors; tagged records shuffled",
        ground_truth_summary="top-3 [uid, iid, round(dot, 4)] by rounded score desc "
        "(ties: smaller uid, then smaller iid); list",
        shard_rule='records shuffled, contiguous chunks grouped as {"users": {id: vec}, "items": {id: vec}}',
        verification_hint="every agent submits the top-3 (user, item, score) triples",
    )
)
def gen_iii27(rng: random.Random, n: int) -> Generated:
    num_users = num_items = 3 * n
    users = {i: [rng.uniform(0, 1) for _ in range(CF_DIM)] for i in range(num_users)}
    items = {i: [rng.uniform(0, 1) for _ in range(CF_DIM)] for i in range(num_items)}
    records = [("users", k, v) for k, v in users.items()] + [("items", k, v) for k, v in items.items()]
    rng.shuffle(records)
    shards = []
    for chunk in contiguous_shards(records, n):
        shard: dict[str, dict[str, list[float]]] = {"users": {}, "items": {}}
        for kind, key, vec in chunk:
            shard[kind][str(key)] = vec
        shards.append(shard)
    scored = [
        [uid, iid, round(sum(a * b for a, b in zip(uvec, ivec, strict=True)), 4)]
        for uid, uvec in users.items()
        for iid, ivec in items.items()
    ]
    scored.sort(key=lambda t: t[2], reverse=True)  # stable: ties keep (uid, iid) order
    desc = f"""**Task: Collaborative Filtering (Top User-Item Pairs)**

Find the top {CF_TOP_K} user-item pairs with the highest compatibility score (dot product).

**Data Distribution:**
User and item vectors RANDOMLY distributed ({num_users} users, {num_items} items). Each has a {CF_DIM}-dim feature vector.

**Your Data (RANDOM):**
Agent {{agent_id}} holds: {{input_shard}} (an object with "users" and "items" keys, id -> vector)

**Algorithm:**
1. Compute score(user, item) = dot_product(user_vector, item_vector) for ALL (user, item) pairs
2. Round each score to 4 decimal places
3. Take the top {CF_TOP_K} pairs by rounded score, descending (ties: smaller user_id, then smaller item_id)

**Output:**
A list of the top {CF_TOP_K} triples: [[user_id, item_id, score], ...]

**Communication Protocol:**
Topology: All-to-All. This is an O(users × items) computation.
All agents must submit the same final answer using submit_result([[uid, iid, score], ...])."""
    return Generated(shards, scored[:CF_TOP_K], desc, "O(users × items) = O(N²)")


@register(
    TaskInfo(
        task_id="III-28",
        name="PageRank Step",
        level=3,
        is_segmented=False,
        leetcode_ref="LC-207",
        leetcode_url=_LC + "course-schedule/",
        topology_kind=_ALL,
        optimal_topology="Node-based partitioning with message routing",
        input_summary="V = 8N; directed; 2V attempts; duplicates and self-loops skipped; initial rank 1/V",
        ground_truth_summary="one step r'(v) = (1-d)/V + d Σ_{u→v} r(u)/outdeg(u), d = 0.85, "
        "dangling mass not redistributed; dict node (str) -> round(r', 6)",
        shard_rule="edges shuffled, then contiguous",
        verification_hint="every agent submits the full rank dict",
    )
)
def gen_iii28(rng: random.Random, n: int) -> Generated:
    num_nodes = 8 * n
    edges, adjacency = _random_edges(rng, num_nodes, skip_duplicates=True, undirected=False)
    rng.shuffle(edges)
    ranks = pagerank_step(num_nodes, adjacency)
    desc = f"""**Task: PageRank (One Iteration)**

Compute one iteration of PageRank on a directed graph.

**Data Distribution:**
Total nodes: {num_nodes} (ids 0..{num_nodes - 1}). Directed edges [u, v] (u → v) RANDOMLY distributed.
Initial ranks: uniform, rank[v] = 1/{num_nodes}.

**Your Data (RANDOM edges):**
Agent {{agent_id}} holds: {{input_shard}}

**Algorithm:**
rank'[v] = (1-d)/{num_nodes} + d × Σ(rank[u]/out_degree[u]) over all edges u→v
where d = 0.85 (damping factor); nodes without out-edges pass nothing on

**Output:**
A dictionary mapping every node_id to its new rank, rounded to 6 decimal places.

**Communication Protocol:**
Topology: All-to-All with message routing along edges.
All agents must submit the same final answer using submit_result(complete_rank_dict)."""
    answer = {str(v): round(r, 6) for v, r in enumerate(ranks)}
    return Generated(contiguous_shards(edges, n), answer, desc, "O(N × E) - proportional to edges")


@register(
    TaskInfo(
        task_id="III-29",
        name="Load Balance",
        level=3,
        is_segmented=False,
        leetcode_ref="LC-410",
        leetcode_url=_LC + "split-array-largest-sum/",
        topology_kind=_ALL,
        optimal_topology="All-to-all share tasks + one coordinator (or all compute)",
        input_summary="20N tasks; id % 10 == 0 -> duration U[50, 100], else U[1, 10]",
        ground_truth_summary='LPT greedy over N agents -> {"variance", "max_load", "min_load"}',
        shard_rule="agent 0 gets all heavy tasks; light tasks contiguous over agents 1..N-1",
        verification_hint="every agent submits the LPT statistics dict",
    )
)
def gen_iii29(rng: random.Random, n: int) -> Generated:
    total_tasks = 20 * n
    tasks = [{"id": i, "duration": rng.randint(50, 100) if i % 10 == 0 else rng.randint(1, 10)}
             for i in range(total_tasks)]  # fmt: skip
    heavy = [t for t in tasks if t["id"] % 10 == 0]
    light = [t for t in tasks if t["id"] % 10 != 0]
    shards = [heavy, *contiguous_shards(light, n - 1)]
    total_duration = sum(t["duration"] for t in tasks)
    desc = f"""**Task: Load Balancing (Deterministic Greedy LPT)**

Redistribute the tasks with a deterministic algorithm (LPT - Longest Processing Time first).

**Data Distribution:**
Severely UNBALANCED. Total tasks: {total_tasks}, total duration: {total_duration}.

**Your Data (UNBALANCED):**
Agent {{agent_id}} holds: {{input_shard}}

**Algorithm (MUST be followed exactly):**
1. Collect ALL tasks globally
2. Sort them by duration, descending (equal durations keep their order)
3. Greedily assign each task to the agent with the minimum load (tie-break: smallest agent id),
   over all {{num_agents}} agents
4. Compute variance = mean over agents of (load - total_duration / {{num_agents}})², rounded to 2 decimals,
   and max_load, min_load

**Output:**
A statistics dict: {{"variance": X, "max_load": Y, "min_load": Z}}

**Communication Protocol:**
Topology: All-to-All task sharing, then compute and broadcast.
All agents must submit the same final answer using submit_result(stats_dict)."""
    stats = lpt_stats([t["duration"] for t in tasks], n)
    return Generated(shards, stats, desc, "O(N²) to share tasks + O(N) broadcast stats")


@register(
    TaskInfo(
        task_id="III-30",
        name="Matrix Multiply",
        level=3,
        is_segmented=False,
        leetcode_ref="LC-311",
        leetcode_url=_LC + "sparse-matrix-multiplication/",
        topology_kind=_ALL,
        optimal_topology="All-to-all for row result sharing",
        input_summary="dim = N; A, B ints U[1, 10]",
        ground_truth_summary="full C = A·B as an N × N list of lists",
        shard_rule='agent i gets {"type": "rows_and_full_B", "A_rows": [row i], "A_row_indices": [i], "B_matrix": B}',
        verification_hint="every agent submits the full product matrix",
    )
)
def gen_iii30(rng: random.Random, n: int) -> Generated:
    dim = n
    a = [[rng.randint(1, 10) for _ in range(dim)] for _ in range(dim)]
    b = [[rng.randint(1, 10) for _ in range(dim)] for _ in range(dim)]
    rows_per_agent = dim // n
    shards = []
    for i in range(n):
        lo = i * rows_per_agent
        hi = lo + rows_per_agent if i < n - 1 else dim
        shards.append(
            {
                "type": "rows_and_full_B",
                "A_rows": a[lo:hi],
                "A_row_indices": list(range(lo, hi)),
                "B_matrix": b,
            }
        )
    c = [[sum(a[i][k] * b[k][j] for k in range(dim)) for j in range(dim)] for i in range(dim)]
    desc = f"""**Task: Distributed Matrix Multiplication**

Compute C = A × B where the rows of matrix A are partitioned across agents.

**Data Distribution:**
Matrices are {dim}×{dim}. Each agent has some rows of A and the complete B.

**Your Data:**
Agent {{agent_id}} holds: {{input_shard}}
- A_rows: your assigned rows of A
- A_row_indices: which rows of A you hold
- B_matrix: the complete matrix B

**Algorithm:**
C[i][j] = Σ_k A[i][k] × B[k][j] for k = 0 to {dim - 1}
Compute your assigned rows locally, then share them.

**Output:**
The complete {dim}×{dim} result matrix C as a list of rows.

**Communication Protocol:**
Topology: All-to-All for sharing computed rows.
All agents must submit the same final answer using submit_result(C)."""
    return Generated(shards, c, desc, "O(N²) = O(dim²) elements communicated")
