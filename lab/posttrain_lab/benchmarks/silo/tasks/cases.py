"""Case files: build one instance in the SILO-BENCH JSON schema, write them, load and validate them.

Schema (the authors' `benchmark_generator/main.py` `_create_case_structure`, jwyjohn/acl26-silo-bench)::

    { case_id, case_name, paradigm, leetcode: {url, description, reference},
      metadata: {num_agents, optimal_topology, optimal_message_count, theoretical_complexity,
                 output_type: "distributed", is_segmented, level, seed, generator},
      task_description,
      agent_configs: [{agent_id, system_prompt, user_prompt, input_shard, expected_output}],
      expected_output: {type: "distributed", per_agent_values: [N values], is_segmented,
                        verification_logic_hint, format_description},
      evaluation_metrics: {...documentation only} }

Differences from the authors' files (docs/silo-tasks.md): no executable `verification_logic` string is
written (a plain-text `verification_logic_hint` only; nothing is ever exec'd, and a `verification_logic`
read from the authors' files is kept as inert text); shards are rendered into prompts as JSON; dict answers
and dict-valued shards use string keys (what a JSON round trip produces anyway).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError, PosttrainError
from posttrain.utils.io import atomic_write_text
from posttrain_lab.benchmarks.silo.tasks._base import (
    COMPLEXITY,
    EVALUATION_METRICS_DOC,
    LEETCODE_BLURB,
    TASKS,
    TaskSpec,
    fill_prompt,
)

DEFAULT_AGENT_COUNTS = (2, 5, 10, 20, 50, 100)
SYSTEM_PROMPT_PLACEHOLDER = (
    "[PLACEHOLDER] Replaced at run time by the protocol-specific system prompt (P2P, BP or SFS); "
    "see posttrain_lab.benchmarks.silo. Agent ID: {agent_id}; total agents: {num_agents}; max agent ID: {max_id}."
)


def _lookup(task_id: str) -> TaskSpec:
    try:
        return TASKS.get(task_id)
    except (KeyError, TypeError):
        known = ", ".join(TASKS.names())
        raise InvalidValueError(f"unknown SILO-BENCH task {task_id!r}; known: {known}") from None


def _check_num_agents(num_agents: Any) -> int:
    if isinstance(num_agents, bool) or not isinstance(num_agents, int):
        raise InvalidValueError(f"num_agents must be an integer >= 2, got {num_agents!r}")
    if num_agents < 2:
        raise InvalidValueError(
            f"num_agents must be >= 2 (SILO-BENCH partitions the input over N >= 2 agents; the N = 1 "
            f"oracle baseline is run from a case's full input instead), got {num_agents}"
        )
    return num_agents


def case_rng(task_id: str, num_agents: int, seed: int) -> random.Random:
    """The dedicated RNG of one (task, N, seed) instance (library default; the authors share one global
    stream, see parity mode).

    Seeded from a string, which CPython hashes with SHA-512 (independent of PYTHONHASHSEED), so the
    stream is identical across processes and platforms and never touches the global `random` state.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidValueError(f"seed must be an integer, got {seed!r}")
    return random.Random(f"silo-bench/{task_id}/n{num_agents}/seed{seed}")


def generate_case(
    task_id: str, num_agents: int, seed: int = 42, *, rng: random.Random | None = None
) -> dict[str, Any]:
    """Generate one SILO-BENCH instance as a JSON-native dict in the schema above.

    Deterministic per (task_id, num_agents, seed): it draws only from its own `random.Random` (`case_rng`).
    Passing `rng` overrides that stream (used by the parity mode).
    """
    spec = _lookup(task_id)
    n = _check_num_agents(num_agents)
    replayed = rng is not None
    if rng is None:
        rng = case_rng(task_id, n, seed)
    gen = spec.generate(rng, n)
    info = spec.info
    if len(gen.shards) != n:
        raise AssertionError(f"{task_id}: generator returned {len(gen.shards)} shards for N = {n}")
    if info.is_segmented:
        if not isinstance(gen.answer, list) or len(gen.answer) != n:
            raise AssertionError(f"{task_id}: a segmented task needs one answer per agent")
        per_agent = list(gen.answer)
    else:
        per_agent = [gen.answer] * n
    agent_configs = [
        {
            "agent_id": i,
            "system_prompt": SYSTEM_PROMPT_PLACEHOLDER.replace("{agent_id}", str(i))
            .replace("{num_agents}", str(n))
            .replace("{max_id}", str(n - 1)),
            "user_prompt": fill_prompt(gen.description, agent_id=i, num_agents=n, input_shard=gen.shards[i]),
            "input_shard": gen.shards[i],
            "expected_output": per_agent[i],
        }
        for i in range(n)
    ]
    case = {
        "case_id": info.task_id,
        "case_name": info.name,
        "paradigm": info.paradigm,
        "leetcode": {"url": info.leetcode_url, "description": LEETCODE_BLURB, "reference": info.leetcode_ref},
        "metadata": {
            "num_agents": n,
            "optimal_topology": info.optimal_topology,
            "optimal_message_count": gen.optimal_message_count,
            "theoretical_complexity": COMPLEXITY[info.level],
            "output_type": "distributed",
            "is_segmented": info.is_segmented,
            "level": info.level,
            "topology_kind": info.topology_kind,
            "seed": seed,
            "rng": "shared stream (parity mode)" if replayed else "random.Random per (task, N, seed)",
            "generator": "posttrain_lab.benchmarks.silo.tasks",
        },
        "task_description": gen.description,
        "agent_configs": agent_configs,
        "expected_output": {
            "type": "distributed",
            "per_agent_values": per_agent,
            "is_segmented": info.is_segmented,
            "verification_logic_hint": info.verification_hint,
            "format_description": "ALL agents must submit their results using submit_result(answer). "
            + (
                "Each agent submits their own portion of the result."
                if info.is_segmented
                else "All agents should submit the same final answer after coordination."
            ),
        },
        "evaluation_metrics": dict(EVALUATION_METRICS_DOC),
    }
    # A JSON round trip: plain JSON types only (no tuples, int dict keys or shared references).
    return json.loads(json.dumps(case))


