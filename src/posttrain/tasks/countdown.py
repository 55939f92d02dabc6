"""`countdown`: reach a target number with the given numbers and + - * / (each number at most once).

The Countdown number game as an RL task follows TinyZero (Jiayi Pan et al., 2025,
github.com/Jiayi-Pan/TinyZero: 3–4 numbers, targets up to 100, 1.0 for a correct equation and an
optional 0.1 format score); the generator and parser here are this project's own.

Instances are generated solvable by construction: the numbers are combined pairwise in a random
order with random operators, keeping every intermediate value a positive integer, and the result
becomes the target when it lies in `[min_target, max_target]`. The construction is the reference
solution. Instances are unique by (sorted numbers, target); heldout is drawn first, then train, so
the splits are disjoint.

The verifier (`parse_expression`) is a small recursive-descent parser over integers, `+ - * /` and
parentheses only, evaluated with exact rationals (`fractions.Fraction`). It never calls
`eval`/`exec`/`ast`; any other character (names, calls, attributes, `**`, `__import__`, ...) is a
parse error. Unary minus is not part of the game and is rejected.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from fractions import Fraction
from typing import Any, Literal

from posttrain.tasks.base import DEFAULT_MARKER, Example, Task, check_split_sizes, register_task
from posttrain.utils.errors import InvalidValueError, PosttrainError

MAX_EXPRESSION_CHARS = 300
MAX_NESTING = 32
_TOKEN = re.compile(r"\s*(?:(\d+)|(\S))")


class ExpressionError(PosttrainError, ValueError):
    """The text is not an arithmetic expression over integers, + - * / and parentheses."""


def _tokenize(text: str) -> list[int | str]:
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens: list[int | str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:  # only trailing whitespace would fail to match, and it was stripped
            break
        num, ch = m.groups()
        if num is not None:
            if len(num) > 1 and num[0] == "0":
                raise ExpressionError(f"number with a leading zero: {num!r}")
            tokens.append(int(num))
        elif ch in "+-*/()":
            tokens.append(ch)
        else:
            raise ExpressionError(f"unexpected character {ch!r} at position {m.start(2)}")
        pos = m.end()
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := factor (('*'|'/') factor)* ; factor := INT | '(' expr ')'"""

    def __init__(self, tokens: list[int | str]) -> None:
        self.tokens, self.i, self.used, self.depth = tokens, 0, [], 0

    def peek(self) -> int | str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> int | str | None:
        tok = self.peek()
        self.i += 1
        return tok

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            rhs = self.factor()
            if op == "*":
                value = value * rhs
            else:
                if rhs == 0:
                    raise ExpressionError("division by zero")
                value = value / rhs
        return value

    def factor(self) -> Fraction:
        tok = self.take()
        if isinstance(tok, int):
            self.used.append(tok)
            return Fraction(tok)
        if tok == "(":
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise ExpressionError(f"parentheses nested deeper than {MAX_NESTING}")
            value = self.expr()
            if self.take() != ")":
                raise ExpressionError("missing ')'")
            self.depth -= 1
            return value
        if tok is None:
            raise ExpressionError("expression ended early")
        raise ExpressionError(f"unexpected {tok!r} (expected a number or '(')")


def parse_expression(text: str) -> tuple[Fraction, list[int]]:
    """Evaluate `text` exactly; returns `(value, numbers used in order)`. Raises ExpressionError."""
    tokens = _tokenize(text)
    if not tokens:
        raise ExpressionError("empty expression")
    p = _Parser(tokens)
    value = p.expr()
    if p.i != len(tokens):
        raise ExpressionError(f"unexpected {tokens[p.i]!r} after a complete expression")
    return value, p.used


def uses_numbers(used: list[int], numbers: list[int]) -> bool:
    """True if `used` is a sub-multiset of `numbers` (each given number used at most once)."""
    return not (Counter(used) - Counter(numbers))


