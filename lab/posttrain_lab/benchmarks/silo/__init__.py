"""SILO-BENCH: distributed coordination of role-free LLM agents (arXiv 2603.01045, ACL 2026).

Tasks, ground truth and case files live in `posttrain_lab.benchmarks.silo.tasks`; scoring functions in
`posttrain_lab.benchmarks.silo.metrics`. The execution engine, protocols, agents and runner are separate modules of this
package.
"""

from __future__ import annotations

from posttrain_lab.benchmarks.silo.tasks import (
    TASK_IDS,
    TaskInfo,
    dependency_peers,
    generate_case,
    load_case,
    min_peers_needed,
    solve,
    task_info,
    task_level,
    write_cases,
)

__all__ = [
    "TASK_IDS",
    "TaskInfo",
    "dependency_peers",
    "generate_case",
    "load_case",
    "min_peers_needed",
    "solve",
    "task_info",
    "task_level",
    "write_cases",
]
