"""SILO-BENCH N = 1 oracle baseline: one agent holds the whole input of an N = k case and answers directly.

Source: arXiv 2603.01045 §3 ("Baseline N = 1 oracle: one agent receives the full input and answers
directly"), the authors' `src/engine.py` `init_case` (single-agent baseline files: N = 1, the expected
output is a raw value that the loader wraps), arXiv 2603.01045 §4.1 (relative coordination cost RCC = 1 −
SR(N = k) / SR(N = 1), which needs SR(N = 1) measured on the SAME global input as SR(N = k)).

`oracle_case(case)` turns an N = k case into its baseline:

* **Same global input.** The agent's data is the union of the k shards: **merged** (the shards
  concatenated in agent order: lists joined, string segments joined, III-27 user/item maps united,
  III-30 row sets joined with the one shared B) for every task except III-29, where the shards are
  **listed shard by shard** ("Shard i: ..."): III-29's answer is defined over the k machines that hold
  the tasks (LPT over k agents, variance over k loads), so the k-way split is part of the task and a
  merged list would hide it. For every merged task, `solve(task, [merged], prompt)` equals the ground
  truth over the k shards (tested for all of them), i.e. merging does not change the task.
* **Expected output** (a raw value, the baseline format of `init_case`): the global value for global tasks;
  for the segmented tasks (II-11, II-14, II-20, III-21) the full answer, i.e. the concatenation of the k
  per-agent slices in agent order (the whole prefix-sum array, the whole final automaton row, every block's
  hash, the whole sorted list).
* **Prompt.** The k-agent task text with (1) a single-agent preamble after the title, (2) the per-agent
  data section replaced by the whole input (format notes on the shard line and after it are kept),
  (3) ``{num_agents}`` / ``{max_id}`` filled with k and k − 1 (the text still describes the k-agent
  version of the same computation, e.g. III-26's ``element % k`` buckets or III-29's k machines),
  (4) the Communication Protocol section replaced by a single-agent submission note and (5) for the
  segmented tasks the per-agent Output section replaced by the full-answer format. Nothing else of the
  task text is rewritten, so the only change from the k-agent prompt is who holds the data.
* ``metadata.oracle_of = k``; ``metadata.num_agents = 1``; the case loads with `load_case` (baseline
  format) and runs in `SiloEngine` under any protocol (N = 1: sends go nowhere, D = 0).
"""

from __future__ import annotations

import json
import re
from typing import Any

from posttrain.utils.errors import PosttrainError
from posttrain_lab.benchmarks.silo.tasks._base import render_shard

#: Tasks whose oracle input lists the k shards one by one instead of merging them (see module doc).
LISTED_TASKS = frozenset({"III-29"})

#: The full-answer format of the segmented tasks (replaces their per-agent "**Output:**" section).
SEGMENTED_OUTPUT = {
    "II-11": "The COMPLETE prefix-sum array of the whole input: one list with one value per input element.",
    "II-14": "The final state of ALL cells after the steps: one list of 0/1 values, as long as the input row.",
    "II-20": "The hash of EVERY block of the whole input, in block order: one list with one hash per block.",
    "III-21": "The whole input sorted in ascending order: one list with every value (duplicates kept).",
}

#: Task-specific notes appended to the whole-input section.
ORACLE_NOTES = {
    "III-29": "(The schedule is still over the {k} agents of the {k}-agent version, i.e. {k} machines with "
    "ids 0 to {max_id}; you compute it for them.)",
}

_MERGED_HEAD = "**Your Data (the WHOLE input: all {k} shards merged in agent order):**"
_LISTED_HEAD = (
    "**Your Data (the WHOLE input, listed shard by shard in agent order; shard i is what agent i "
    "holds in the {k}-agent version):**"
)
ORACLE_DATA_RE = re.compile(
    r"^\*\*Your Data \(the WHOLE input(?P<how>:|, listed)[^\n]*\*\*\s*$", re.MULTILINE
)
_SHARD_LINE_RE = re.compile(r"^Shard (\d+): (.*)$")

