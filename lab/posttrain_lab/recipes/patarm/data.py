"""Preference data: loading pairs from files and building synthetic pairs from a verifiable task.

File format (JSONL, one object per line, or parquet / arrow / a ``datasets`` ``save_to_disk``
directory with the same columns)::

    {"prompt": "...", "chosen": "...", "rejected": "...", "task_type": "math", "subset": "math-prm"}

``prompt``, ``chosen`` and ``rejected`` are required non-empty strings, or TRL's conversational
preference format: ``chosen`` / ``rejected`` lists of messages ending in the assistant answer, with
``prompt`` as messages or text, or absent (the messages both share before their answers); ``task_type`` (one of
``chat``, ``math``, ``code``, ``safety``; default ``default_task_type``) and ``subset`` (an
evaluation label such as a RewardBench subset or an RM-Bench ``easy``/``normal``/``hard`` level) are
optional. RewardBench rows use ``subset``; RM-Bench rows may carry ``difficulty`` and ``domain``,
which are read as ``subset`` and ``task_type`` when those are absent. Rows without a task type get one
from their benchmark subset when it is known (:func:`subset_task_type`: RewardBench ``math-prm`` →
math, ``hep-*`` → code, ``refusals-*`` / ``xstest-*`` / ``donotanswer`` → safety, ``alpacaeval-*`` /
``mt-bench-*`` / ``llmbar-*`` → chat; RM-Bench domains ``chat``, ``math``, ``code``, ``safety-*``), so
each pair is judged under its task's rubric rather than one rubric for the whole file. A bad row raises
:class:`PreferenceDataError` naming the file, the 1-based line and the field; rows are never dropped
silently.

Synthetic pairs (:func:`synthetic_pairs`): from a verifiable task with integer answers (e.g.
``arithmetic``), chosen = the task's reference solution, rejected = the same solution with a
realistic near-miss final answer (off by one, a dropped or extra carry, swapped last digits, a
dropped minus sign), so a judge must check the arithmetic rather than the form.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.tasks.base import message_pairs
from posttrain.utils.errors import PosttrainError
from posttrain_lab.recipes.patarm.prompts import TASK_TYPES

#: benchmark subset (prefixes end with '-') -> task type, so RewardBench / RM-Bench pairs get the rubric
#: of their task (RewardBench's section mapping, arXiv 2403.13787: Chat and Chat Hard -> chat, Safety ->
#: safety, Reasoning -> math (PRM math) and code (HumanEvalPack); RM-Bench domains, arXiv 2410.16184)
SUBSET_TASK_TYPES: dict[str, str] = {
    "alpacaeval-": "chat",
    "mt-bench-": "chat",
    "llmbar-": "chat",
    "refusals-": "safety",
    "xstest-": "safety",
    "donotanswer": "safety",
    "math-prm": "math",
    "hep-": "code",
    "chat": "chat",
    "math": "math",
    "code": "code",
    "safety-": "safety",
}


def subset_task_type(subset: str | None) -> str | None:
    """The task type of a known RewardBench subset or RM-Bench domain, else None."""
    if not subset:
        return None
    for key, t in SUBSET_TASK_TYPES.items():
        if subset == key or (key.endswith("-") and subset.startswith(key)):
            return t
    return None


class PreferenceDataError(PosttrainError, ValueError):
    """A preference file or row that cannot be used; the message names file, line and field."""


@dataclass(frozen=True)
class PreferencePair:
    """One preference triple; ``task_type`` picks the rubric, ``subset`` labels evaluation groups."""

    prompt: str
    chosen: str
    rejected: str
    task_type: str = "chat"
    subset: str = "all"
    id: str = ""
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def to_row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "prompt": self.prompt,
            "chosen": self.chosen,
            "rejected": self.rejected,
            "task_type": self.task_type,
            "subset": self.subset,
        }


def _rows(path: Path) -> list[tuple[int, Any]]:
    if path.is_dir() or (path.is_file() and path.suffix.lower() == ".arrow"):
        # a `datasets` save_to_disk directory or an .arrow file (tasks.jsonl's reader)
        from posttrain.tasks.jsonl import DatasetError, read_raw_rows

        try:
            return read_raw_rows(path)
        except DatasetError as e:
            raise PreferenceDataError(str(e)) from None
    if not path.is_file():
        raise PreferenceDataError(f"preference file {path} does not exist")
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise PreferenceDataError(f"{path}: reading .parquet needs pyarrow (or convert to .jsonl)") from e
        try:
            return list(enumerate(pq.read_table(path).to_pylist(), start=1))
        except (OSError, ValueError) as e:
            raise PreferenceDataError(f"{path}: not a readable parquet file ({e})") from e
    out: list[tuple[int, Any]] = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise PreferenceDataError(f"{path}:{n}: not valid UTF-8 ({e.reason})") from None
            if not line.strip():
                continue
            try:
                out.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                raise PreferenceDataError(f"{path}:{n}: invalid JSON ({e.msg} at column {e.colno})") from None
    return out


def _str_field(row: dict[str, Any], key: str, where: str, *, required: bool) -> str | None:
    if key not in row or row[key] is None:
        if required:
            raise PreferenceDataError(
                f"{where}: missing field {key!r} (expected keys prompt, chosen, rejected; got "
                f"{', '.join(map(repr, row)) or 'none'})"
            )
        return None
    v = row[key]
    if not isinstance(v, str):
        raise PreferenceDataError(f"{where}: field {key!r} must be a string, got {type(v).__name__}")
    if required and not v.strip():
        raise PreferenceDataError(f"{where}: field {key!r} is empty")
    return v


def _messages(value: Any, where: str) -> list[tuple[str, str]]:
    return message_pairs(value, where, PreferenceDataError)


def _is_conversation(value: Any) -> bool:
    """A list of message objects (TRL), not RM-Bench's list of alternative answer strings."""
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)


