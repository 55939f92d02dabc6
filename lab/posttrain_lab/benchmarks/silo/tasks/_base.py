"""Shared machinery of the SILO-BENCH task generators: task metadata, the sharding rule, prompt
filling and the case-file schema.

Source: SILO-BENCH (arXiv 2603.01045, ACL 2026), the authors' generator jwyjohn/acl26-silo-bench
`benchmark_generator/`; the JSON layout follows the authors' `BenchmarkGenerator._create_case_structure`
(re-implemented, not copied).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.utils.registry import Registry

PARADIGMS = {1: "Paradigm I", 2: "Paradigm II", 3: "Paradigm III"}

#: Theoretical message complexity class per paradigm (the authors' `_get_complexity_class`).
COMPLEXITY = {
    1: "O(N) - MapReduce/Aggregation",
    2: "O(N) - Structured Mesh with Locality",
    3: "O(N log N) or O(N²) - Global/Shuffle",
}

#: Placeholders filled per agent by plain string replacement (the authors' `_safe_prompt_format`).
PLACEHOLDERS = ("agent_id", "num_agents", "max_id", "input_shard")

LEETCODE_BLURB = (
    "This case is inspired by the LeetCode problem. The multi-agent version tests distributed "
    "computation and communication efficiency."
)

EVALUATION_METRICS_DOC = {
    "S_success_rate": "S = (1/N) Σ_i 1[answer_i == expected_i] after value normalisation; success iff S = 1",
    "P_partial_correctness": "level-specific partial credit (Level I 1% tolerance, Level II positional, "
    "Level III LIS of positions)",
    "C_token_consumption": "tokens per round (paper: output / R_max; code: (input + output) / rounds)",
    "D_communication_density": "messages / (N (N - 1))",
}


@dataclass(frozen=True)
class TaskInfo:
    """Static description of one SILO-BENCH task (arXiv 2603.01045 Table 9; the authors' generators)."""

    task_id: str
    name: str
    level: int
    is_segmented: bool
    leetcode_ref: str | None  # the paper's Table 9 reference, e.g. "LC-414"; None where the paper has none
    leetcode_url: str  # the URL the authors' generator stores
    topology_kind: str  # "star/tree" (Level I), "chain" (Level II), "all-to-all" (Level III)
    optimal_topology: str  # the authors' free-text optimal topology
    input_summary: str
    ground_truth_summary: str
    shard_rule: str
    verification_hint: str

    @property
    def paradigm(self) -> str:
        return PARADIGMS[self.level]


@dataclass
class Generated:
    """What a task generator returns for one instance.

    `answer` is the single global answer (`is_segmented = False`) or the list of N per-agent answers.
    `description` is the task text with only the per-agent placeholders (`PLACEHOLDERS`) left unfilled.
    """

    shards: list[Any]
    answer: Any
    description: str
    optimal_message_count: str
    extra: dict[str, Any] = field(default_factory=dict)


GeneratorFn = Callable[[random.Random, int], Generated]


@dataclass(frozen=True)
class TaskSpec:
    info: TaskInfo
    generate: GeneratorFn


TASKS: Registry[TaskSpec] = Registry("SILO-BENCH task")


def register(info: TaskInfo) -> Callable[[GeneratorFn], GeneratorFn]:
    """Decorator: register a generator under ``info.task_id`` (a second registration raises)."""

    def deco(fn: GeneratorFn) -> GeneratorFn:
        TASKS.register(info.task_id)(TaskSpec(info=info, generate=fn))
        return fn

    return deco


def contiguous_shards(data: list[Any] | str, num_agents: int) -> list[Any]:
    """The authors' default sharding rule (`benchmark_generator/paradigm_*.py`): `chunk = len(data) // N`;
    shard i = data[i·chunk:(i+1)·chunk]; the last shard also takes the remainder."""
    chunk = len(data) // num_agents
    return [data[i * chunk : (i + 1) * chunk if i < num_agents - 1 else len(data)] for i in range(num_agents)]


def render_shard(shard: Any) -> str:
    """How a shard appears in the prompt: a string shard verbatim, anything else as compact JSON.

    Decision (docs/silo-tasks.md): the authors use Python `str()` (tuples, single quotes, `True`); we render
    JSON, the same notation agents use for tool parameters, so what an agent reads can be pasted back.
    Floats keep their full `repr` precision.
    """
    if isinstance(shard, str):
        return shard
    return json.dumps(shard, ensure_ascii=False)


def fill_prompt(template: str, *, agent_id: int, num_agents: int, input_shard: Any) -> str:
    """Fill `{agent_id}`, `{num_agents}`, `{max_id}`, `{input_shard}` by plain string replacement (the
    authors' `_safe_prompt_format`), so any other literal braces (JSON examples in the text) survive
    untouched.

    `{input_shard}` is replaced last, so braces inside the data are never re-interpreted.
    """
    out = template
    for key, value in (("agent_id", agent_id), ("num_agents", num_agents), ("max_id", num_agents - 1)):
        out = out.replace("{" + key + "}", str(value))
    return out.replace("{input_shard}", render_shard(input_shard))
