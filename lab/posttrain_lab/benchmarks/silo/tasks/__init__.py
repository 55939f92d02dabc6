"""SILO-BENCH tasks: 30 instance generators, independent ground-truth solvers, and case-file I/O.

Public API (re-exported by `posttrain_lab.benchmarks.silo`):

- `TASK_IDS`, `task_level(task_id)`, `task_info(task_id)`
- `generate_case(task_id, num_agents, seed=42)`: one instance in the authors' JSON schema
  (jwyjohn/acl26-silo-bench `benchmark_generator/main.py` `_create_case_structure`)
- `solve(task_id, shards, prompt)`: per-agent ground truth recomputed from the shards and the task text only
- `load_case(path)`: read our files and the authors' published files, validate, normalise expected output
- `write_cases(out_dir, agent_counts, seed, tasks)`: one `{TASK_ID}_n{N}.json` per task and N (atomic)
- `min_peers_needed(task_id, num_agents, agent_id=None)` / `dependency_peers(...)`: data dependencies used
  by the premature-submission detector (arXiv 2603.01045 §5.2, App. G.2)
"""

from __future__ import annotations

from posttrain.utils.errors import InvalidValueError
from posttrain_lab.benchmarks.silo.tasks import level1 as _level1  # noqa: F401  (registers I-01..I-10)
from posttrain_lab.benchmarks.silo.tasks import level2 as _level2  # noqa: F401  (registers II-11..II-20)
from posttrain_lab.benchmarks.silo.tasks import level3 as _level3  # noqa: F401  (registers III-21..III-30)
from posttrain_lab.benchmarks.silo.tasks._base import TASKS, TaskInfo
from posttrain_lab.benchmarks.silo.tasks.cases import (
    case_to_json,
    generate_case,
    generate_parity_suite,
    load_case,
    write_cases,
)
from posttrain_lab.benchmarks.silo.tasks.dependencies import dependency_peers, min_peers_needed
from posttrain_lab.benchmarks.silo.tasks.solvers import solve

TASK_IDS: list[str] = sorted(TASKS.names(), key=lambda t: (len(t.split("-")[0]), int(t.split("-")[1])))


def _spec(task_id: str):
    try:
        return TASKS.get(task_id)
    except (KeyError, TypeError):
        raise InvalidValueError(
            f"unknown SILO-BENCH task {task_id!r}; known: {', '.join(TASK_IDS)}"
        ) from None


def task_info(task_id: str) -> TaskInfo:
    """Static metadata of a task: name, level, is_segmented, LeetCode reference, optimal topology, …"""
    return _spec(task_id).info


def task_level(task_id: str) -> int:
    """1, 2 or 3 (Level I aggregation, II structured mesh, III global shuffle)."""
    return _spec(task_id).info.level


__all__ = [
    "TASK_IDS",
    "TaskInfo",
    "case_to_json",
    "dependency_peers",
    "generate_case",
    "generate_parity_suite",
    "load_case",
    "min_peers_needed",
    "solve",
    "task_info",
    "task_level",
    "write_cases",
]