@register_task("countdown")
class CountdownTask(Task):
    """Countdown number game; default reward `countdown`. See the module docstring."""

    name = "countdown"
    default_reward = "countdown"

    def __init__(
        self,
        n_numbers: int = 4,
        max_number: int = 20,
        min_target: int = 1,
        max_target: int = 100,
        n_train: int = 2000,
        n_heldout: int = 200,
        seed: int = 0,
        prompt_style: Literal["instruct", "compact"] = "instruct",
    ) -> None:
        super().__init__()
        if not 2 <= n_numbers <= 8:
            raise InvalidValueError(f"task 'countdown': n_numbers must be in [2, 8], got {n_numbers!r}")
        if max_number < 2:
            raise InvalidValueError(f"task 'countdown': max_number must be >= 2, got {max_number!r}")
        if not 1 <= min_target <= max_target:
            raise InvalidValueError(
                f"task 'countdown': need 1 <= min_target <= max_target, got {min_target}, {max_target}"
            )
        if prompt_style not in ("instruct", "compact"):
            raise InvalidValueError(
                f"task 'countdown': prompt_style must be instruct or compact, got {prompt_style!r}"
            )
        check_split_sizes("countdown", n_train=n_train, n_heldout=n_heldout)
        self.n_numbers, self.max_number = n_numbers, max_number
        self.min_target, self.max_target = min_target, max_target
        self.n_train, self.n_heldout, self.seed, self.prompt_style = n_train, n_heldout, seed, prompt_style

    def params(self) -> dict[str, Any]:
        return {
            "n_numbers": self.n_numbers,
            "max_number": self.max_number,
            "min_target": self.min_target,
            "max_target": self.max_target,
            "n_train": self.n_train,
            "n_heldout": self.n_heldout,
            "seed": self.seed,
            "prompt_style": self.prompt_style,
        }

    def _combine(self, rng: random.Random, numbers: list[int]) -> tuple[int, str, list[str]] | None:
        """Combine all numbers pairwise with random ops keeping positive-integer intermediates."""
        pool: list[tuple[int, str, bool]] = [(n, str(n), True) for n in numbers]  # value, text, atomic
        steps: list[str] = []
        while len(pool) > 1:
            i, j = rng.sample(range(len(pool)), 2)
            (a, ta, atom_a), (b, tb, atom_b) = pool[i], pool[j]
            ops = ["+", "*"]
            if a > b:
                ops.append("-")
            if b > 1 and a % b == 0:
                ops.append("/")
            op = rng.choice(ops)
            v = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
            sa = ta if atom_a else f"({ta})"
            sb = tb if atom_b else f"({tb})"
            steps.append(f"{a}{op}{b}={v}")
            pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [(v, f"{sa}{op}{sb}", False)]
        value, text, _ = pool[0]
        if not self.min_target <= value <= self.max_target:
            return None
        return value, text, steps

    def _build_splits(self) -> dict[str, list[Example]]:
        rng = random.Random(f"countdown:{self.seed}")
        need = self.n_heldout + self.n_train
        seen: set[tuple[tuple[int, ...], int]] = set()
        made: list[Example] = []
        attempts, max_attempts = 0, 200 * need + 10_000
        while len(made) < need:
            attempts += 1
            if attempts > max_attempts:
                raise InvalidValueError(
                    f"task 'countdown': could only generate {len(made)} distinct solvable instances "
                    f"of {need} requested with {self.params()}; widen max_number or the target range"
                )
            numbers = [rng.randint(1, self.max_number) for _ in range(self.n_numbers)]
            out = self._combine(rng, numbers)
            if out is None:
                continue
            target, solution, steps = out
            key = (tuple(sorted(numbers)), target)
            if key in seen:
                continue
            seen.add(key)
            split = "heldout" if len(made) < self.n_heldout else "train"
            idx = len(made) if split == "heldout" else len(made) - self.n_heldout
            made.append(self._example(f"countdown-{split}-{idx}", numbers, target, solution, steps))
        return {"heldout": made[: self.n_heldout], "train": made[self.n_heldout :]}

    def _example(self, id: str, numbers: list[int], target: int, solution: str, steps: list[str]) -> Example:
        if self.prompt_style == "compact":
            prompt = f"numbers: {' '.join(map(str, numbers))} target: {target}\n"
        else:
            prompt = (
                f"Using the numbers {numbers}, write an arithmetic expression that equals {target}. "
                "You may use + - * / and parentheses, and each number at most once. "
                f"Write the final expression after '{DEFAULT_MARKER} '.\n"
            )
        meta = {
            "numbers": list(numbers),
            "target": target,
            "answer_marker": DEFAULT_MARKER,
            "steps": steps,
        }
        return Example(id=id, prompt=prompt, answer=solution, meta=meta)

    def reference_completion(self, example: Example, style: Literal["short", "long"] = "short") -> str:
        """`short`: `#### <expression>`; `long`: one line per intermediate step, then the expression."""
        if style not in ("short", "long"):
            raise InvalidValueError(f"style must be 'short' or 'long', got {style!r}")
        lines = list(example.meta.get("steps", [])) if style == "long" else []
        return "\n".join([*lines, f"{DEFAULT_MARKER} {example.answer}"])
