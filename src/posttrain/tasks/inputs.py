"""What a trainer's ``task=`` accepts besides a :class:`~posttrain.tasks.Task` (TRL-style inputs).

:func:`as_task` turns

* a list of :class:`~posttrain.tasks.Example` into an :class:`ExamplesTask`;
* a list of row dicts, a ``datasets.Dataset`` or a ``datasets.DatasetDict`` (``train`` plus
  ``test`` / ``validation`` as the held-out split) into a :class:`~posttrain.tasks.jsonl.RowsTask`:
  the ``jsonl`` task's column mapping, with TRL's column names found by themselves (prompt column
  ``prompt`` when there is no ``question``; answer column the first of ``answer``, ``solution``,
  ``ground_truth``, ``target``);

and refuses anything else in one line naming what is accepted. Without a held-out split, a seeded
10 % of the prompts is held out (``heldout_fraction``), as the ``jsonl`` task does.
"""

from __future__ import annotations

import random
from typing import Any

from posttrain.tasks.base import Example, Task
from posttrain.utils.errors import InvalidTypeError, InvalidValueError

ACCEPTED = (
    "a posttrain.tasks.Task, a list of posttrain.Example, a list of row dicts, or a datasets.Dataset / "
    "DatasetDict"
)
PROMPT_COLUMNS = ("question", "prompt")
ANSWER_COLUMNS = ("answer", "solution", "ground_truth", "target")


class ExamplesTask(Task):
    """A list of :class:`Example` as a task: ``heldout`` as the held-out split, else a seeded
    ``heldout_fraction`` of the prompts (whole groups of equal prompts, so none is in both)."""

    name = "examples"

    def __init__(
        self,
        examples: list[Example],
        heldout: list[Example] | None = None,
        *,
        heldout_fraction: float = 0.1,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if not 0.0 <= heldout_fraction < 1.0:
            raise InvalidValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction!r}")
        self.examples, self.heldout, self.heldout_fraction, self.seed = (
            list(examples),
            heldout,
            heldout_fraction,
            seed,
        )

    def params(self) -> dict[str, Any]:
        return {"n": len(self.examples), "heldout_fraction": self.heldout_fraction, "seed": self.seed}

    def _build_splits(self) -> dict[str, list[Example]]:
        if self.heldout is not None:
            return {"train": list(self.examples), "heldout": list(self.heldout)}
        prompts = list(dict.fromkeys(e.prompt for e in self.examples))
        random.Random(f"examples:{self.seed}").shuffle(prompts)
        held = set(prompts[: round(self.heldout_fraction * len(prompts))])
        return {
            "train": [e for e in self.examples if e.prompt not in held],
            "heldout": [e for e in self.examples if e.prompt in held],
        }


def _dataset_rows(obj: Any, where: str) -> tuple[list[Any], list[Any] | None] | None:
    """(train rows, held-out rows or None) of a ``datasets`` object, None when it is not one."""
    kind = type(obj).__name__
    if not type(obj).__module__.startswith("datasets"):
        return None
    if kind == "DatasetDict":
        if "train" not in obj:
            raise InvalidValueError(
                f"{where}: a DatasetDict without a 'train' split (it has {', '.join(obj)}); pass "
                "dataset_dict['<split>'] as the task"
            )
        held = next((obj[s] for s in ("test", "validation", "heldout") if s in obj), None)
        return obj["train"].to_list(), held.to_list() if held is not None else None
    if hasattr(obj, "to_list"):
        return obj.to_list(), None
    return None


def _columns(rows: list[Any], where: str) -> dict[str, str]:
    """The prompt and answer columns of TRL-style rows (the ``jsonl`` task's names win)."""
    first = rows[0]
    prompt = next((c for c in PROMPT_COLUMNS if c in first), None)
    answer = next((c for c in ANSWER_COLUMNS if c in first), None)
    if prompt is None or answer is None:
        missing = "prompt" if prompt is None else "answer"
        raise InvalidValueError(
            f"{where}: the rows have no {missing} column (columns: {', '.join(map(str, first)) or 'none'}); "
            f"expected a prompt column ({' or '.join(PROMPT_COLUMNS)}) and an answer column "
            f"({', '.join(ANSWER_COLUMNS)}); for other names pass "
            "posttrain.tasks.RowsTask(rows, prompt_field=..., answer_field=...)"
        )
    return {"prompt_field": prompt, "answer_field": answer}


def as_task(obj: Any, *, where: str = "task") -> Task:
    """``obj`` as a task (module docstring); anything else raises naming what is accepted."""
    from posttrain.tasks.jsonl import RowsTask

    if isinstance(obj, Task):
        return obj
    data = _dataset_rows(obj, where)
    if data is not None:
        rows, held = data
        if not rows:
            raise InvalidValueError(f"{where}: the dataset has no rows")
        return RowsTask(rows, held, label="dataset", **_columns(rows, where))
    if isinstance(obj, list | tuple):
        items = list(obj)
        if not items:
            raise InvalidValueError(f"{where}: an empty list; expected {ACCEPTED}")
        if all(isinstance(x, Example) for x in items):
            return ExamplesTask(items)
        if all(isinstance(x, dict) for x in items):
            return RowsTask(items, label="rows", **_columns(items, where))
        bad = next(i for i, x in enumerate(items) if not isinstance(x, type(items[0])))
        raise InvalidTypeError(
            f"{where}: item {bad} is {type(items[bad]).__name__} where item 0 is "
            f"{type(items[0]).__name__}; expected a list of posttrain.Example or a list of row dicts"
        )
    if callable(getattr(obj, "split", None)):  # a task-like object (duck-typed, as before)
        return obj
    raise InvalidTypeError(f"{where}: expected {ACCEPTED}; got {type(obj).__name__}")
