"""SILO-BENCH metrics (arXiv 2603.01045 §3.3; the authors' `src/utils/metrics.py` in
jwyjohn/acl26-silo-bench, re-implemented).

Pure functions on plain Python values: no I/O, no engine state.

- S (success rate)            S = (1/N) Σ_i 1[norm(ŷ_i) = norm(y*_i)]         exact, no float tolerance
- P (partial correctness)     P = (1/N) Σ_i q_i                                q_i level-specific
- C (token consumption)       paper: Σ output tokens / R_max;  code: (input + output) / rounds executed
- D (communication density)   D = m / (N (N − 1)), uncapped
- RCC                         1 − SR(N = k) / SR(N = 1)                        (paper §4.1)
- emergent leader             an agent receiving > 1.5 × the average number of messages (paper App. G.3)
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any

from posttrain.utils.errors import InvalidValueError

LEVEL_I_TOLERANCE = 0.01
LEADER_FACTOR = 1.5


def normalize_value(value: Any) -> Any:
    """Canonical form for comparing an answer with the ground truth (the default scoring mode; the authors'
    rules are `posttrain_lab.benchmarks.silo.scoring.paper_normalize`).

    - strings: parsed as int, then float, then JSON (lists / objects / true / false / null / a quoted
      string literal, which is unwrapped and parsed again); otherwise kept (surrounding whitespace
      stripped). Python-style "True" / "False" become booleans too, since agents
      write them (I-04's prompt says submit_result(True/False)).
    - tuples become lists; lists are normalised element-wise (recursively);
    - dicts: keys become strings (`str(int)` for integer keys, so {0: 1} and {"0": 1} agree), values are
      normalised recursively;
    - ints, floats, bools, None are returned unchanged.
    """
    if isinstance(value, str):
        return _parse_string(value)
    if isinstance(value, list | tuple):
        return [normalize_value(v) for v in value]
    if isinstance(value, dict):
        return {_normalize_key(k): normalize_value(v) for k, v in value.items()}
    return value


def _normalize_key(key: Any) -> str:
    if isinstance(key, str):
        parsed = _parse_string(key)
        # "1.0" and "1" both name node 1; keep non-numeric keys verbatim (stripped)
        if isinstance(parsed, float) and parsed.is_integer():
            return str(int(parsed))
        if isinstance(parsed, int) and not isinstance(parsed, bool):
            return str(parsed)
        return key.strip()
    if isinstance(key, bool):
        return str(key)
    if isinstance(key, float) and key.is_integer():
        return str(int(key))
    return str(key)


def _parse_string(text: str) -> Any:
    s = text.strip()
    try:
        return int(s)
    except ValueError:
        pass
    try:
        f = float(s)
        if math.isfinite(f):
            return f
    except ValueError:
        pass
    if s in ("True", "False"):
        return s == "True"
    try:
        parsed = json.loads(s)
    except (json.JSONDecodeError, RecursionError):
        return s
    if isinstance(parsed, list | dict):
        return normalize_value(parsed)
    if isinstance(parsed, bool) or parsed is None:
        return parsed
    if isinstance(parsed, str):  # a quoted JSON string literal: '"Candidate_A"' -> 'Candidate_A'
        return _parse_string(parsed) if parsed.strip() != s else parsed
    return s


def _equal(a: Any, b: Any) -> bool:
    """Structural equality in which a bool only equals a bool (Python's True == 1 does not count),
    ints and floats compare numerically, lists element-wise and dicts key-wise."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) and _is_number(b):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def is_correct(answer: Any, expected: Any) -> bool:
    """Exact match after `normalize_value` on both sides; a missing answer (None) is wrong
    unless the expected value itself is None."""
    if answer is None:
        return expected is None
    return _equal(normalize_value(answer), normalize_value(expected))


def success_rate(answers: Sequence[Any], expected: Sequence[Any]) -> float:
    """S = (1/N) Σ_i 1[ŷ_i = y*_i] over the N agents (arXiv 2603.01045 §3.3); `None` = no submission =
    wrong. An instance succeeds iff S == 1."""
    _check_lengths(answers, expected)
    if not expected:
        raise InvalidValueError("success_rate needs at least one agent")
    return sum(is_correct(a, e) for a, e in zip(answers, expected, strict=True)) / len(expected)


def _check_lengths(answers: Sequence[Any], expected: Sequence[Any]) -> None:
    if len(answers) != len(expected):
        raise InvalidValueError(
            f"answers has {len(answers)} entries but expected has {len(expected)} (one per agent)"
        )


def partial_credit(answer: Any, expected: Any, level: int) -> float:
    """q_i of one agent (arXiv 2603.01045 §3.3; the authors' `compute_partial_correctness`).

    - Level I: numeric y: 1 if |ŷ − y| ≤ 0.01·|y| (integers too; y = 0 needs an exact 0); non-numeric:
      exact match.
    - Level II: lists: (# positions p < min(len) with ŷ[p] = y[p]) / len(y); non-lists: exact.
    - Level III: lists: LIS length of the positions in y of the submitted elements that occur in y, divided
      by len(y). Elements are compared in normalised, hashable form (nested lists → nested tuples, dicts →
      sorted item tuples), which fixes the authors' crash on list-of-list answers (III-25, III-27, III-30).
      Duplicates are matched in order: the k-th submitted copy of a value maps to the k-th occurrence of
      that value in y, and surplus copies are ignored (the authors' map keeps only the last occurrence, so a
      correct answer with duplicates scores below 1).
    """
    if level not in (1, 2, 3):
        raise InvalidValueError(f"level must be 1, 2 or 3, got {level!r}")
    if answer is None:
        return 0.0
    a, y = normalize_value(answer), normalize_value(expected)
    if level == 1:
        if _is_number(a) and _is_number(y):
            if y == 0:
                return float(a == 0)
            return float(abs(a - y) <= LEVEL_I_TOLERANCE * abs(y))
        return float(_equal(a, y))
    if not (isinstance(a, list) and isinstance(y, list)):
        return float(_equal(a, y))
    if not y:
        return float(not a)
    if level == 2:
        return sum(_equal(p, q) for p, q in zip(a, y, strict=False)) / len(y)
    positions: dict[Any, deque[int]] = defaultdict(deque)
    for idx, item in enumerate(y):
        positions[_hashable(item)].append(idx)
    seq = []
    for item in a:
        slots = positions.get(_hashable(item))
        if slots:
            seq.append(slots.popleft())
    return _lis_length(seq) / len(y)


def answer_key(value: Any) -> Any:
    """A hashable key of an answer: two answers have the same key iff `is_correct` would judge them
    equal (after `normalize_value`: 5, "5" and 5.0 share a key; True and 1 do not)."""
    return _hashable(normalize_value(value))


def _hashable(value: Any) -> Any:
    # canonical key: numbers by value (1 and 1.0 equal, like `_equal`) but bools kept apart
    if isinstance(value, bool):
        return ("bool", value)
    if _is_number(value):
        return ("num", value)
    if isinstance(value, list):
        return ("list", tuple(_hashable(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _hashable(v)) for k, v in value.items())))
    return ("other", value)


def _lis_length(seq: Sequence[int]) -> int:
    """Length of the longest strictly increasing subsequence (patience sorting, O(n log n))."""
    tails: list[int] = []
    for x in seq:
        i = bisect_left(tails, x)
        if i == len(tails):
            tails.append(x)
        else:
            tails[i] = x
    return len(tails)


def partial_correctness(answers: Sequence[Any], expected: Sequence[Any], level: int) -> float:
    """P = (1/N) Σ_i q_i with q_i from `partial_credit`; `None` answers score 0."""
    _check_lengths(answers, expected)
    if not expected:
        raise InvalidValueError("partial_correctness needs at least one agent")
    return sum(partial_credit(a, e, level) for a, e in zip(answers, expected, strict=True)) / len(expected)


def _nonneg(name: str, value: Any) -> float:
    if isinstance(value, bool) or not _is_number(value) or value < 0 or not math.isfinite(value):
        raise InvalidValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def token_consumption_code(input_tokens: int, output_tokens: int, rounds_executed: int) -> float:
    """C (authors' code, `src/engine.py` `evaluate`): (total input + total output tokens) / rounds actually
    executed. 0.0 when no round ran."""
    total = _nonneg("input_tokens", input_tokens) + _nonneg("output_tokens", output_tokens)
    rounds = _nonneg("rounds_executed", rounds_executed)
    return total / rounds if rounds else 0.0


def token_consumption_paper(output_tokens: int | Sequence[int], max_rounds: int = 100) -> float:
    """C (paper §3.3): Σ_i Σ_r t_out[i][r] / R_max: output tokens only, divided by R_max (default 100).
    `output_tokens` is the total or any flat sequence of per-agent / per-call counts."""
    if not _is_number(output_tokens) and not isinstance(output_tokens, bool):
        output_tokens = sum(_nonneg("output_tokens[i]", t) for t in output_tokens)
    total = _nonneg("output_tokens", output_tokens)
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise InvalidValueError(f"max_rounds must be a positive integer, got {max_rounds!r}")
    return total / max_rounds


def communication_density(message_count: int, num_agents: int) -> float:
    """D = m / (N (N − 1)) (arXiv 2603.01045 §3.3), uncapped (can exceed 1). N = 1 (oracle baseline) gives
    0.0.

    What m counts depends on the protocol variant (P2P message files; BP broadcasts, not × (N − 1); SFS
    keys written per round in the code variant or successful reads by others in the paper variant):
    the caller counts, this function only normalises.
    """
    m = _nonneg("message_count", message_count)
    if isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1:
        raise InvalidValueError(f"num_agents must be a positive integer, got {num_agents!r}")
    if num_agents == 1:
        return 0.0
    return m / (num_agents * (num_agents - 1))


def relative_coordination_cost(sr_k: float, sr_1: float) -> float:
    """RCC = 1 − SR(N = k) / SR(N = 1) (paper §4.1). Scale-free: pass both as fractions or both as
    percentages. NaN when SR(N = 1) = 0 (undefined)."""
    _nonneg("sr_k", sr_k)
    _nonneg("sr_1", sr_1)
    if sr_1 == 0:
        return math.nan
    return 1.0 - sr_k / sr_1


def emergent_leaders(received_counts: Sequence[int], factor: float = LEADER_FACTOR) -> list[int]:
    """Agents that received more than `factor` (1.5) × the average number of messages (paper App. G.3).
    Returns their ids in increasing order; no leader when nobody received anything."""
    counts = [_nonneg(f"received_counts[{i}]", c) for i, c in enumerate(received_counts)]
    if not counts:
        return []
    mean = sum(counts) / len(counts)
    if mean == 0:
        return []
    return [i for i, c in enumerate(counts) if c > factor * mean]


__all__ = [
    "answer_key",
    "communication_density",
    "emergent_leaders",
    "is_correct",
    "normalize_value",
    "partial_correctness",
    "partial_credit",
    "relative_coordination_cost",
    "success_rate",
    "token_consumption_code",
    "token_consumption_paper",
]
