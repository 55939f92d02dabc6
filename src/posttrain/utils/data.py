"""Data helpers shared by the trainers: epoch-wise shuffling with exact resume, and a JSONL reader whose
errors name the file and line.

Epoch shuffling
---------------
:class:`EpochShuffler` yields an endless stream of indices ``0..n-1``, one shuffled permutation per
epoch. Its state is ``{"epoch": e, "pos": p}`` (JSON), and the permutation of epoch e is a pure function
of (n, seed, e), so a resumed run draws exactly the indices it would have drawn. Two orders exist:

``"seeded"`` (the RL prompt sampler, :class:`posttrain.hooks.UniformSampler`)
    epoch e is ``random.Random(seed + e).shuffle(list(range(n)))``, read front to back.

``"stream"`` (SFT)
    one ``random.Random(seed)`` shuffles a fresh ``list(range(n))`` at the start of every epoch and
    the result is read back to front (the order SFT has always used; kept so existing SFT runs and
    ``posttrain demo`` reproduce bitwise). Restoring epoch e replays e shuffles, O(e · n).

In both, an epoch starts lazily: after the last index of epoch e the state is (e, n) until the next
index is drawn.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError, PosttrainError


# ------------------------------------------------------------------------------------- shuffling
class _Seeded:
    """Epoch e: ``random.Random(seed + e)`` shuffles ``range(n)``; read front to back."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def permutation(self, epoch: int) -> list[int]:
        order = list(range(self.n))
        random.Random(self.seed + epoch).shuffle(order)
        return order


class _Stream:
    """One ``random.Random(seed)`` shuffles a fresh ``range(n)`` per epoch; read back to front."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed
        self._rng = random.Random(seed)
        self._next_epoch = 0  # the epoch the next shuffle of self._rng produces

    def permutation(self, epoch: int) -> list[int]:
        if epoch < self._next_epoch:  # going back (a restore): replay from the start
            self._rng, self._next_epoch = random.Random(self.seed), 0
        while True:
            order = list(range(self.n))
            self._rng.shuffle(order)
            self._next_epoch += 1
            if self._next_epoch > epoch:
                return order[::-1]


SHUFFLE_ORDERS: dict[str, Callable[[int, int], Any]] = {"seeded": _Seeded, "stream": _Stream}


class EpochShuffler:
    """Endless epoch-wise shuffled stream of the indices ``0..n-1`` (see the module docstring).

    ``next_index()`` draws one index, ``take(k)`` k of them (crossing epochs as needed);
    ``state_dict()`` / ``load_state_dict()`` save and restore the position exactly."""

    def __init__(self, n: int, *, seed: int = 0, order: str = "seeded") -> None:
        if n < 1:
            raise InvalidValueError(f"EpochShuffler: need at least one item, got n={n}")
        if order not in SHUFFLE_ORDERS:
            raise InvalidValueError(
                f"EpochShuffler: unknown order {order!r}; accepted: {', '.join(SHUFFLE_ORDERS)}"
            )
        self.n, self.seed, self.order = n, seed, order
        self._perm = SHUFFLE_ORDERS[order](n, seed)
        self.epoch = 0
        self.pos = 0
        self._current = self._perm.permutation(0)

    def next_index(self) -> int:
        if self.pos >= self.n:
            self.epoch += 1
            self.pos = 0
            self._current = self._perm.permutation(self.epoch)
        i = self._current[self.pos]
        self.pos += 1
        return i

    def take(self, k: int) -> list[int]:
        return [self.next_index() for _ in range(k)]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        epoch, pos = int(state["epoch"]), int(state["pos"])
        if epoch < 0 or not 0 <= pos <= self.n:
            raise InvalidValueError(f"EpochShuffler: invalid state epoch={epoch}, pos={pos} for n={self.n}")
        self.epoch, self.pos = epoch, pos
        self._current = self._perm.permutation(epoch)


# ------------------------------------------------------------------------------------ JSONL rows
class DataFileError(PosttrainError, ValueError):
    """A data file that cannot be read as expected; the message names the file and line."""


def jsonl_lines(path: str | Path) -> Iterator[tuple[int, Any, str | None]]:
    """``(line number, parsed value, None)`` for every non-blank line of a JSONL file, or ``(line
    number, None, problem)`` for a line that cannot be read: bytes that are not UTF-8 (the offending
    byte and where) or invalid JSON (what and the column on that line). The one line reader of the SFT
    data (:func:`iter_jsonl`) and the dataset task (``tasks.jsonl``). A UTF-8 byte-order mark at the
    start of the file is accepted; the line's own end (``\\n``, ``\\r\\n``) is not part of the JSON, so a
    line cut short is reported at its column, not at column 1 of a next line."""
    with open(path, "rb") as f:
        for i, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if i == 1 else "utf-8")
            except UnicodeDecodeError as e:
                bad = raw[e.start : e.start + 1].hex()
                yield (
                    i,
                    None,
                    f"not valid UTF-8 (byte 0x{bad} at byte {e.start + 1} of the line); save the file as UTF-8",
                )
                continue
            if not line.strip():
                continue
            try:
                yield i, json.loads(line.rstrip("\r\n")), None
            except json.JSONDecodeError as e:
                yield i, None, f"invalid JSON ({e.msg} at column {e.colno})"


def iter_jsonl(path: str | Path, *, what: str = "JSON objects") -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of a JSONL file (read by :func:`jsonl_lines`).

    Errors (:class:`DataFileError`) name the file and line: missing file, a directory, bytes that are
    not UTF-8 (with the offending byte and column), invalid JSON, a value that is not an object.
    ``what`` describes the expected rows in the messages."""
    path = Path(path)
    if not path.exists():
        raise DataFileError(f"{path}: file not found (expected a JSONL file of {what})")
    if not path.is_file():
        raise DataFileError(f"{path}: is a directory, not a file (expected a JSONL file of {what})")
    for i, row, problem in jsonl_lines(path):
        if problem is not None:
            raise DataFileError(f"{path}: line {i}: {problem}")
        if not isinstance(row, dict):
            raise DataFileError(
                f"{path}: line {i}: expected a JSON object ({what}), got {type(row).__name__}"
            )
        yield i, row