def _conversational_pair(row: dict[str, Any], where: str) -> dict[str, str]:
    """TRL's conversational preference rows -> text fields. ``chosen`` / ``rejected`` are message lists
    (the answer: their final assistant message); the prompt is ``prompt`` (a message list or text)
    or, without one (TRL's implicit prompt), the messages ``chosen`` and ``rejected`` share before
    their answers. A multi-message prompt becomes ``role: content`` lines."""
    chosen = _messages(row.get("chosen"), f"{where}: field 'chosen'")
    rejected = _messages(row.get("rejected"), f"{where}: field 'rejected'")
    for name, msgs in (("chosen", chosen), ("rejected", rejected)):
        if msgs[-1][0] != "assistant":
            raise PreferenceDataError(
                f"{where}: field {name!r}: the last message has role {msgs[-1][0]!r}; expected the "
                "'assistant' answer"
            )
    if "prompt" in row and row["prompt"] is not None:
        p = row["prompt"]
        prompt = _messages(p, f"{where}: field 'prompt'") if isinstance(p, list) else [("user", str(p))]
    else:
        prompt = chosen[:-1]
        if prompt != rejected[:-1] or not prompt:
            raise PreferenceDataError(
                f"{where}: no 'prompt' field and 'chosen' / 'rejected' do not share the messages before "
                "their final answers (TRL's implicit prompt); add a 'prompt' field"
            )
    text = prompt[0][1] if len(prompt) == 1 else "\n".join(f"{r}: {c}" for r, c in prompt)
    return {"prompt": text, "chosen": chosen[-1][1], "rejected": rejected[-1][1]}


def parse_pair(row: Any, where: str, *, default_task_type: str = "chat", index: int = 0) -> PreferencePair:
    """One row -> :class:`PreferencePair`; ``where`` (e.g. ``file:line``) prefixes every error."""
    if not isinstance(row, dict):
        raise PreferenceDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if any(_is_conversation(row.get(k)) for k in ("prompt", "chosen", "rejected")):
        row = {**row, **_conversational_pair(row, where)}
    prompt = _str_field(row, "prompt", where, required=True)
    chosen = _str_field(row, "chosen", where, required=True)
    rejected = _str_field(row, "rejected", where, required=True)
    subset = _str_field(row, "subset", where, required=False) or _str_field(
        row, "difficulty", where, required=False
    )
    task_type = (
        _str_field(row, "task_type", where, required=False)
        or _str_field(row, "domain", where, required=False)
        or subset_task_type(subset)
    )
    task_type = (task_type or default_task_type).strip().lower().split("-")[0]  # RM-Bench: safety-refuse
    if task_type not in TASK_TYPES:
        raise PreferenceDataError(
            f"{where}: field 'task_type' is {task_type!r}; accepted: {', '.join(TASK_TYPES)}"
        )
    rid = row.get("id", index)
    return PreferencePair(
        prompt=prompt,  # type: ignore[arg-type]
        chosen=chosen,  # type: ignore[arg-type]
        rejected=rejected,  # type: ignore[arg-type]
        task_type=task_type,
        subset=subset or "all",
        id=str(rid),
    )


def _rmbench_level(i: int, j: int) -> str:
    """RM-Bench accuracy matrix M[i][j] (chosen style i vs rejected style j, styles ordered concise,
    detailed, detailed+markdown): diagonal normal, above it hard, below it easy."""
    return "normal" if i == j else ("hard" if i < j else "easy")


