"""`countdown` reward: the extracted expression uses the given numbers (each at most once) and
evaluates exactly to the target. Parsing is `posttrain.tasks.countdown.parse_expression` (a tiny
recursive-descent parser over integers, + - * / and parentheses; never eval)."""

from __future__ import annotations

from posttrain.rewards.base import DEFAULT_STOP, extract_answer, marker_of, register_reward
from posttrain.tasks.base import Example
from posttrain.tasks.countdown import ExpressionError, parse_expression, uses_numbers
from posttrain.utils.errors import InvalidValueError


@register_reward("countdown")
class CountdownReward:
    """1.0 if `expr` (optionally written `expr = target`) is valid, uses only `meta["numbers"]` as a
    sub-multiset (all of them if `use_all`) and equals `meta["target"]` exactly; `format_score` if it
    parses but is wrong (TinyZero uses 0.1; default 0.0); 0.0 if it does not parse.

    An example without integer `meta["numbers"]` / `meta["target"]` raises ValueError.
    """

    name = "countdown"

    def __init__(
        self,
        format_score: float = 0.0,
        use_all: bool = False,
        marker: str | None = None,
        stop: tuple[str, ...] | list[str] = DEFAULT_STOP,
    ) -> None:
        if not 0.0 <= format_score <= 1.0:
            raise InvalidValueError(f"reward 'countdown': format_score must be in [0, 1], got {format_score}")
        self.format_score, self.use_all, self.marker, self.stop = format_score, use_all, marker, tuple(stop)

    def __call__(self, completion: str, example: Example) -> float:
        numbers, target = example.meta.get("numbers"), example.meta.get("target")
        if (
            not isinstance(numbers, list)
            or not all(isinstance(n, int) for n in numbers)
            or not isinstance(target, int)
        ):
            raise InvalidValueError(
                f"example {example.id!r}: countdown needs meta['numbers'] (list of int) and "
                f"meta['target'] (int), got {numbers!r}, {target!r}"
            )
        text = extract_answer(completion, marker_of(example, self.marker), stop=self.stop)
        if not text:
            return 0.0
        lhs, eq, rhs = text.partition("=")
        try:
            value, used = parse_expression(lhs)
            if eq:
                stated, stated_used = parse_expression(rhs)
                if stated_used != [target] or stated != target:
                    return self.format_score
        except ExpressionError:
            return 0.0
        ok = value == target and uses_numbers(used, numbers)
        if ok and self.use_all:
            ok = sorted(used) == sorted(numbers)
        return 1.0 if ok else self.format_score