def case_to_json(case: dict[str, Any]) -> str:
    """The on-disk text of a case: UTF-8 JSON indented by 2 like the authors' files, except that a list of
    scalars is written on one line (a matrix becomes one line per row). `json.loads` of the text gives the
    case back unchanged; the III-30 N = 100 file is ~3x smaller than with `json.dumps(indent=2)`."""
    return _dump(case, 0) + "\n"


def _dump(obj: Any, depth: int) -> str:
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        body = ",\n".join(
            f"{inner}{json.dumps(str(k), ensure_ascii=False)}: {_dump(v, depth + 1)}" for k, v in obj.items()
        )
        return "{\n" + body + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, list | dict) for v in obj):
        return "[\n" + ",\n".join(inner + _dump(v, depth + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False)


def _select_tasks(tasks: str | Iterable[str]) -> list[str]:
    from posttrain_lab.benchmarks.silo.tasks import TASK_IDS

    if tasks == "all":
        return list(TASK_IDS)
    names = [t.strip() for t in tasks.split(",")] if isinstance(tasks, str) else list(tasks)
    levels = {"I": 1, "II": 2, "III": 3}
    out: list[str] = []
    for name in names:
        if name in levels:
            out += [t for t in TASK_IDS if TASKS.get(t).info.level == levels[name]]
        else:
            _lookup(name)
            out.append(name)
    return list(dict.fromkeys(out))  # drop repeats, keep order


def write_cases(
    out_dir: str | os.PathLike,
    agent_counts: Sequence[int] = DEFAULT_AGENT_COUNTS,
    seed: int = 42,
    tasks: str | Iterable[str] = "all",
    *,
    parity: bool = False,
) -> list[Path]:
    """Write one `{TASK_ID}_n{N}.json` per task and N into `out_dir`, each atomically.

    `tasks`: "all", a level ("I", "II", "III"), task ids, or a comma-separated string of those.
    `parity=True` replays the authors' single global stream instead (see `generate_parity_suite`).
    """
    counts = [_check_num_agents(n) for n in agent_counts]
    selected = _select_tasks(tasks)
    if parity:
        cases = generate_parity_suite(counts, seed=seed)
        items = [((t, n), cases[(t, n)]) for n in counts for t in selected]
    else:
        items = [((t, n), generate_case(t, n, seed)) for n in counts for t in selected]
    paths = []
    for (task_id, n), case in items:
        paths.append(atomic_write_text(Path(out_dir) / f"{task_id}_n{n}.json", case_to_json(case)))
    return paths


def generate_parity_suite(
    agent_counts: Sequence[int] = DEFAULT_AGENT_COUNTS, seed: int = 42
) -> dict[tuple[str, int], dict[str, Any]]:
    """Parity mode: replay the authors' generation order through ONE `random.Random(seed)`: for each N in
    `agent_counts`, Level I → II → III, tasks in id order. Each generator draws in the same order as the
    authors' code, so the data should equal their published files; this is unverified here (their files are
    not available offline). Prompt wording and shard rendering are ours either way.
    """
    from posttrain_lab.benchmarks.silo.tasks import TASK_IDS

    rng = random.Random(seed)
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for n in agent_counts:
        _check_num_agents(n)
        for task_id in TASK_IDS:
            case = generate_case(task_id, n, seed, rng=rng)
            case["metadata"]["parity_mode"] = True
            out[(task_id, n)] = case
    return out


# ----------------------------------------------------------------------------------------------- loading


class CaseFileError(PosttrainError, ValueError):
    """A case file that cannot be used; the message names the file and the bad key."""


def load_case(path: str | os.PathLike) -> dict[str, Any]:
    """Load and validate a case file (ours or the authors' published ones).

    Checks: valid JSON object; `case_id` a string; `agent_configs` a list of objects with `agent_id` 0..N-1
    in order and string `user_prompt`; `expected_output` present. N = len(agent_configs), falling back to
    `metadata.num_agents`, else 1 (single-agent baseline files, as the authors' `src/engine.py`
    `init_case`). The expected output is normalised (as their `init_case` does) to a dict with
    `per_agent_values` of length N: a dict that already has `per_agent_values` is kept; any other value (the
    baseline format) is wrapped as one global answer repeated N times. Nothing in the file is executed.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise CaseFileError(f"{path}: cannot read case file ({e.strerror or e})") from e
    try:
        case = json.loads(text)
    except json.JSONDecodeError as e:
        raise CaseFileError(f"{path}: invalid JSON at line {e.lineno} column {e.colno} ({e.msg})") from e
    if not isinstance(case, dict):
        raise CaseFileError(f"{path}: expected a JSON object at the top level, got {type(case).__name__}")
    if "cases" in case and "case_id" not in case:
        raise CaseFileError(
            f"{path}: this is a combined benchmark file (key 'cases'); load the per-case files "
            f"{{TASK_ID}}_n{{N}}.json instead"
        )

    def bad(key: str, expected: str, got: Any = None) -> CaseFileError:
        found = "missing" if got is _MISSING else f"got {type(got).__name__} {_short(got)}"
        return CaseFileError(f"{path}: key {key!r}: expected {expected}, {found}")

    case_id = case.get("case_id", _MISSING)
    if not isinstance(case_id, str) or not case_id:
        raise bad("case_id", "a non-empty string", case_id)
    if "expected_output" not in case:
        raise bad(
            "expected_output", "the ground truth (object with per_agent_values, or a raw value)", _MISSING
        )
    metadata = case.get("metadata", {})
    if not isinstance(metadata, dict):
        raise bad("metadata", "an object", metadata)

    configs = case.get("agent_configs", _MISSING)
    if configs is _MISSING or configs == []:
        meta_n = metadata.get("num_agents", 1)
        if isinstance(meta_n, bool) or not isinstance(meta_n, int) or meta_n < 1:
            raise bad("metadata.num_agents", "a positive integer", meta_n)
        n = meta_n
        configs = []
        if "task_description" not in case:
            raise bad(
                "agent_configs", "a list of agent objects (or a task_description for a baseline)", _MISSING
            )
    else:
        if not isinstance(configs, list):
            raise bad("agent_configs", "a list of agent objects", configs)
        n = len(configs)
        for i, cfg in enumerate(configs):
            where = f"agent_configs[{i}]"
            if not isinstance(cfg, dict):
                raise bad(where, "an object", cfg)
            if cfg.get("agent_id", _MISSING) != i or isinstance(cfg.get("agent_id"), bool):
                raise bad(
                    f"{where}.agent_id",
                    f"the integer {i} (agents listed in id order)",
                    cfg.get("agent_id", _MISSING),
                )
            if not isinstance(cfg.get("user_prompt", _MISSING), str):
                raise bad(f"{where}.user_prompt", "a string", cfg.get("user_prompt", _MISSING))
            if "input_shard" not in cfg:
                raise bad(f"{where}.input_shard", "the agent's data shard", _MISSING)
        meta_n = metadata.get("num_agents")
        if meta_n is not None and meta_n != n:
            raise CaseFileError(
                f"{path}: key 'metadata.num_agents' is {meta_n!r} but agent_configs has {n} entries"
            )

    expected = case["expected_output"]
    if isinstance(expected, dict) and "per_agent_values" in expected:
        values = expected["per_agent_values"]
        if not isinstance(values, list) or len(values) != n:
            raise bad(
                "expected_output.per_agent_values",
                f"a list with one value per agent ({n})",
                values,
            )
        seg = expected.get("is_segmented", metadata.get("is_segmented", False))
        if not isinstance(seg, bool):
            raise bad("expected_output.is_segmented", "a boolean", seg)
        normalised = dict(expected)
        normalised["is_segmented"] = seg
    else:
        normalised = {"type": "baseline", "per_agent_values": [expected] * n, "is_segmented": False}
    case["expected_output"] = normalised
    metadata = dict(metadata)
    metadata.setdefault("num_agents", n)
    metadata.setdefault("is_segmented", normalised["is_segmented"])
    case["metadata"] = metadata
    return case


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
