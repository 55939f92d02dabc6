"""Scoring modes: how one finished case's answers, tokens and message counts become S, P, C, D.

Two modes, in the registry `SCORINGS` (``posttrain silo run|report --scoring NAME``):

* ``default`` (posttrain's documented scoring, `posttrain_lab.benchmarks.silo.metrics`): answers normalised with
  `metrics.normalize_value` (Python ``True``/``False`` strings, quoted JSON strings, integer dict keys
  all understood) and compared with a bool equal only to a bool; Level-III partial credit matches
  duplicates in order. Table 1 shows ``C_paper`` and ``D_paper``.
* ``paper``: the metric semantics of the authors' code (jwyjohn/acl26-silo-bench, ``src/utils/metrics.py``
  ``_normalize_value`` / ``compute_success_rate`` / ``compute_partial_correctness`` and ``src/engine.py``
  ``evaluate`` / ``_count_messages``), so numbers are comparable with the paper's tables (arXiv
  2603.01045, Table 1): Python ``==`` after their normalisation (an answer ``1`` for ``True`` counts,
  ``5`` equals ``5.0``), their string handling (strip; ``int``, then ``float``, then JSON only for text
  starting with ``[`` or ``{``; anything else stays a string, so ``"True"`` is not ``True``), C as
  their code computes it (``(input + output) / rounds executed``, ``C_code``) beside the paper's formula
  (``output / R_max``, ``C_paper``), and D = m / (N(N−1)) with m counted as their code does
  (``D_code``). Three behaviours of their code are deliberately NOT reproduced (docs/silo-bench.md,
  "Scoring modes"): Level-III P raising on list-of-list answers, duplicates in a Level-III answer
  keeping only their last index, and a repeated submission record counting twice.

C and D are computed identically in both modes (both variants are always stored); the modes differ in
S, P, success, and in which C / D columns Table 1 shows (`Scoring.c_columns`, `Scoring.d_column`).

`CaseScoreInput` holds everything a mode needs; the engine builds it at the end of a case and
`posttrain silo report --scoring` rebuilds it from a saved ``results.json`` (`inputs_from_results`) to
rescore a finished sweep without re-running agents.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from posttrain.utils.errors import InvalidValueError
from posttrain.utils.registry import Registry
from posttrain_lab.benchmarks.silo import metrics


@dataclass(frozen=True)
class CaseScoreInput:
    """What scoring one case needs. `answers[i]` is agent i's submitted answer (None when it did not
    submit, `submitted[i]` False); message counts are m of D = m / (N(N−1)) for each variant."""

    task_id: str
    level: int
    num_agents: int
    expected: Sequence[Any]
    answers: Sequence[Any]
    submitted: Sequence[bool]
    input_tokens: int
    output_tokens: int
    rounds_executed: int
    max_rounds: int
    messages_code: int
    messages_paper: int
    messages_bp_weighted: int | None = None  # BP only: each broadcast x (N - 1)

    def __post_init__(self) -> None:
        n = self.num_agents
        for name in ("expected", "answers", "submitted"):
            if len(getattr(self, name)) != n:
                raise InvalidValueError(
                    f"{name} has {len(getattr(self, name))} entries, expected {n} (one per agent)"
                )


class Scoring:
    """A scoring mode: `correct(answer, expected)`, `partial(answer, expected, level)` and the Table 1
    columns; `score(inp)` returns the metrics dict stored in results.json / results.jsonl."""

    name: ClassVar[str]
    description: ClassVar[str]
    c_columns: ClassVar[tuple[str, ...]]  # tokens-per-round column(s) of Table 1
    d_column: ClassVar[str]  # density column of Table 1

    def correct(self, answer: Any, expected: Any) -> bool:
        raise NotImplementedError

    def partial(self, answer: Any, expected: Any, level: int) -> float:
        raise NotImplementedError

    def correct_list(self, inp: CaseScoreInput) -> list[bool]:
        return [
            bool(s) and self.correct(a, e)
            for a, e, s in zip(inp.answers, inp.expected, inp.submitted, strict=True)
        ]

    def score(self, inp: CaseScoreInput) -> dict[str, float]:
        n = inp.num_agents
        correct = self.correct_list(inp)
        partial = [
            self.partial(a, e, inp.level) if s else 0.0
            for a, e, s in zip(inp.answers, inp.expected, inp.submitted, strict=True)
        ]
        met = {
            "S_success_rate": sum(correct) / n,
            "P_partial_correctness": sum(partial) / n,
            "C_code": metrics.token_consumption_code(
                inp.input_tokens, inp.output_tokens, inp.rounds_executed
            ),
            "C_paper": metrics.token_consumption_paper(inp.output_tokens, inp.max_rounds),
            "D_code": metrics.communication_density(inp.messages_code, n),
            "D_paper": metrics.communication_density(inp.messages_paper, n),
        }
        if inp.messages_bp_weighted is not None:
            met["D_bp_recipient_weighted"] = metrics.communication_density(inp.messages_bp_weighted, n)
        # the names of the authors' results.json (their C and D are the code variants)
        met["C_token_consumption"] = met["C_code"]
        met["D_communication_density"] = met["D_code"]
        met["success_rate"] = met["S_success_rate"]
        met["partial_correctness"] = met["P_partial_correctness"]
        return met


SCORINGS: Registry[Scoring] = Registry("SILO scoring mode")
DEFAULT_SCORING = "default"


@SCORINGS.register("default")
class DefaultScoring(Scoring):
    name = "default"
    description = "posttrain's scoring (metrics.normalize_value, bool only equals bool; C_paper, D_paper)"
    c_columns = ("C_paper",)
    d_column = "D_paper"

    def correct(self, answer: Any, expected: Any) -> bool:
        return metrics.is_correct(answer, expected)

    def partial(self, answer: Any, expected: Any, level: int) -> float:
        return metrics.partial_credit(answer, expected, level)


# --------------------------------------------------------------------------------------------- paper


def paper_normalize(value: Any) -> Any:
    """The authors' value normalisation (``_normalize_value``): a string is stripped and read as
    ``int``, else ``float``, else, when it starts with ``[`` or ``{``, as JSON (normalised again);
    otherwise it stays the stripped string. Lists are normalised element-wise; everything else (dicts,
    bools, numbers, None) is returned unchanged."""
    if isinstance(value, str):
        s = value.strip()
        try:
            return int(s)
        except ValueError:
            pass
        try:
            return float(s)
        except ValueError:
            pass
        if s.startswith(("[", "{")):
            try:
                return paper_normalize(json.loads(s))
            except (ValueError, RecursionError):
                pass
        return s
    if isinstance(value, list):
        return [paper_normalize(v) for v in value]
    return value


def _py_equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except RecursionError:
        return False


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float)  # bools included, as in the authors' isinstance check


def _py_key(value: Any) -> Any:
    """A hashable stand-in with Python's equality (lists -> tuples, dicts -> frozensets of items):
    ``_py_key(a) == _py_key(b)`` iff ``a == b``, so 1, 1.0 and True share a key as in the authors' map."""
    if isinstance(value, list):
        return ("list", tuple(_py_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", frozenset((k, _py_key(v)) for k, v in value.items()))
    return value


def paper_partial(answer: Any, expected: Any, level: int) -> float:
    """q_i with the authors' rules after `paper_normalize`:

    - Level I: both numeric (bool counts as a number, as in Python): 1 iff |ŷ − y| ≤ 0.01·|y| (y = 0:
      ŷ == 0); otherwise 1 iff ŷ == y.
    - Level II: both lists: # positions equal (zip) / len(y) (an empty y needs an empty ŷ); else ŷ == y.
    - Level III: both lists: LIS of the positions in y of ŷ's elements that occur in y, / len(y);
      else ŷ == y. Fixed here (their code raises on list elements and maps duplicates to their last
      index): elements are looked up by a hashable form with Python's equality, and the k-th copy of a
      value maps to its k-th occurrence in y (surplus copies are skipped).
    """
    if level not in (1, 2, 3):
        raise InvalidValueError(f"level must be 1, 2 or 3, got {level!r}")
    y, a = paper_normalize(expected), paper_normalize(answer)
    if level == 1:
        if _is_num(y) and _is_num(a):
            if y == 0:
                return float(a == 0)
            try:
                diff = abs(a - y)
            except OverflowError:  # a huge int against a float
                return 0.0
            return float(not math.isnan(diff) and diff <= metrics.LEVEL_I_TOLERANCE * abs(y))
        return float(_py_equal(a, y))
    if not (isinstance(y, list) and isinstance(a, list)):
        return float(_py_equal(a, y))
    if not y:
        return float(not a)
    if level == 2:
        return sum(_py_equal(p, q) for p, q in zip(y, a, strict=False)) / len(y)
    slots: dict[Any, deque[int]] = defaultdict(deque)
    for i, v in enumerate(y):
        slots[_py_key(v)].append(i)
    positions = []
    for v in a:
        free = slots.get(_py_key(v))
        if free:
            positions.append(free.popleft())
    return metrics._lis_length(positions) / len(y)


@SCORINGS.register("paper")
class PaperScoring(Scoring):
    name = "paper"
    description = (
        "the authors' metric semantics (Python ==, their string handling; C_code and C_paper, D_code)"
    )
    c_columns = ("C_code", "C_paper")
    d_column = "D_code"

    def correct(self, answer: Any, expected: Any) -> bool:
        return _py_equal(paper_normalize(answer), paper_normalize(expected))

    def partial(self, answer: Any, expected: Any, level: int) -> float:
        return paper_partial(answer, expected, level)


def get_scoring(name: str) -> Scoring:
    """The scoring mode `name` (case-insensitive); `UnknownNameError` lists the known ones."""
    return SCORINGS.get(name.strip().lower() if isinstance(name, str) else name)()


# ---------------------------------------------------------------------------- rescoring saved cases


def inputs_from_results(doc: dict[str, Any], where: str = "results.json") -> CaseScoreInput:
    """Rebuild a case's `CaseScoreInput` from its saved ``results.json`` (`CaseResult.results_json`).

    Message counts come from ``communication.messages`` (written since scoring modes exist); for older
    files they are recovered from the stored densities (m = D · N(N−1), exact integers)."""

    def need(key: str, kind: type | tuple[type, ...]) -> Any:
        v = doc.get(key)
        if not isinstance(v, kind) or isinstance(v, bool):
            raise InvalidValueError(f"{where}: key {key!r} missing or not {kind}")
        return v

    n = need("num_agents", int)
    subs = need("submissions", list)
    if len(subs) != n:
        raise InvalidValueError(f"{where}: 'submissions' has {len(subs)} entries, expected {n}")
    tokens = need("tokens", dict)
    comm = doc.get("communication") or {}
    counts = comm.get("messages")
    if not isinstance(counts, dict):
        met = need("metrics", dict)
        pairs = n * (n - 1)
        counts = {"code": round(met["D_code"] * pairs), "paper": round(met["D_paper"] * pairs)}
        if "D_bp_recipient_weighted" in met:
            counts["bp_weighted"] = round(met["D_bp_recipient_weighted"] * pairs)
    return CaseScoreInput(
        task_id=need("task_id", str),
        level=need("level", int),
        num_agents=n,
        expected=need("ground_truth", list),
        answers=[s.get("answer") for s in subs],
        submitted=[s.get("round") is not None for s in subs],
        input_tokens=int(tokens["input"]),
        output_tokens=int(tokens["output"]),
        rounds_executed=need("rounds_executed", int),
        max_rounds=need("max_rounds", int),
        messages_code=int(counts["code"]),
        messages_paper=int(counts["paper"]),
        messages_bp_weighted=counts.get("bp_weighted"),
    )


__all__ = [
    "DEFAULT_SCORING",
    "SCORINGS",
    "CaseScoreInput",
    "DefaultScoring",
    "PaperScoring",
    "Scoring",
    "get_scoring",
    "inputs_from_results",
    "paper_normalize",
    "paper_partial",
]
