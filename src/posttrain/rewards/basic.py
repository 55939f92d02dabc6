"""String and number rewards: `exact_match`, `numeric`, `format`.

All read the completion's final answer with `extract_answer`: the text after the last answer
marker (`Example.meta["answer_marker"]`, e.g. `"####"`) when present, else the first line.
"""

from __future__ import annotations

import re
from fractions import Fraction

from posttrain.rewards.base import DEFAULT_STOP, cut_at_stop, extract_answer, marker_of, register_reward
from posttrain.tasks.base import Example
from posttrain.utils.errors import InvalidValueError

_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_NUMBER_TOKEN = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?")
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?:/\d+)?")


def parse_number(text: str) -> Fraction | None:
    """Parse `"1,234"`, `"-3.50"`, `"3/4"`, `"1e-3"`, `"$72"`, `"72."` into an exact Fraction.

    Thousands separators (a comma followed by exactly three digits) are removed; a leading `$`, a
    trailing sentence period and spaces are ignored. Returns None if `text` is not a number.
    """
    t = text.strip()
    if t.startswith("$"):
        t = t[1:]
    t = t.rstrip(".").replace(" ", "")
    t = _THOUSANDS.sub("", t)
    if len(t) > 200 or not _PLAIN_NUMBER.fullmatch(t):
        return None
    try:
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def last_number(text: str) -> Fraction | None:
    """The last number-looking token in `text`, parsed with `parse_number` (None if none)."""
    for tok in reversed(_NUMBER_TOKEN.findall(text[-10_000:])):
        v = parse_number(tok)
        if v is not None:
            return v
    return None


@register_reward("exact_match", aliases=("exact",))
class ExactMatchReward:
    """1.0 if the extracted final answer equals `example.answer` (both stripped), else 0.0.

    Params: `marker` overrides the example's answer marker (`""` = never look for one),
    `require_marker` scores 0 when the marker is missing, `case_sensitive`, `stop` strings.
    """

    name = "exact_match"

    def __init__(
        self,
        marker: str | None = None,
        require_marker: bool = False,
        case_sensitive: bool = True,
        stop: tuple[str, ...] | list[str] = DEFAULT_STOP,
    ) -> None:
        self.marker, self.require_marker, self.case_sensitive = marker, require_marker, case_sensitive
        self.stop = tuple(stop)

    def __call__(self, completion: str, example: Example) -> float:
        got = extract_answer(
            completion, marker_of(example, self.marker), stop=self.stop, require_marker=self.require_marker
        )
        if got is None:
            return 0.0
        gold = example.answer.strip()
        if not self.case_sensitive:
            got, gold = got.casefold(), gold.casefold()
        return 1.0 if got == gold else 0.0


@register_reward("numeric")
class NumericReward:
    """1.0 if the extracted answer equals the gold number: `|pred - gold| <= max(abs_tol, rel_tol·|gold|)`.

    Parses integers, decimals, fractions `a/b`, thousands commas, a leading `$`. If the extracted
    answer is not a number as a whole, its last number is used (`"The answer is 72."` -> 72). A gold
    answer that is not a number raises ValueError (the pool counts it as an error). Defaults
    `rel_tol=0, abs_tol=1e-6`: integers must match exactly, `0.333333` matches `1/3`.
    """

    name = "numeric"

    def __init__(
        self,
        rel_tol: float = 0.0,
        abs_tol: float = 1e-6,
        marker: str | None = None,
        require_marker: bool = False,
        stop: tuple[str, ...] | list[str] = DEFAULT_STOP,
    ) -> None:
        if rel_tol < 0 or abs_tol < 0:
            raise InvalidValueError(
                f"reward 'numeric': tolerances must be >= 0, got rel_tol={rel_tol}, abs_tol={abs_tol}"
            )
        self.rel_tol, self.abs_tol = Fraction(rel_tol), Fraction(abs_tol)
        self.marker, self.require_marker, self.stop = marker, require_marker, tuple(stop)

    def __call__(self, completion: str, example: Example) -> float:
        gold = parse_number(example.answer)
        if gold is None:
            raise InvalidValueError(f"example {example.id!r}: gold answer {example.answer!r} is not a number")
        got_text = extract_answer(
            completion, marker_of(example, self.marker), stop=self.stop, require_marker=self.require_marker
        )
        if got_text is None:
            return 0.0
        got = parse_number(got_text)
        if got is None:
            got = last_number(got_text)
        if got is None:
            return 0.0
        return 1.0 if abs(got - gold) <= max(self.abs_tol, self.rel_tol * abs(gold)) else 0.0


@register_reward("format")
class FormatReward:
    """1.0 if the completion has the expected format, else 0.0.

    - `pattern` given: `re.search(pattern, completion, flags=DOTALL)` (or `fullmatch` when
      `fullmatch=True`) after cutting at end-of-sequence stop strings.
    - otherwise: the answer marker (`marker`, else `Example.meta["answer_marker"]`) is present and
      followed by a non-empty answer on its line. An example without a marker and no `pattern` is a
      configuration error (ValueError).
    """

    name = "format"

    def __init__(
        self,
        pattern: str | None = None,
        marker: str | None = None,
        fullmatch: bool = False,
        stop: tuple[str, ...] | list[str] = DEFAULT_STOP,
    ) -> None:
        self.pattern = pattern
        self._re = re.compile(pattern, re.DOTALL) if pattern is not None else None
        self.marker, self.fullmatch, self.stop = marker, fullmatch, tuple(stop)

    def __call__(self, completion: str, example: Example) -> float:
        if self._re is not None:
            text = cut_at_stop(completion, self.stop)
            m = self._re.fullmatch(text) if self.fullmatch else self._re.search(text)
            return 1.0 if m else 0.0
        marker = marker_of(example, self.marker)
        if marker is None:
            raise InvalidValueError(
                f"reward 'format': example {example.id!r} has no meta['answer_marker'] and no "
                "`pattern`/`marker` was given"
            )
        got = extract_answer(completion, marker, stop=self.stop, require_marker=True)
        return 1.0 if got else 0.0
