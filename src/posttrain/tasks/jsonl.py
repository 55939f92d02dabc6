"""`jsonl`: load a real dataset (GSM8K / MATH style) from `.jsonl`, `.json` or `.parquet` files.

Each row is a JSON object. By default the prompt is field `question` and the gold answer field
`answer`; both are configurable (`prompt_field`, `answer_field`, optional `id_field`). The gold
answer can be extracted from a worked solution:

- `answer_extract="gsm8k"`: the text after the last `####` (GSM8K; Cobbe et al. 2021),
- `answer_extract="boxed"`: the content of the last `\\boxed{...}` (MATH; Hendrycks et al. 2021),
- `answer_extract="none"`: the field as is.

The heldout split is either a second file (`heldout_path`) or a seeded fraction of the rows
(`heldout_fraction`, default 0.1). A fraction split assigns whole groups of rows with the same
prompt, so no heldout prompt appears in train; with a `heldout_path`, train rows whose prompt is in
the heldout file are removed (`dedupe_train=True`) and the count is reported.

Bad rows (invalid JSON, not an object, missing field, wrong type, empty, no extractable answer)
raise `DatasetError` naming the file, the 1-based row number, the field and what was expected.
Rows are never dropped silently: `skip_bad_rows=True` skips them, counts them in
`task.load_report` and warns with the first messages. Blank lines are not rows and are ignored.
"""

from __future__ import annotations

import json
import random
import re
import warnings
from pathlib import Path
from typing import Any, Literal

from posttrain.tasks.base import DEFAULT_MARKER, ChatPrompt, Example, Task, chat_prompt, register_task
from posttrain.utils.data import jsonl_lines
from posttrain.utils.errors import InvalidValueError, PosttrainError, PosttrainWarning

_EXTRACT = ("gsm8k", "boxed", "none")
_DEFAULT_REWARD = {"gsm8k": "numeric", "boxed": "math_verify", "none": "exact_match"}
_CALCULATOR = re.compile(r"<<[^<>\n]*>>")  # GSM8K calculator annotations, e.g. <<48/2=24>>
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}|[{}]")


class DatasetError(PosttrainError, ValueError):
    """A dataset file or row that cannot be used; the message names file, row and field."""


