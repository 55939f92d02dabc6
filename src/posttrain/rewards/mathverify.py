"""`math_verify` reward: symbolic answer checking with HuggingFace's `math-verify` library.

`parse()` extracts the last `\\boxed{}` / LaTeX / plain expression from the completion and turns it
into SymPy; `verify(gold, pred)` compares numerically and symbolically (so `\\boxed{\\frac{1}{2}}`
matches `0.5`, `\\frac{2}{4}`, and `x^2+1` matches `1+x^2`). Source: github.com/huggingface/Math-Verify.

Timeouts: math-verify bounds each parse / comparison with `signal.alarm` (whole seconds), which only
works in a process's main thread. `RewardPool` workers score in their main thread, so the library's
timeouts are active there (defaults 2 s each, below the pool's 5 s per-item limit, so a slow
expression returns 0 instead of costing a worker restart). Called from any other thread (e.g.
`RewardPool(num_workers=0)` inside a dispatcher thread), the library timeouts are switched off and
only the pool's kill-based timeout (if any) applies.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from posttrain.rewards.base import DEFAULT_STOP, cut_at_stop, register_reward
from posttrain.tasks.base import Example
from posttrain.utils.errors import InvalidValueError


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@functools.lru_cache(maxsize=4096)
def _parse_gold(text: str, timeout: int | None) -> Any:
    from math_verify import parse

    return parse(text, parsing_timeout=timeout)


def gold_text(answer: str) -> str:
    """Gold answers are LaTeX without delimiters in most datasets (`\\frac{1}{2}`); wrap them in `$`
    so math-verify's LaTeX extractor sees them. Text that already has `$` or `\\boxed` is kept."""
    a = answer.strip()
    if "$" in a or "\\boxed" in a or "\\(" in a or "\\[" in a:
        return a
    return f"${a}$"


@register_reward("math_verify", aliases=("math",))
class MathVerifyReward:
    """1.0 if math-verify judges the completion's final answer equal to `example.answer`, else 0.0.

    Params: `parsing_timeout` / `verify_timeout` (whole seconds, math-verify's own signal-based
    limits; 0 disables), `float_rounding`, `numeric_precision`, `strict` (passed to `verify`).
    A gold answer math-verify cannot parse raises ValueError (counted as an error by the pool).
    """

    name = "math_verify"

    def __init__(
        self,
        parsing_timeout: int = 2,
        verify_timeout: int = 2,
        float_rounding: int = 6,
        numeric_precision: int = 15,
        strict: bool = True,
        stop: tuple[str, ...] | list[str] = DEFAULT_STOP,
    ) -> None:
        for key, val in (("parsing_timeout", parsing_timeout), ("verify_timeout", verify_timeout)):
            if not isinstance(val, int) or val < 0:
                raise InvalidValueError(
                    f"reward 'math_verify': {key} must be a whole number of seconds >= 0, got {val!r}"
                )
        self.parsing_timeout, self.verify_timeout = parsing_timeout, verify_timeout
        self.float_rounding, self.numeric_precision, self.strict = float_rounding, numeric_precision, strict
        self.stop = tuple(stop)

    def setup(self) -> None:
        """Import math-verify (and SymPy) and run one comparison, so a worker's first item is fast."""
        self(r"The answer is $\boxed{\frac{1}{2}}$", Example(id="warmup", prompt="", answer="0.5"))

    def __call__(self, completion: str, example: Example) -> float:
        from math_verify import parse, verify

        main = _in_main_thread()
        pt = (self.parsing_timeout or None) if main else None
        vt = (self.verify_timeout or None) if main else None
        gold = _parse_gold(gold_text(example.answer), pt)
        if not gold:
            raise InvalidValueError(
                f"example {example.id!r}: math-verify cannot parse gold answer {example.answer!r}"
            )
        pred = parse(cut_at_stop(completion, self.stop), parsing_timeout=pt)
        if not pred:
            return 0.0
        ok = verify(
            gold,
            pred,
            float_rounding=self.float_rounding,
            numeric_precision=self.numeric_precision,
            strict=self.strict,
            timeout_seconds=vt,
        )
        return 1.0 if ok else 0.0
