"""`arithmetic`: multi-digit integer arithmetic (`12+34=` -> `46`), plain or with a scratchpad.

Question space: every `a <op> b` with `0 <= a, b < 10**digits` and `op` in `ops` (`+`, `-`, `*`);
results of `-` may be negative. The two splits are drawn without replacement from that space with
`random.Random(seed)`: heldout first, then train, so they are disjoint and the heldout split does
not change when `n_train` changes.

Formats:

- `plain`: prompt `"12+34="`, completion/answer `"46"` (the reward reads the first line).
- `scratchpad`: prompt `"12+34=?\\n"`; the completion reasons, then gives the final answer after the
  marker `"#### "`. `reference_completion(ex, "long")` works digit by digit with carries/borrows
  (or partial products for `*`); `"short"` states the result in one line. Both end in
  `"#### <answer>"`, so a length-regulation method can reward the shorter correct reasoning.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from posttrain.tasks.base import DEFAULT_MARKER, Example, Task, check_split_sizes, register_task
from posttrain.utils.errors import InvalidValueError

_OPS = ("+", "-", "*")
_FORMATS = ("plain", "scratchpad")
_PERMUTE_LIMIT = 2_000_000  # question spaces up to this size are shuffled; larger ones sampled


def _apply(op: str, a: int, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    return a * b


def _digits_rev(x: int, width: int) -> list[int]:
    """Digits of x, least significant first, zero-padded to `width`."""
    return [(x // 10**i) % 10 for i in range(width)]


def long_addition(a: int, b: int) -> list[str]:
    """Column-wise addition with carries: one line `da+db+carry=s write d carry c` per column."""
    width = max(len(str(a)), len(str(b)))
    lines, carry = [], 0
    for da, db in zip(_digits_rev(a, width), _digits_rev(b, width), strict=True):
        s = da + db + carry
        lines.append(f"{da}+{db}+{carry}={s} write {s % 10} carry {s // 10}")
        carry = s // 10
    if carry:
        lines.append(f"write {carry}")
    return lines


def long_subtraction(a: int, b: int) -> list[str]:
    """Column-wise subtraction with borrows; `a < b` is rewritten as `-(b - a)` first."""
    lines = []
    if a < b:
        lines.append(f"{a}<{b} so {a}-{b}=-({b}-{a})")
        a, b = b, a
    width = len(str(a))
    borrow = 0
    for da, db in zip(_digits_rev(a, width), _digits_rev(b, width), strict=True):
        raw = da - db - borrow
        d, out = (raw + 10, 1) if raw < 0 else (raw, 0)
        lines.append(f"{da}-{db}-{borrow}={raw} write {d} borrow {out}")
        borrow = out
    return lines


def long_multiplication(a: int, b: int) -> list[str]:
    """Partial products `a*d0..0` for each digit of b, then their sum."""
    parts, lines = [], []
    for k, db in enumerate(_digits_rev(b, len(str(b)))):
        p = a * db * 10**k
        parts.append(p)
        lines.append(f"{a}*{db}{'0' * k}={p}")
    lines.append(f"{'+'.join(map(str, parts))}={sum(parts)}")
    return lines


@register_task("arithmetic")
class ArithmeticTask(Task):
    """Integer arithmetic with exact-match reward. See the module docstring for the formats."""

    name = "arithmetic"
    default_reward = "exact_match"

    def __init__(
        self,
        digits: int = 2,
        ops: str | list[str] | tuple[str, ...] = "+",
        n_train: int = 2000,
        n_heldout: int = 200,
        seed: int = 0,
        format: Literal["plain", "scratchpad"] = "plain",
    ) -> None:
        super().__init__()
        if not isinstance(digits, int) or isinstance(digits, bool) or not 1 <= digits <= 18:
            raise InvalidValueError(
                f"task 'arithmetic': digits must be an integer in [1, 18], got {digits!r}"
            )
        ops_t = tuple(ops) if not isinstance(ops, str) else tuple(ops.replace(",", "").replace(" ", ""))
        bad = [o for o in ops_t if o not in _OPS]
        if not ops_t or bad:
            raise InvalidValueError(
                f"task 'arithmetic': ops must be a non-empty subset of {''.join(_OPS)!r}, got {ops!r}"
            )
        self.ops = tuple(dict.fromkeys(ops_t))  # dedupe, keep order
        if format not in _FORMATS:
            raise InvalidValueError(
                f"task 'arithmetic': format must be one of {', '.join(_FORMATS)}, got {format!r}"
            )
        check_split_sizes("arithmetic", n_train=n_train, n_heldout=n_heldout)
        self.digits, self.n_train, self.n_heldout, self.seed, self.format = (
            digits,
            n_train,
            n_heldout,
            seed,
            format,
        )
        self.space = len(self.ops) * (10**digits) ** 2
        if n_train + n_heldout > self.space:
            raise InvalidValueError(
                f"task 'arithmetic': n_train + n_heldout = {n_train + n_heldout} exceeds the "
                f"{self.space} distinct questions with digits={digits}, ops={''.join(self.ops)!r}"
            )

    def params(self) -> dict[str, Any]:
        return {
            "digits": self.digits,
            "ops": "".join(self.ops),
            "n_train": self.n_train,
            "n_heldout": self.n_heldout,
            "seed": self.seed,
            "format": self.format,
        }

    # -- generation ---------------------------------------------------------------------------
    def _indices(self) -> list[int]:
        """`n_heldout + n_train` distinct question indices; heldout first."""
        rng = random.Random(f"arithmetic:{self.seed}")
        k = self.n_heldout + self.n_train
        if self.space <= _PERMUTE_LIMIT:
            perm = list(range(self.space))
            rng.shuffle(perm)
            return perm[:k]
        seen: set[int] = set()
        out: list[int] = []
        while len(out) < k:  # space > 2e6 >> k in practice, so rejections are rare
            i = rng.randrange(self.space)
            if i not in seen:
                seen.add(i)
                out.append(i)
        return out

    def _decode(self, index: int) -> tuple[str, int, int]:
        m = 10**self.digits
        op_i, rest = divmod(index, m * m)
        a, b = divmod(rest, m)
        return self.ops[op_i], a, b

    def make_example(self, a: int, op: str, b: int, id: str) -> Example:
        """The `Example` for `a op b` in this task's format."""
        result = _apply(op, a, b)
        q = f"{a}{op}{b}"
        meta: dict[str, Any] = {"a": a, "b": b, "op": op}
        if self.format == "plain":
            prompt = f"{q}="
        else:
            prompt = f"{q}=?\n"
            meta["answer_marker"] = DEFAULT_MARKER
        return Example(id=id, prompt=prompt, answer=str(result), meta=meta)

    def _build_splits(self) -> dict[str, list[Example]]:
        idx = self._indices()
        out: dict[str, list[Example]] = {}
        for split, chunk in (("heldout", idx[: self.n_heldout]), ("train", idx[self.n_heldout :])):
            exs = []
            for j, i in enumerate(chunk):
                op, a, b = self._decode(i)
                exs.append(self.make_example(a, op, b, id=f"arithmetic-{split}-{j}"))
            out[split] = exs
        return out

    # -- references ---------------------------------------------------------------------------
    def reference_completion(self, example: Example, style: Literal["short", "long"] = "short") -> str:
        """Plain: the answer. Scratchpad: reasoning lines then `#### <answer>`; `long` is digit by
        digit (carries / borrows / partial products), `short` is one line `a+b=c`."""
        if style not in ("short", "long"):
            raise InvalidValueError(f"style must be 'short' or 'long', got {style!r}")
        if self.format == "plain":
            return example.answer
        a, b, op = example.meta["a"], example.meta["b"], example.meta["op"]
        ans = example.answer
        if style == "short":
            lines = [f"{a}{op}{b}={ans}"]
        elif op == "+":
            lines = long_addition(a, b)
        elif op == "-":
            lines = long_subtraction(a, b)
        else:
            lines = long_multiplication(a, b)
        return "\n".join([*lines, f"{DEFAULT_MARKER} {ans}"])
