"""Judge prompts and output parsing for PaTaRM-style generative reward models (arXiv 2510.24235).

A pointwise judge reads ONE response and writes a score; a pairwise judge reads two and names the
better one. Prompts start with a task tag and a rubric block, as described for PaTaRM
(``<task>chat</task>`` then ``<rubrics>``); the rest of the format is a **proposed design** (the
authors' prompt body, tags and scale are not published in the abstract):

Pointwise input (``rubric_style="full"``)::

    <task>math</task>
    <rubrics>
    Final-answer correctness: the final answer equals the correct result
    ...
    </rubrics>
    <question>{prompt}</question>
    <response>{response}</response>
    Instruction: first write instance-specific criteria for this question, then evaluate ...

Expected output: ``<criteria>...</criteria><score>7</score>`` (optionally after a ``<think>`` block).
The primary (task-level) criteria are data files ``posttrain/recipes/patarm/rubrics/{task}.txt``; the
instance-specific criteria are written by the judge itself. ``rubric_style="names"`` lists only the
criterion names and ``"none"`` drops the block and the instruction (short prompts for tiny
character-level models). Chat templating is applied by :class:`posttrain.rollout.PromptFormatter`
(``chat=True`` for instruction-tuned judges such as Qwen3; plain text for the tiny presets).
"""

from __future__ import annotations

import math
import re
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Literal

from posttrain.utils.errors import PosttrainError

TASK_TYPES: tuple[str, ...] = ("chat", "math", "code", "safety")
RubricStyle = Literal["full", "names", "none"]
RUBRIC_STYLES: tuple[str, ...] = ("full", "names", "none")
DEFAULT_SCALE: tuple[float, float] = (1.0, 10.0)

POINTWISE_INSTRUCTION = (
    "Instruction: first write instance-specific criteria for this question inside <criteria></criteria>, "
    "then evaluate the response against all criteria, then give one integer score from {lo} to {hi} "
    "inside <score></score>."
)
PAIRWISE_INSTRUCTION = (
    "Instruction: first write instance-specific criteria for this question inside <criteria></criteria>, "
    "then compare both responses against all criteria, then name the better response, A or B, inside "
    "<preferred></preferred>."
)

# bounded parsing: the score tag is found with str.rfind (C speed, any length); a number is read from at
# most _TAG_WINDOW characters after it, and the fallback scans only the last _TAIL characters
_TAG_WINDOW = 64
_TAIL = 4096
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


class RubricError(PosttrainError, ValueError):
    """An unknown task type or a malformed rubric file."""


# ----------------------------------------------------------------------------------------- rubrics
def _rubric_text(task_type: str, rubric_dir: str | Path | None) -> tuple[str, str]:
    if rubric_dir is not None:
        path = Path(rubric_dir) / f"{task_type}.txt"
        if not path.is_file():
            known = sorted(p.stem for p in Path(rubric_dir).glob("*.txt"))
            raise RubricError(
                f"no rubric for task type {task_type!r}: {path} does not exist (rubrics there: "
                f"{', '.join(known) or 'none'})"
            )
        return path.read_text(encoding="utf-8"), str(path)
    if task_type not in TASK_TYPES:
        raise RubricError(f"unknown task type {task_type!r}; accepted: {', '.join(TASK_TYPES)}")
    res = files("posttrain_lab.recipes.patarm") / "rubrics" / f"{task_type}.txt"
    return res.read_text(encoding="utf-8"), f"posttrain/recipes/patarm/rubrics/{task_type}.txt"


@cache
def _load_rubric_cached(task_type: str, rubric_dir: str | None) -> tuple[tuple[str, str], ...]:
    text, where = _rubric_text(task_type, rubric_dir)
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, desc = line.partition(":")
        if not sep or not name.strip() or not desc.strip():
            raise RubricError(f"{where}:{n}: expected 'Criterion: description', got {line!r}")
        out.append((name.strip(), desc.strip()))
    if not out:
        raise RubricError(f"{where}: no criteria (expected 'Criterion: description' lines)")
    return tuple(out)


def load_rubric(task_type: str, rubric_dir: str | Path | None = None) -> list[tuple[str, str]]:
    """Primary criteria ``[(name, description), ...]`` of ``task_type`` (``chat``, ``math``, ``code``,
    ``safety``; any ``{name}.txt`` in ``rubric_dir`` when given)."""
    return list(_load_rubric_cached(task_type, None if rubric_dir is None else str(rubric_dir)))


def _header(task_type: str, rubric_style: str, rubric_dir: str | Path | None) -> list[str]:
    if rubric_style not in RUBRIC_STYLES:
        raise RubricError(f"unknown rubric_style {rubric_style!r}; accepted: {', '.join(RUBRIC_STYLES)}")
    lines = [f"<task>{task_type}</task>"]
    if rubric_style == "none":
        load_rubric(task_type, rubric_dir)  # the task type must still be known
        return lines
    crit = load_rubric(task_type, rubric_dir)
    body = [f"{n}: {d}" for n, d in crit] if rubric_style == "full" else [n for n, _ in crit]
    return [*lines, "<rubrics>", *body, "</rubrics>"]


