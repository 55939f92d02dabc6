"""`word_problems`: natural-language arithmetic word problems in chat form, numeric answer.

Each problem is a short story with ``steps`` operations (1-3) on small quantities: a start amount,
then gains (``+``), losses (``-``), or groups (``x``), e.g. "Maya has 14 stickers. She buys 6 more,
then gives 5 to a friend. How many stickers does Maya have now? Answer with only the number." The gold
answer is the integer result (never negative); ``meta["expression"]`` is the arithmetic that gives it
(e.g. ``(3510 - 1066) * 2``, for tool-use warm starts). Default reward ``last_number`` (the last number
anywhere in the completion: chat models reason before they answer whatever the prompt asks; ``numeric``,
which reads the first line, scored 1.7 % on 2-step problems). Held-out is drawn first; the splits
never share a problem text. A chat task (``chat = True``): meant for instruction-tuned models.

Difficulty: ``steps`` and ``max_value`` (the largest start amount). Measured on SmolLM2-135M-Instruct
(greedy, chat template, ``last_number``, bf16, 100 held-out problems, seed 0): ``steps=1, max_value=10``
(the defaults) 38 % (SE 4.9) at 128 new tokens; ``steps=1, max_value=20`` 10 % at 64 and 11 % at 128
tokens; ``steps=2, max_value=10`` 6 % at 128 tokens; see docs/real-model.md.
"""

from __future__ import annotations

import random
from typing import Any

from posttrain.tasks.base import Example, Task, check_split_sizes, register_task
from posttrain.utils.errors import InvalidValueError

NAMES = (
    ("Maya", "She"),
    ("Liam", "He"),
    ("Sofia", "She"),
    ("Noah", "He"),
    ("Ava", "She"),
    ("Ethan", "He"),
    ("Zoe", "She"),
    ("Omar", "He"),
    ("Priya", "She"),
    ("Jonas", "He"),
)
ITEMS = ("apples", "stickers", "marbles", "books", "pencils", "cookies", "stamps", "shells", "coins", "cards")
_GAIN = ("buys {n} more", "finds {n} more", "is given {n} more")
_LOSS = ("gives {n} to a friend", "loses {n}", "uses {n}")


@register_task("word_problems")
class WordProblemsTask(Task):
    """Chat-form arithmetic word problems. See the module docstring."""

    name = "word_problems"
    default_reward = "last_number"
    chat = True

    def __init__(
        self, steps: int = 1, max_value: int = 10, n_train: int = 2000, n_heldout: int = 200, seed: int = 0
    ) -> None:
        super().__init__()
        if steps not in (1, 2, 3):
            raise InvalidValueError(f"task 'word_problems': steps must be 1, 2 or 3, got {steps!r}")
        if not isinstance(max_value, int) or isinstance(max_value, bool) or not 5 <= max_value <= 10_000:
            raise InvalidValueError(
                f"task 'word_problems': max_value must be an integer in [5, 10000], got {max_value!r}"
            )
        check_split_sizes("word_problems", n_train=n_train, n_heldout=n_heldout)
        self.steps, self.max_value, self.n_train, self.n_heldout, self.seed = (
            steps,
            max_value,
            n_train,
            n_heldout,
            seed,
        )

    def params(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "max_value": self.max_value,
            "n_train": self.n_train,
            "n_heldout": self.n_heldout,
            "seed": self.seed,
        }

    def _problem(self, rng: random.Random) -> tuple[str, int, str]:
        name, pron = rng.choice(NAMES)
        item = rng.choice(ITEMS)
        total = rng.randint(3, self.max_value)
        parts = [f"{name} has {total} {item}."]
        actions = []
        expr = str(total)
        for _ in range(self.steps):
            kind = rng.choice(("gain", "loss", "groups") if total <= self.max_value else ("gain", "loss"))
            if kind == "loss" and total >= 2:
                n = rng.randint(1, total - 1)
                actions.append(rng.choice(_LOSS).format(n=n))
                total -= n
                expr = f"{expr} - {n}"
            elif kind == "groups":
                n = rng.randint(2, 4)
                actions.append(
                    f"{'doubles' if n == 2 else f'ends up with {n} times as many as'} {'them' if n == 2 else 'before'}"
                )
                total *= n
                expr = f"({expr}) * {n}" if " " in expr else f"{expr} * {n}"
            else:
                n = rng.randint(1, self.max_value)
                actions.append(rng.choice(_GAIN).format(n=n))
                total += n
                expr = f"{expr} + {n}"
        parts.append(f"{pron} " + ", then ".join(actions) + ".")
        parts.append(f"How many {item} does {name} have now? Answer with only the number.")
        return " ".join(parts), total, expr

    def _build_splits(self) -> dict[str, list[Example]]:
        rng = random.Random(f"word_problems:{self.seed}")
        seen: set[str] = set()
        out: dict[str, list[Example]] = {"heldout": [], "train": []}
        budget = 50 * (self.n_train + self.n_heldout) + 1000
        for split, n in (("heldout", self.n_heldout), ("train", self.n_train)):
            while len(out[split]) < n:
                budget -= 1
                if budget < 0:
                    raise InvalidValueError(
                        f"task 'word_problems': could not draw {n} distinct {split} problems; raise max_value "
                        "or lower n_train/n_heldout"
                    )
                text, answer, expr = self._problem(rng)
                if text in seen:
                    continue
                seen.add(text)
                j = len(out[split])
                out[split].append(
                    Example(
                        id=f"word_problems-{split}-{j}",
                        prompt=text,
                        answer=str(answer),
                        meta={"expression": expr},
                    )
                )
        return out

    def reference_completion(self, example: Example, style: str = "short") -> str:
        return example.answer