def expand_row(
    row: Any, where: str, *, default_task_type: str = "chat", index: int = 0
) -> list[PreferencePair]:
    """One row -> its pairs: a plain row gives one; an RM-Bench row (``chosen`` and ``rejected`` lists
    of the same length n) gives the n × n comparisons, labelled easy / normal / hard when n = 3."""
    if isinstance(row, dict) and _is_conversation(row.get("chosen")):  # TRL conversational row
        return [parse_pair(row, where, default_task_type=default_task_type, index=index)]
    if isinstance(row, dict) and isinstance(row.get("chosen"), list | tuple):
        ch, rj = row.get("chosen"), row.get("rejected")
        if not isinstance(rj, list | tuple) or len(rj) != len(ch) or not ch:
            raise PreferenceDataError(
                f"{where}: 'chosen' is a list (RM-Bench format), so 'rejected' must be a list of the same "
                f"non-zero length; got {type(rj).__name__}"
            )
        domain = row.get("domain") or row.get("task_type") or default_task_type
        base = {k: v for k, v in row.items() if k not in ("chosen", "rejected", "task_type", "domain")}
        base["task_type"] = str(domain).split("-")[0]
        out = []
        for i, c in enumerate(ch):
            for j, r in enumerate(rj):
                sub = _rmbench_level(i, j) if len(ch) == 3 else f"c{i}-r{j}"
                one = {
                    **base,
                    "chosen": c,
                    "rejected": r,
                    "subset": sub,
                    "id": f"{row.get('id', index)}:{i}{j}",
                }
                out.append(
                    parse_pair(
                        one, f"{where} (chosen[{i}] vs rejected[{j}])", default_task_type=default_task_type
                    )
                )
        return out
    return [parse_pair(row, where, default_task_type=default_task_type, index=index)]


def load_preferences(path: str | Path, *, default_task_type: str = "chat") -> list[PreferencePair]:
    """All pairs of a JSONL / parquet file (RM-Bench rows expanded, :func:`expand_row`); the first bad
    row raises :class:`PreferenceDataError`."""
    p = Path(path)
    pairs = [
        pair
        for i, (n, row) in enumerate(_rows(p))
        for pair in expand_row(row, f"{p}:{n}", default_task_type=default_task_type, index=i)
    ]
    if not pairs:
        raise PreferenceDataError(f"{p}: no preference rows")
    return pairs


def save_preferences(pairs: list[PreferencePair], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w", encoding="utf-8") as f:
        for pair in pairs:
            f.write(json.dumps(pair.to_row()) + "\n")
    return p


# ------------------------------------------------------------------------------------ synthetic pairs
def near_miss(answer: int, rng: random.Random) -> tuple[int, str]:
    """A wrong integer close to ``answer`` and the kind of slip that produced it."""
    s = str(abs(answer))
    kinds = ["off_by_one", "carry", "off_by_ten"]
    if len(s) >= 2 and s[-1] != s[-2]:
        kinds.append("swap")
    if answer < 0:  # a dropped minus sign
        kinds.append("sign")
    for _ in range(16):
        kind = rng.choice(kinds)
        if kind == "off_by_one":
            wrong = answer + rng.choice((-1, 1))
        elif kind == "carry":
            wrong = answer + rng.choice((-10, 10)) if len(s) >= 2 else answer + 10
        elif kind == "off_by_ten":
            wrong = answer + rng.choice((-100, 100)) if len(s) >= 3 else answer + rng.choice((-2, 2))
        elif kind == "swap":
            t = s[:-2] + s[-1] + s[-2]
            wrong = int(t) * (-1 if answer < 0 else 1)
        else:
            wrong = -answer
        if wrong != answer:
            return wrong, kind
    return answer + 1, "off_by_one"


def synthetic_pairs(
    task: Any, split: str = "train", *, style: str = "short", seed: int = 0, limit: int | None = None
) -> list[PreferencePair]:
    """Preference pairs from a verifiable task: chosen = ``task.reference_completion(ex, style)``,
    rejected = that completion with its final answer replaced by a :func:`near_miss`. Only examples
    with an integer gold answer are used; ``task_type`` is ``math``; ``subset`` the slip's kind."""
    rng = random.Random(seed)
    out: list[PreferencePair] = []
    for ex in task.split(split):
        try:
            gold = int(ex.answer)
        except (TypeError, ValueError):
            continue
        chosen = task.reference_completion(ex, style)
        wrong, kind = near_miss(gold, rng)
        at = chosen.rfind(ex.answer)
        if at < 0:
            continue
        rejected = chosen[:at] + str(wrong) + chosen[at + len(ex.answer) :]
        out.append(
            PreferencePair(
                prompt=ex.prompt,
                chosen=chosen,
                rejected=rejected,
                task_type="math",
                subset=kind,
                id=f"{ex.id}",
                meta={"answer": ex.answer},
            )
        )
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise PreferenceDataError(
            f"task {getattr(task, 'name', task)!r} split {split!r}: no example with an integer answer to "
            "build preference pairs from"
        )
    return out