class DatasetWarning(PosttrainWarning):
    """Rows of a dataset were dropped (bad rows skipped, train rows that repeat a held-out prompt)."""


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces matched; None if absent."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start == -1:
        return None
    after = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    i = len(text) - len(text[after:].lstrip())  # the argument's first character
    if not text.startswith("{", i):
        # `\boxed 5` (no braces) is valid LaTeX for a single token; a later `{` is not its argument
        m = re.match(r"\s+([^\s$]+)", text[after:])
        return m.group(1) if m else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def gsm8k_final(text: str) -> str | None:
    """The text after the last `####`, stripped; None if there is none."""
    i = text.rfind("####")
    if i == -1:
        return None
    return text[i + 4 :].strip() or None


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _preview(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _hf_rows(path: Path) -> list[tuple[int, Any]]:
    """Rows of a Hugging Face ``datasets`` source: a ``save_to_disk`` directory (a Dataset, or a
    DatasetDict with one split; with several, name the split's sub-directory) or an ``.arrow`` file."""
    try:
        import datasets
    except ImportError as e:
        raise DatasetError(
            f"{path}: reading a saved dataset directory or an .arrow file needs the `datasets` package "
            '(pip install datasets, or pip install -e ".[trl]", which includes it)'
        ) from e
    try:
        if path.is_dir():
            ds = datasets.load_from_disk(str(path))
        else:
            ds = datasets.Dataset.from_file(str(path))
    except (FileNotFoundError, ValueError, OSError) as e:
        what = "is a directory but not" if path.is_dir() else "is not an .arrow file of"
        raise DatasetError(
            f"{path}: {what} a dataset saved with datasets' save_to_disk / Dataset.from_file ({e})"
        ) from e
    if isinstance(ds, datasets.DatasetDict):
        if len(ds) != 1:
            raise DatasetError(
                f"{path}: a DatasetDict with splits {', '.join(ds)}; pass one split's directory, e.g. "
                f"{path / next(iter(ds))}"
            )
        ds = next(iter(ds.values()))
    return list(enumerate(ds.to_list(), start=1))


def read_raw_rows(path: Path) -> list[tuple[int, Any]]:
    """`(1-based row number, parsed JSON value or a DatasetError)` for every row of a .jsonl, .json,
    .parquet or .arrow file or a ``datasets`` ``save_to_disk`` directory (a row's error is returned,
    not raised, so callers may skip bad rows)."""
    if not path.exists():
        raise DatasetError(f"dataset file {path} does not exist")
    suffix = path.suffix.lower()
    if path.is_dir() or suffix == ".arrow":
        return _hf_rows(path)
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise DatasetError(
                f"{path}: reading .parquet needs pyarrow (pip install pyarrow, or convert to .jsonl)"
            ) from e
        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid / ArrowIOError
            raise DatasetError(f"{path}: not a readable parquet file ({e})") from e
        return list(enumerate(table.to_pylist(), start=1))
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark is accepted
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DatasetError(f"{path}: invalid JSON file ({e})") from e
        if not isinstance(data, list):
            raise DatasetError(f"{path}: expected a JSON array of row objects, got {_type_name(data)}")
        return list(enumerate(data, start=1))
    # the SFT data's line reader: the same messages (the byte not UTF-8, the JSON error's column)
    return [
        (n, DatasetError(f"{path}: row {n}: {problem}") if problem else row)
        for n, row, problem in jsonl_lines(path)
    ]


def _lookup(path: Path, n: int, row: dict[str, Any], field: str) -> Any:
    """``row[field]``; a dotted name reaches into nested objects (verl's ``reward_model.ground_truth``)
    when no column has that literal name. A missing key names the part that is missing."""
    if field in row:
        return row[field]
    cur: Any = row
    parts = field.split(".")
    for i, part in enumerate(parts):
        if not isinstance(cur, dict) or part not in cur:
            have = (
                ", ".join(sorted(map(str, cur))) if isinstance(cur, dict) else _type_name(cur)
            ) or "(none)"
            if i == 0:
                raise DatasetError(
                    f"{path}: row {n}: missing field '{field}' (expected a non-empty string; "
                    f"the row has fields: {have})"
                )
            raise DatasetError(
                f"{path}: row {n}: missing field '{field}' (no '{part}' in '{'.'.join(parts[:i])}', which "
                f"has: {have}; expected a non-empty string)"
            )
        cur = cur[part]
    return cur


#: ``layout`` presets: column names of a dataset layout other libraries write.
LAYOUTS: dict[str, dict[str, str]] = {
    "fields": {},
    # verl's RL parquet (examples/data_preprocess/gsm8k.py): prompt = chat messages, the gold answer in
    # reward_model.ground_truth; data_source / ability / extra_info are kept in Example.meta
    "verl": {"prompt_field": "prompt", "answer_field": "reward_model.ground_truth"},
}


@register_task("jsonl", aliases=("dataset", "parquet"))
class JsonlTask(Task):
    """A dataset file as a task. See the module docstring for the fields and error behaviour."""

    name = "jsonl"

    def __init__(
        self,
        path: str | Path,
        heldout_path: str | Path | None = None,
        heldout_fraction: float | None = None,
        seed: int = 0,
        prompt_field: str = "question",
        answer_field: str = "answer",
        id_field: str | None = None,
        answer_extract: Literal["gsm8k", "boxed", "none"] = "none",
        prompt_template: str | None = None,
        answer_marker: str | None = None,
        default_reward: str | None = None,
        skip_bad_rows: bool = False,
        dedupe_train: bool = True,
        limit: int | None = None,
        strip_calculator: bool = True,
        layout: Literal["fields", "verl"] = "fields",
    ) -> None:
        super().__init__()
        if layout not in LAYOUTS:
            raise InvalidValueError(
                f"task 'jsonl': layout must be one of {', '.join(LAYOUTS)}, got {layout!r}"
            )
        self.layout = layout
        preset = LAYOUTS[layout]
        prompt_field = (
            preset.get("prompt_field", prompt_field) if prompt_field == "question" else prompt_field
        )
        answer_field = preset.get("answer_field", answer_field) if answer_field == "answer" else answer_field
        if answer_extract not in _EXTRACT:
            raise InvalidValueError(
                f"task 'jsonl': answer_extract must be one of {', '.join(_EXTRACT)}, got {answer_extract!r}"
            )
        if heldout_path is not None and heldout_fraction is not None:
            raise InvalidValueError("task 'jsonl': give either heldout_path or heldout_fraction, not both")
        if heldout_fraction is not None and not 0.0 <= heldout_fraction < 1.0:
            raise InvalidValueError(
                f"task 'jsonl': heldout_fraction must be in [0, 1), got {heldout_fraction!r}"
            )
        if prompt_template is not None and "{question}" not in prompt_template:
            raise InvalidValueError(
                f"task 'jsonl': prompt_template must contain '{{question}}', got {prompt_template!r}"
            )
        if prompt_template is not None:
            for m in _PLACEHOLDER.finditer(prompt_template):
                if m.group(0) in ("{", "}"):
                    raise InvalidValueError(
                        f"task 'jsonl': prompt_template has an unmatched {m.group(0)!r} at position "
                        f"{m.start()}; write {{{{ or }}}} for a literal brace"
                    )
        if limit is not None and limit < 1:
            raise InvalidValueError(f"task 'jsonl': limit must be >= 1, got {limit!r}")
        self.path = Path(path)
        self.heldout_path = Path(heldout_path) if heldout_path is not None else None
        self.heldout_fraction = heldout_fraction
        self.seed = seed
        self.prompt_field, self.answer_field, self.id_field = prompt_field, answer_field, id_field
        self.answer_extract = answer_extract
        self.prompt_template = prompt_template
        self.answer_marker = (
            answer_marker
            if answer_marker is not None
            else (DEFAULT_MARKER if answer_extract == "gsm8k" else None)
        )
        self.default_reward = default_reward or _DEFAULT_REWARD[answer_extract]
        self.skip_bad_rows, self.dedupe_train, self.limit = skip_bad_rows, dedupe_train, limit
        self.strip_calculator = strip_calculator
        self.load_report: dict[str, Any] = {}
        self._splits.update(self._build_splits())  # load now: bad files fail at construction

    def params(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "heldout_path": str(self.heldout_path) if self.heldout_path else None,
            "heldout_fraction": self.heldout_fraction,
            "seed": self.seed,
            "prompt_field": self.prompt_field,
            "answer_field": self.answer_field,
            "id_field": self.id_field,
            "answer_extract": self.answer_extract,
            "prompt_template": self.prompt_template,
            "answer_marker": self.answer_marker,
            "default_reward": self.default_reward,
            "skip_bad_rows": self.skip_bad_rows,
            "dedupe_train": self.dedupe_train,
            "limit": self.limit,
            "strip_calculator": self.strip_calculator,
            "layout": self.layout,
        }

    # -- reading ------------------------------------------------------------------------------
    def _field(
        self, path: Path, n: int, row: dict[str, Any], field: str, allow_int: bool, chat: bool = False
    ) -> str:
        v = _lookup(path, n, row, field)
        if chat and isinstance(v, list):  # a conversation (TRL / verl): [{"role", "content"}, ...]
            return chat_prompt(v, f"{path}: row {n}: field '{field}'", DatasetError)
        if allow_int and isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        if not isinstance(v, str):
            expected = "a string or an integer" if allow_int else "a string"
            raise DatasetError(
                f"{path}: row {n}: field '{field}' must be {expected}, got {_type_name(v)} ({_preview(v)})"
            )
        if not v.strip():
            raise DatasetError(f"{path}: row {n}: field '{field}' is empty (expected a non-empty string)")
        return v

    def _prompt(self, path: Path, n: int, row: dict[str, Any], question: str) -> str:
        if self.prompt_template is None:
            return question
        if isinstance(question, ChatPrompt):
            raise DatasetError(
                f"{path}: row {n}: field '{self.prompt_field}' is a conversation; prompt_template applies "
                "to text prompts only (use task.prompt_template, which wraps the last user message)"
            )

        def sub(m: re.Match[str]) -> str:
            tok = m.group(0)
            if tok in ("{{", "}}"):
                return tok[0]
            name = m.group(1)
            if name == "question":
                return question
            return self._field(path, n, row, name, allow_int=True)

        return _PLACEHOLDER.sub(sub, self.prompt_template)

    def _example(self, path: Path, n: int, row: Any, split: str) -> Example:
        if not isinstance(row, dict):
            raise DatasetError(f"{path}: row {n}: expected a JSON object, got {_type_name(row)}")
        question = self._field(path, n, row, self.prompt_field, allow_int=False, chat=True)
        raw_answer = self._field(path, n, row, self.answer_field, allow_int=True)
        if self.answer_extract == "gsm8k":
            answer = gsm8k_final(raw_answer)
            if answer is None:
                raise DatasetError(
                    f"{path}: row {n}: field '{self.answer_field}' has no '#### <final answer>' "
                    "(answer_extract='gsm8k')"
                )
        elif self.answer_extract == "boxed":
            answer = last_boxed(raw_answer)
            if not answer:
                raise DatasetError(
                    f"{path}: row {n}: field '{self.answer_field}' has no non-empty \\boxed{{...}} "
                    "(answer_extract='boxed')"
                )
        else:
            answer = raw_answer.strip()
        ex_id = (
            self._field(path, n, row, self.id_field, allow_int=True).strip()
            if self.id_field
            else f"{path.stem}:{n}"
        )
        meta: dict[str, Any] = {"source": str(path), "row": n, "raw_answer": raw_answer, "split": split}
        for key in ("data_source", "ability", "extra_info"):  # verl's columns, kept for rewards
            if key in row and key not in (self.prompt_field, self.answer_field):
                meta[key] = row[key]
        if self.answer_marker:
            meta["answer_marker"] = self.answer_marker
        return Example(id=ex_id, prompt=self._prompt(path, n, row, question), answer=answer, meta=meta)

    def _load(self, path: Path, split: str) -> list[Example]:
        out: list[Example] = []
        bad: list[str] = []
        ids: dict[str, int] = {}
        rows = self._rows(path)
        for n, row in rows:
            try:
                if isinstance(row, DatasetError):
                    raise row
                ex = self._example(path, n, row, split)
                if ex.id in ids:
                    raise DatasetError(
                        f"{path}: row {n}: field '{self.id_field}': duplicate id {ex.id!r} "
                        f"(first seen at row {ids[ex.id]}); ids must be unique"
                    )
                ids[ex.id] = n
            except DatasetError as e:
                if not self.skip_bad_rows:
                    raise
                bad.append(str(e))
                continue
            out.append(ex)
            if self.limit is not None and len(out) >= self.limit:
                break
        self.load_report[str(path)] = {
            "rows": len(rows),
            "examples": len(out),
            "bad_rows": len(bad),
            "bad_row_messages": bad[:5],
        }
        if bad:
            warnings.warn(
                f"{path}: skipped {len(bad)} bad row(s) of {len(rows)} (skip_bad_rows=True); first: {bad[0]}",
                DatasetWarning,
                stacklevel=3,
            )
        if not out:
            raise DatasetError(f"{path}: no usable rows (read {len(rows)}, bad {len(bad)})")
        return out

    def _rows(self, path: Path) -> list[tuple[int, Any]]:
        """The (1-based row number, row) pairs of ``path`` (:class:`RowsTask`: rows held in memory)."""
        return read_raw_rows(path)

    def _build_splits(self) -> dict[str, list[Example]]:
        main = self._load(self.path, "train")
        if self.heldout_path is not None:
            heldout = self._load(self.heldout_path, "heldout")
            held_prompts = {e.prompt for e in heldout}
            train = [e for e in main if e.prompt not in held_prompts] if self.dedupe_train else main
            removed = len(main) - len(train)
            self.load_report["overlap_removed_from_train"] = removed
            if removed:
                warnings.warn(
                    f"{self.path}: removed {removed} train row(s) whose prompt is in {self.heldout_path}",
                    DatasetWarning,
                    stacklevel=3,
                )
            return {"train": train, "heldout": heldout}
        frac = 0.1 if self.heldout_fraction is None else self.heldout_fraction
        prompts = list(dict.fromkeys(e.prompt for e in main))
        random.Random(f"jsonl:{self.seed}").shuffle(prompts)
        n_held = round(frac * len(prompts))
        held_set = set(prompts[:n_held])
        heldout = [self._relabel(e, "heldout") for e in main if e.prompt in held_set]
        train = [e for e in main if e.prompt not in held_set]
        return {"train": train, "heldout": heldout}

    @staticmethod
    def _relabel(e: Example, split: str) -> Example:
        return Example(id=e.id, prompt=e.prompt, answer=e.answer, meta={**e.meta, "split": split})

    # -- references ---------------------------------------------------------------------------
    def reference_completion(self, example: Example, style: Literal["short", "long"] = "short") -> str:
        """`long`: the dataset's own solution text (GSM8K rationale ending in `#### x`, without its
        `<<48/2=24>>` calculator annotations when `strip_calculator`; MATH solution with
        `\\boxed{x}`); `short`: just the final answer in the task's answer format."""
        if style not in ("short", "long"):
            raise InvalidValueError(f"style must be 'short' or 'long', got {style!r}")
        if style == "long" and self.answer_extract != "none":
            raw = example.meta["raw_answer"]
            return _CALCULATOR.sub("", raw) if self.strip_calculator else raw
        if self.answer_extract == "boxed":
            return f"The answer is $\\boxed{{{example.answer}}}$."
        if self.answer_marker:
            return f"{self.answer_marker} {example.answer}"
        return example.answer


class RowsTask(JsonlTask):
    """Rows held in memory (dicts, or a ``datasets.Dataset``'s rows) as a task: the ``jsonl`` task's
    column mapping (``prompt_field``, ``answer_field``, ``id_field``, ``answer_extract``, ...), held-out
    split (``heldout_rows``, else a seeded ``heldout_fraction``, default 0.1) and row errors, which
    name ``label`` and the 1-based row. Each example's ``meta["columns"]`` holds the row's other
    columns (what a TRL-style reward receives as keyword arguments). What ``RLTrainer(task=rows)``
    builds; construct it yourself for another column mapping."""

    name = "rows"

    def __init__(
        self,
        rows: list[Any],
        heldout_rows: list[Any] | None = None,
        *,
        label: str = "rows",
        **params: Any,
    ) -> None:
        held_label = f"{label} (held-out)"
        self._memory = {label: list(rows), held_label: list(heldout_rows or [])}
        params.pop("path", None)
        params.pop("heldout_path", None)
        super().__init__(path=label, heldout_path=held_label if heldout_rows is not None else None, **params)

    def _rows(self, path: Path) -> list[tuple[int, Any]]:
        return list(enumerate(self._memory[str(path)], start=1))

    def _example(self, path: Path, n: int, row: Any, split: str) -> Example:
        ex = super()._example(path, n, row, split)
        ex.meta["columns"] = {k: v for k, v in row.items() if k != self.prompt_field}
        return ex