_PREAMBLE = (
    "**Single-agent baseline (N = 1 oracle of the {k}-agent case):**\n"
    "You are the ONLY agent and you hold the COMPLETE input: everything that agents 0 to {max_id} hold "
    "in the {k}-agent version of this task, shown below. There is nobody to communicate with. Where the "
    "text below speaks of agents, positions, neighbours or shards, it describes how the {k}-agent version "
    "splits the same data; it does not change what is to be computed. Compute the whole answer yourself."
)
_SUBMISSION = (
    "**Submission (single agent):**\n"
    "Compute the answer from the whole input and submit it once with submit_result(answer). "
    "No messages, broadcasts or shared files are needed."
)


class OracleError(PosttrainError, ValueError):
    """A case that cannot be turned into its N = 1 oracle; the message names the case and the problem."""


def merge_shards(task_id: str, shards: list[Any]) -> Any:
    """The k shards as one input, concatenated in agent order (the natural merge of each task's data).

    Lists are joined, string segments (II-13, II-15) joined, III-27's ``{"users", "items"}`` maps united
    (agent order; an id held twice keeps its first vector) and III-30's row sets joined under the one
    shared ``B_matrix``.
    """
    if not isinstance(shards, list) or not shards:
        raise OracleError(f"{task_id}: shards must be a non-empty list, got {shards!r:.60}")
    if all(isinstance(s, str) for s in shards):
        return "".join(shards)
    if all(isinstance(s, list) for s in shards):
        return [x for s in shards for x in s]
    if task_id == "III-27" and all(isinstance(s, dict) for s in shards):
        out: dict[str, dict[str, Any]] = {"users": {}, "items": {}}
        for i, s in enumerate(shards):
            for key in ("users", "items"):
                part = s.get(key)
                if not isinstance(part, dict):
                    raise OracleError(f"III-27: shard {i} lacks the {key!r} object")
                for ident, vec in part.items():
                    out[key].setdefault(str(ident), vec)
        return out
    if task_id == "III-30" and all(isinstance(s, dict) for s in shards):
        rows: list[Any] = []
        idx: list[Any] = []
        for i, s in enumerate(shards):
            if not isinstance(s.get("A_rows"), list) or not isinstance(s.get("A_row_indices"), list):
                raise OracleError(f"III-30: shard {i} lacks 'A_rows' / 'A_row_indices' lists")
            if s.get("B_matrix") != shards[0].get("B_matrix"):
                raise OracleError(f"III-30: shard {i} holds a different B_matrix than shard 0")
            rows += s["A_rows"]
            idx += s["A_row_indices"]
        return {"type": "all_rows_and_full_B", "A_rows": rows, "A_row_indices": idx,
                "B_matrix": shards[0]["B_matrix"]}  # fmt: skip
    kinds = sorted({type(s).__name__ for s in shards})
    raise OracleError(f"{task_id}: no merge rule for shards of type(s) {', '.join(kinds)}")


def oracle_input(task_id: str, shards: list[Any]) -> list[Any]:
    """What the oracle agent holds, in the form `solve` takes: ``[merged]``, or the k shards for the
    listed tasks (`LISTED_TASKS`)."""
    if task_id in LISTED_TASKS:
        return list(shards)
    return [merge_shards(task_id, shards)]


def oracle_expected(case: dict[str, Any]) -> Any:
    """The raw expected value of the oracle of `case`: the global value (all k per-agent values must
    agree) or, for a segmented case, the concatenation of the k per-agent slices in agent order."""
    cid = case.get("case_id")
    exp = case.get("expected_output")
    values = exp.get("per_agent_values") if isinstance(exp, dict) else None
    if not isinstance(values, list) or not values:
        raise OracleError(f"case {cid!r}: expected_output.per_agent_values must be a non-empty list")
    if _segmented(case):
        out: list[Any] = []
        for i, v in enumerate(values):
            if not isinstance(v, list):
                raise OracleError(
                    f"case {cid!r}: segmented per_agent_values[{i}] must be a list, got {v!r:.60}"
                )
            out += v
        return out
    first = values[0]
    for i, v in enumerate(values[1:], start=1):
        if v != first:
            raise OracleError(
                f"case {cid!r}: a global task needs one value for all agents, but per_agent_values[{i}] "
                f"differs from per_agent_values[0]"
            )
    return json.loads(json.dumps(first))


