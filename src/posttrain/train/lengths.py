"""Length bounds checked when data loads, before any step: a sequence longer than the model's context
either fails later in an allocation (a 60 MB SFT row asked for 61 GB) or trains on positions the
model never had; a long RL prompt leaves no room to generate.

* SFT (``max_length``, default the model's context; ``overlong``): a row whose prompt + completion
  (or text, or conversation) is longer is an error naming its file and line, unless
  ``overlong=truncate`` (keep the first ``max_length`` tokens) or ``overlong=skip``; both are counted
  and reported.
* RL (``rollout.overlong_prompts``): a task prompt longer than the context minus
  ``rollout.max_new_tokens`` is an error naming the split and row, unless ``skip`` (counted).

Rows far beyond the bound are caught before they are tokenized: no tokenizer puts more than
:data:`MAX_CHARS_PER_TOKEN` characters in one token on average, so a row of more characters than
that times the bound is too long whatever it encodes to (tokenizing 60 MB took 109 s and 17 GB).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.utils.errors import InvalidValueError, PosttrainError

MAX_CHARS_PER_TOKEN = 64

_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


class LengthError(PosttrainError, ValueError):
    """A row longer than the model's context (the message names where and what to do)."""


@dataclass
class LengthReport:
    truncated: int = 0
    skipped: int = 0

    def note(self, what: str, limit: int) -> str | None:
        parts = [f"{n} {verb}" for n, verb in ((self.truncated, "truncated"), (self.skipped, "skipped")) if n]
        return f"{what}: rows longer than {limit} tokens: {', '.join(parts)}" if parts else None


def model_context(model: Any) -> int | None:
    """The loaded model's context length (``config.max_position_embeddings`` or the like)."""
    cfg = getattr(model, "config", None)
    for tree in (cfg, getattr(cfg, "text_config", None)):
        for key in _CONTEXT_KEYS:
            v = getattr(tree, key, None) if tree is not None else None
            if isinstance(v, int) and v > 0:
                return v
    return None


# ------------------------------------------------------------------------------------------ RL
def check_splits(task: Any, *, needs_heldout: bool, eval_n: int | None = None) -> list[Any]:
    """The task's train split, refusing an empty one (and an empty held-out split when the run
    evaluates) before any model is loaded or reward worker started; a note when the held-out split
    is smaller than ``eval_n`` (eval.n)."""
    train = task.split("train")
    if not train:
        raise LengthError(
            f"task {task.name!r}: the train split is empty (nothing to train on); check task.params"
        )
    if needs_heldout and not task.split("heldout"):
        raise InvalidValueError(
            f"task {task.name!r}: the held-out split is empty, but the run evaluates on it (eval.at_start, "
            "eval.at_end, eval.every); give the task held-out examples or turn evaluation off "
            "(eval.at_start=false eval.at_end=false)"
        )
    if needs_heldout and eval_n is not None and len(task.split("heldout")) < eval_n:
        n = len(task.split("heldout"))
        print(
            f"note: task {task.name!r} has only {n} held-out examples; eval.n={eval_n} evaluates all {n}",
            file=sys.stderr,
            flush=True,
        )
    return train


def bound_prompts(
    examples: list[Any],
    encode: Callable[[str], list[int]],
    *,
    context: int | None,
    max_new_tokens: int,
    policy: str,
    where: str,
) -> tuple[list[Any], LengthReport]:
    """Examples whose encoded prompt leaves ``max_new_tokens`` in the context; others raise
    :class:`LengthError` (``policy="error"``) or are dropped and counted (``"skip"``)."""
    report = LengthReport()
    if context is None:
        return examples, report
    limit = context - max_new_tokens
    kept = []
    for i, ex in enumerate(examples):
        prompt = ex.prompt
        size = (
            f"{len(prompt):,} characters"
            if len(prompt) > limit * MAX_CHARS_PER_TOKEN
            else (f"{n} tokens" if (n := len(encode(prompt))) > limit else None)
        )
        if size is None:
            kept.append(ex)
            continue
        if policy == "skip":
            report.skipped += 1
            continue
        raise LengthError(
            f"{where}: {_example_origin(ex, i)}: the prompt is {size}; the model's context of {context} tokens minus "
            f"rollout.max_new_tokens={max_new_tokens} leaves {limit} for it. Shorten such prompts, lower "
            "rollout.max_new_tokens, or skip them with rollout.overlong_prompts=skip"
        )
    if not kept:
        raise LengthError(f"{where}: every prompt is longer than {limit} tokens ({report.skipped} skipped)")
    note = report.note(where, limit)
    if note:
        print(f"note: {note} (rollout.overlong_prompts={policy})", file=sys.stderr, flush=True)
    return kept, report


