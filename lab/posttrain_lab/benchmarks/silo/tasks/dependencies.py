"""Which peers' data each agent's answer depends on: the basis of the premature-submission detector (arXiv
2603.01045 §5.2: "submitted before receiving data from the minimum number of peers the task needs").

Rule (derived from each task's definition and optimal topology; docs/silo-tasks.md §"Minimum peers"):

- Global-answer tasks (all of Level I and III except III-21, and the global chain tasks II-12, II-13,
  II-15 … II-19): the single answer is a function of every shard, so agent i needs information from all
  N − 1 peers, directly or via aggregation (star/tree collect → broadcast, or a chain pass that carries an
  aggregate). A leaf of a star receives one message, but that message must summarise all other shards.
- Segmented chain tasks, forward dependency (II-11 prefix sum, II-20 pipeline hash): agent i's slice needs
  the running total / last hash of agents 0 … i − 1, delivered by its left neighbour: peers {0 … i − 1};
  agent 0 needs nobody.
- Segmented chain task II-14 (1D automaton, 5 steps, 10 cells per agent): information travels one cell per
  step, so only the direct neighbours i − 1 and i + 1 matter.
- III-21 (distributed sort, segmented): which values land in agent i's sorted range depends on every shard:
  all N − 1 peers.
"""

from __future__ import annotations

from posttrain.utils.errors import InvalidValueError


def dependency_peers(task_id: str, num_agents: int, agent_id: int) -> list[int]:
    """Sorted ids of the peers whose shards agent `agent_id`'s expected answer depends on."""
    from posttrain_lab.benchmarks.silo.tasks import task_info

    info = task_info(task_id)
    if isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1:
        raise InvalidValueError(f"num_agents must be a positive integer, got {num_agents!r}")
    if isinstance(agent_id, bool) or not isinstance(agent_id, int) or not 0 <= agent_id < num_agents:
        raise InvalidValueError(f"agent_id must be an integer in [0, {num_agents - 1}], got {agent_id!r}")
    if task_id in ("II-11", "II-20"):
        return list(range(agent_id))
    if task_id == "II-14":
        return [j for j in (agent_id - 1, agent_id + 1) if 0 <= j < num_agents]
    if info.is_segmented and task_id != "III-21":  # pragma: no cover - guards a future segmented task
        raise AssertionError(f"no dependency rule for segmented task {task_id}")
    return [j for j in range(num_agents) if j != agent_id]


def min_peers_needed(task_id: str, num_agents: int, agent_id: int | None = None) -> int:
    """Number of peers whose data must have reached an agent (directly or aggregated) before it can
    submit a correct answer: `len(dependency_peers(...))` for `agent_id`; without `agent_id`, the minimum
    over agents (what every agent needs; pass `agent_id` for the per-agent count on segmented chain tasks,
    where it ranges from 0 for agent 0 of II-11/II-20 to N − 1 for the last agent).
    """
    if agent_id is not None:
        return len(dependency_peers(task_id, num_agents, agent_id))
    return min(len(dependency_peers(task_id, num_agents, i)) for i in range(num_agents))