def _segmented(case: dict[str, Any]) -> bool:
    exp = case.get("expected_output")
    seg = exp.get("is_segmented") if isinstance(exp, dict) else None
    if seg is None:
        seg = (case.get("metadata") or {}).get("is_segmented", False)
    return bool(seg)


def _task_id(case: dict[str, Any]) -> str:
    from posttrain_lab.benchmarks.silo.engine import case_task_id

    return case_task_id(case)


def oracle_prompt(case: dict[str, Any]) -> str:
    """The oracle agent's user prompt, built from the case's `task_description` template (module doc)."""
    tid = _task_id(case)
    cid = case.get("case_id")
    template = case.get("task_description")
    configs = case.get("agent_configs")
    if not isinstance(template, str) or "{input_shard}" not in template:
        raise OracleError(
            f"case {cid!r}: key 'task_description' must be the task text with an {{input_shard}} "
            f"placeholder (as in generated cases)"
        )
    if not isinstance(configs, list) or not configs:
        raise OracleError(f"case {cid!r}: key 'agent_configs' must be a non-empty list")
    k = len(configs)
    shards = [c.get("input_shard") if isinstance(c, dict) else None for c in configs]
    blocks = template.replace("{num_agents}", str(k)).replace("{max_id}", str(k - 1)).split("\n\n")
    out: list[str] = []
    for b, block in enumerate(blocks):
        head = block.lstrip().split("\n", 1)[0].strip()
        if "{input_shard}" in block:
            out.append(_data_block(tid, block, shards, k))
        elif head.startswith("**Communication Protocol"):
            out.append(_SUBMISSION)
        elif head.startswith("**Output") and tid in SEGMENTED_OUTPUT and _segmented(case):
            out.append("**Output:**\n" + SEGMENTED_OUTPUT[tid])
        else:
            out.append(block)
        if b == 0:
            out.append(_PREAMBLE.format(k=k, max_id=k - 1))
    if not any(b.startswith("**Submission") for b in out):
        out.append(_SUBMISSION)
    text = "\n\n".join(out)
    if "{agent_id}" in text:
        raise OracleError(f"case {cid!r}: task_description uses {{agent_id}} outside its data section")
    return text


def _data_block(task_id: str, block: str, shards: list[Any], k: int) -> str:
    lines = block.split("\n")
    at = next(i for i, ln in enumerate(lines) if "{input_shard}" in ln)
    suffix = lines[at].split("{input_shard}", 1)[1].strip()
    notes = [suffix] if suffix else []
    notes += [ln for ln in lines[at + 1 :] if ln.strip()]
    if task_id in LISTED_TASKS:
        body = [_LISTED_HEAD.format(k=k)] + [f"Shard {i}: {render_shard(s)}" for i, s in enumerate(shards)]
    else:
        body = [_MERGED_HEAD.format(k=k), render_shard(merge_shards(task_id, shards))]
    if task_id in ORACLE_NOTES:
        notes.append(ORACLE_NOTES[task_id].format(k=k, max_id=k - 1))
    return "\n".join(body + notes)