def _example_origin(ex: Any, i: int) -> str:
    """Where an example came from, for a message: its file and 1-based row when the task recorded
    them (``meta["source"]``, ``meta["row"]``: the jsonl task), else its id and place in the (shuffled)
    split, which is not a file row."""
    meta = getattr(ex, "meta", None) or {}
    ex_id = getattr(ex, "id", None)
    named = f" (id {ex_id!r})" if ex_id is not None else ""
    if meta.get("source") is not None and meta.get("row") is not None:
        return f"{meta['source']} row {meta['row']}{named}"
    return f"example {ex_id!r} (item {i} of the split)" if ex_id is not None else f"item {i} of the split"


# ----------------------------------------------------------------------------------------- SFT
def _row_chars(row: Any) -> int:
    if hasattr(row, "messages"):
        return sum(len(r) + len(c) for r, c in row.messages)
    if hasattr(row, "text"):
        return len(row.text)
    return len(row.prompt) + len(row.completion)


def _cut_row(row: Any, chars: int) -> Any:
    if hasattr(row, "messages"):
        return dataclasses.replace(row, messages=tuple((r, c[:chars]) for r, c in row.messages))
    if hasattr(row, "text"):
        return dataclasses.replace(row, text=row.text[:chars])
    return dataclasses.replace(row, prompt=row.prompt[:chars], completion=row.completion[:chars])


def _advice(limit: int) -> str:
    return (
        f"longer than max_length={limit} tokens (default: the model's context); shorten the row, or set "
        "overlong=truncate (keep the first max_length tokens) or overlong=skip"
    )


def prebound_rows(rows: list[Any], limit: int | None, policy: str) -> tuple[list[Any], LengthReport]:
    """Before tokenizing: rows of more than ``limit * MAX_CHARS_PER_TOKEN`` characters are too long
    whatever they encode to: error, skip, or (truncate) cut to that many characters per field."""
    report = LengthReport()
    if limit is None:
        return rows, report
    bound = limit * MAX_CHARS_PER_TOKEN
    out = []
    for row in rows:
        n = _row_chars(row)
        if n <= bound:
            out.append(row)
        elif policy == "skip":
            report.skipped += 1
        elif policy == "truncate":
            out.append(_cut_row(row, bound))  # counted as truncated once tokenized
        else:
            raise LengthError(f"{row.source}: the row has {n:,} characters, {_advice(limit)}")
    return out, report


def bound_examples(
    examples: list[Any], limit: int | None, policy: str, report: LengthReport | None = None
) -> tuple[list[Any], LengthReport]:
    """Tokenized SFT examples of at most ``limit`` tokens: error, truncate (a row left without a
    target token is skipped) or skip, counted in the report."""
    report = report or LengthReport()
    if limit is None:
        return examples, report
    out = []
    for ex in examples:
        if len(ex.input_ids) <= limit:
            out.append(ex)
            continue
        if policy == "error":
            raise LengthError(
                f"{ex.source}: the row encodes to {len(ex.input_ids):,} tokens, {_advice(limit)}"
            )
        if policy == "truncate" and any(ex.loss_mask[:limit]):
            out.append(
                dataclasses.replace(ex, input_ids=ex.input_ids[:limit], loss_mask=ex.loss_mask[:limit])
            )
            report.truncated += 1
        else:
            report.skipped += 1
    return out, report
