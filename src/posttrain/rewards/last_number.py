"""`last_number`: 1.0 when the last number in the completion equals the gold number.

For chat models that reason before answering ("9 - 5 = 4 ... so she has 12 stickers"): the answer is
read as the last number anywhere in the completion (text after an end-of-sequence string cut first),
compared like `numeric` (`|pred - gold| <= max(abs_tol, rel_tol |gold|)`, exact rationals). Default
reward of the `word_problems` task.
"""

from __future__ import annotations

from fractions import Fraction

from posttrain.rewards.base import DEFAULT_STOP, cut_at_stop, register_reward
from posttrain.rewards.basic import last_number, parse_number
from posttrain.tasks.base import Example
from posttrain.utils.errors import InvalidValueError


@register_reward("last_number")
class LastNumberReward:
    """1.0 if the completion's last number equals the gold answer (see the module docstring)."""

    name = "last_number"

    def __init__(
        self, rel_tol: float = 0.0, abs_tol: float = 1e-6, stop: tuple[str, ...] | list[str] = DEFAULT_STOP
    ) -> None:
        if rel_tol < 0 or abs_tol < 0:
            raise InvalidValueError(
                f"reward 'last_number': tolerances must be >= 0, got rel_tol={rel_tol}, abs_tol={abs_tol}"
            )
        self.rel_tol, self.abs_tol, self.stop = Fraction(rel_tol), Fraction(abs_tol), tuple(stop)

    def __call__(self, completion: str, example: Example) -> float:
        gold = parse_number(example.answer)
        if gold is None:
            raise InvalidValueError(f"example {example.id!r}: gold answer {example.answer!r} is not a number")
        got = last_number(cut_at_stop(completion, self.stop))
        if got is None:
            return 0.0
        return 1.0 if abs(got - gold) <= max(self.abs_tol, self.rel_tol * abs(gold)) else 0.0