def _fmt_scale(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def pointwise_prompt(
    question: str,
    response: str,
    task_type: str = "chat",
    *,
    rubric_style: RubricStyle = "full",
    scale: tuple[float, float] = DEFAULT_SCALE,
    rubric_dir: str | Path | None = None,
) -> str:
    """The pointwise judge prompt (raw text; chat templating is the formatter's job)."""
    lines = _header(task_type, rubric_style, rubric_dir)
    lines += [f"<question>{question}</question>", f"<response>{response}</response>"]
    if rubric_style != "none":
        lines.append(POINTWISE_INSTRUCTION.format(lo=_fmt_scale(scale[0]), hi=_fmt_scale(scale[1])))
    return "\n".join(lines) + "\n"


def pairwise_prompt(
    question: str,
    response_a: str,
    response_b: str,
    task_type: str = "chat",
    *,
    rubric_style: RubricStyle = "full",
    rubric_dir: str | Path | None = None,
) -> str:
    """The pairwise judge prompt: both responses, the judge answers ``<preferred>A|B</preferred>``.
    Callers randomise or swap the order (see :func:`posttrain_lab.recipes.patarm.evaluate.evaluate_pairwise`)."""
    lines = _header(task_type, rubric_style, rubric_dir)
    lines += [
        f"<question>{question}</question>",
        f"<response_a>{response_a}</response_a>",
        f"<response_b>{response_b}</response_b>",
    ]
    if rubric_style != "none":
        lines.append(PAIRWISE_INSTRUCTION)
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------- parsing
def _first_number(s: str) -> float | None:
    m = _NUMBER.search(s)
    if m is None:
        return None
    try:
        v = float(m.group())
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def parse_score(
    text: str | None,
    *,
    scale: tuple[float, float] = DEFAULT_SCALE,
    clamp: bool = True,
    fallback: bool = True,
) -> float | None:
    """The score of a pointwise judgment, or None when there is none (proposed format).

    Rules: the **last** ``<score>…</score>`` wins; whitespace inside the tag is allowed and the first
    number in it is read (``<score> 7 </score>``, ``<score>7/10</score>`` → 7; decimals kept). A score
    outside ``scale`` is **clamped** to it (``clamp=False``: None instead). A tag without a number
    (``<score>high</score>``) makes the output unparsable (None) — it does not fall back. With no
    complete tag, ``fallback=True`` takes the last number of the text's last 4096 characters (clamped
    likewise). Non-strings, empty text, NaN / infinity give None; no input raises. Work is bounded on
    huge inputs: the tag is found by ``str.rfind`` and at most a few kilobytes are scanned by regex.

    Thinking models: only the text after the last ``</think>`` is read; a ``<think>`` block that is
    never closed (a judgment cut off while reasoning) gives None — neither its tags nor its last
    number are ever taken as the verdict.
    """
    if not isinstance(text, str) or not text:
        return None
    text = after_thinking(text)
    if not text:
        return None
    lo, hi = float(scale[0]), float(scale[1])
    end = text.rfind("</score>")
    value: float | None
    if end >= 0:
        start = text.rfind("<score>", 0, end)
        if start < 0 or end - start - len("<score>") > _TAG_WINDOW:
            return None if start >= 0 else _fallback(text[:end], lo, hi, clamp, fallback)
        value = _first_number(text[start + len("<score>") : end])
        if value is None:
            return None
    else:
        return _fallback(text, lo, hi, clamp, fallback)
    return _in_scale(value, lo, hi, clamp)


def after_thinking(text: str) -> str:
    """The answer part of a judgment: the text after the last ``</think>``; ``""`` when a ``<think>``
    is still open at the end (the reasoning was cut off: there is no verdict)."""
    close = text.rfind("</think>")
    if text.rfind("<think>") > close:
        return ""
    return text[close + len("</think>") :] if close >= 0 else text


def _fallback(text: str, lo: float, hi: float, clamp: bool, enabled: bool) -> float | None:
    if not enabled:
        return None
    nums = _NUMBER.findall(text[-_TAIL:])
    if not nums:
        return None
    try:
        v = float(nums[-1])
    except ValueError:
        return None
    return _in_scale(v, lo, hi, clamp) if math.isfinite(v) else None


def _in_scale(v: float, lo: float, hi: float, clamp: bool) -> float | None:
    if lo <= v <= hi:
        return v
    return min(max(v, lo), hi) if clamp else None


def parse_preference(text: str | None) -> str | None:
    """``"A"`` or ``"B"`` from the last ``<preferred>…</preferred>`` of a pairwise judgment, else None."""
    if not isinstance(text, str):
        return None
    text = after_thinking(text)
    end = text.rfind("</preferred>")
    if end < 0:
        return None
    start = text.rfind("<preferred>", 0, end)
    if start < 0 or end - start > _TAG_WINDOW:
        return None
    label = text[start + len("<preferred>") : end].strip().upper()
    return label if label in ("A", "B") else None


def normalise_score(score: float, scale: tuple[float, float] = DEFAULT_SCALE) -> float:
    """``(s − s_min) / (s_max − s_min)`` on the fixed scale: a reward in [0, 1] (proposed design)."""
    lo, hi = float(scale[0]), float(scale[1])
    return (score - lo) / (hi - lo)