def oracle_case(case: dict[str, Any]) -> dict[str, Any]:
    """The single-agent (N = 1) oracle baseline of an N = k case over the same global input.

    Returns a JSON-native case in the baseline format of the authors' `init_case`: one agent config whose
    `user_prompt` is `oracle_prompt(case)` and whose `input_shard` is `oracle_input(...)` (a list of one
    merged shard, or the k shards for `LISTED_TASKS`), and a raw `expected_output` (`oracle_expected`) that
    `load_case` / `normalise_oracle` wrap as ``{"per_agent_values": [value]}``. The metadata keeps the
    source case's fields plus ``num_agents = 1``, ``oracle_of = k``, ``oracle_input`` ("merged" or "listed")
    and ``source_case_id``.
    """
    if not isinstance(case, dict):
        raise OracleError(f"oracle_case needs a case dict, got {type(case).__name__}")
    meta = case.get("metadata") or {}
    if meta.get("oracle_of") is not None:
        raise OracleError(f"case {case.get('case_id')!r} is already an oracle (of N = {meta['oracle_of']})")
    tid = _task_id(case)
    configs = case.get("agent_configs")
    if not isinstance(configs, list) or len(configs) < 2:
        raise OracleError(
            f"case {case.get('case_id')!r}: an oracle is built from an N >= 2 case (agent_configs)"
        )
    k = len(configs)
    shards = []
    for i, c in enumerate(configs):
        if not isinstance(c, dict) or "input_shard" not in c:
            raise OracleError(f"case {case.get('case_id')!r}: agent_configs[{i}].input_shard is missing")
        shards.append(c["input_shard"])
    prompt = oracle_prompt(case)
    expected = oracle_expected(case)
    metadata = dict(meta)
    metadata.update(
        num_agents=1,
        oracle_of=k,
        oracle_input="listed" if tid in LISTED_TASKS else "merged",
        source_case_id=case.get("case_id"),
        source_is_segmented=_segmented(case),
        is_segmented=False,
        output_type="single",
    )
    out = {
        "case_id": f"{tid}_n1_oracle{k}",
        "task_id": tid,
        "case_name": case.get("case_name", tid),
        "paradigm": case.get("paradigm"),
        "metadata": metadata,
        "task_description": prompt,
        "agent_configs": [
            {
                "agent_id": 0,
                "user_prompt": prompt,
                "input_shard": oracle_input(tid, shards),
                "expected_output": expected,
            }
        ],
        "expected_output": expected,
    }
    return json.loads(json.dumps(out))


def normalise_oracle(case: dict[str, Any]) -> dict[str, Any]:
    """Wrap the raw expected value the way `load_case` does for baseline files (as the authors'
    `init_case`), so a freshly built oracle case can go straight to `SiloEngine` without a file round
    trip."""
    out = dict(case)
    out["expected_output"] = {"type": "baseline", "per_agent_values": [case["expected_output"]],
                              "is_segmented": False}  # fmt: skip
    return out


def read_oracle_input(prompt: str) -> list[Any] | None:
    """The shards an oracle prompt presents, as `solve` takes them (``[merged]`` or the k listed
    shards); None when `prompt` is not an oracle prompt. Used by the scripted reference agent."""
    m = ORACLE_DATA_RE.search(prompt)
    if m is None:
        return None
    lines = [ln.strip() for ln in prompt[m.end() :].splitlines()]
    lines = lines[next((i for i, ln in enumerate(lines) if ln), len(lines)) :]
    if m.group("how") == ":":
        if not lines:
            raise OracleError("oracle prompt: the whole-input section is empty")
        return [_decode(lines[0])]
    shards = []
    for ln in lines:
        sm = _SHARD_LINE_RE.match(ln)
        if sm is None:
            break
        if int(sm.group(1)) != len(shards):
            raise OracleError(f"oracle prompt: expected 'Shard {len(shards)}:', got {ln[:40]!r}")
        shards.append(_decode(sm.group(2)))
    if not shards:
        raise OracleError("oracle prompt: no 'Shard i: ...' lines after the whole-input heading")
    return shards


def _decode(text: str) -> Any:
    if text[:1] in ("[", "{", '"'):
        try:
            return json.JSONDecoder().raw_decode(text)[0]
        except ValueError as e:
            raise OracleError(f"oracle prompt: data {text[:60]!r} is not valid JSON ({e})") from e
    return text  # a string input (II-13, II-15) is rendered verbatim


__all__ = [
    "LISTED_TASKS",
    "ORACLE_NOTES",
    "SEGMENTED_OUTPUT",
    "OracleError",
    "merge_shards",
    "normalise_oracle",
    "oracle_case",
    "oracle_expected",
    "oracle_input",
    "oracle_prompt",
    "read_oracle_input",
]
