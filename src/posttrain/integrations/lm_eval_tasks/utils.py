"""Datasets and scoring of posttrain's lm-eval tasks (the YAMLs beside this file).

``posttrain_arithmetic`` (generate_until) is the held-out split of posttrain's ``arithmetic`` task,
built by posttrain (nothing is read from the Hub) and scored by posttrain's own reward
(``exact_match``), so its ``acc`` is the ``accuracy`` of ``posttrain eval --task arithmetic`` on the
same questions. ``posttrain_arithmetic_mc`` (multiple_choice) reads ``arithmetic_mc.jsonl`` shipped
here with lm-eval's local ``json`` builder; :func:`mc_docs` writes it (deterministic; a test checks
the file equals it).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MC_FILE = HERE / "arithmetic_mc.jsonl"
ARITHMETIC = {"digits": 2, "ops": "+", "n_heldout": 200, "seed": 0}
"""The ``arithmetic`` task's defaults (``posttrain eval --task arithmetic``)."""


def _heldout(**params: Any) -> list[Any]:
    from posttrain.tasks import get_task

    known = {k: params[k] for k in ("digits", "ops", "n_heldout", "seed") if k in params}
    return get_task("arithmetic", **{**ARITHMETIC, **known}).split("heldout")


def arithmetic_dataset(**params: Any) -> Any:
    """lm-eval ``custom_dataset``: ``{"test": Dataset(id, prompt, answer)}`` of the held-out split
    (``dataset_kwargs`` of the YAML: digits, ops, n_heldout, seed; other keys lm-eval passes are
    ignored)."""
    import datasets

    rows = [{"id": e.id, "prompt": e.prompt, "answer": e.answer} for e in _heldout(**params)]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def score_arithmetic(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """``acc``: posttrain's ``exact_match`` reward of the completion (the first line equals the answer)."""
    from posttrain.rewards import get_reward
    from posttrain.tasks.base import Example

    example = Example(id=doc["id"], prompt=doc["prompt"], answer=doc["answer"])
    return {"acc": float(get_reward("exact_match")(results[0], example) >= 1.0)}


def mc_docs(n: int = 100) -> list[dict[str, Any]]:
    """Multiple-choice questions from the first ``n`` held-out arithmetic questions: the answer and
    three distractors (off by one, off by ten, digits swapped or off by two), shuffled per question
    with a seeded generator."""
    out = []
    for e in _heldout()[:n]:
        gold = int(e.answer)
        cands = [gold + 1, gold - 1, gold + 10, gold - 10, int(str(gold)[::-1]) if gold >= 10 else gold + 2]
        distractors = []
        for c in cands:
            if c >= 0 and c != gold and c not in distractors:
                distractors.append(c)
        choices = [str(gold), *[str(c) for c in distractors[:3]]]
        rng = random.Random(f"posttrain_arithmetic_mc:{e.id}")
        rng.shuffle(choices)
        out.append({"id": e.id, "question": e.prompt, "choices": choices, "label": choices.index(str(gold))})
    return out


def write_mc_file(path: Path = MC_FILE) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in mc_docs()), encoding="utf-8")
    return path


def mc_dataset(**_: Any) -> Any:
    """lm-eval ``custom_dataset``: the shipped ``arithmetic_mc.jsonl`` through the local ``json``
    builder (an absolute path, so it works from any working directory)."""
    import datasets

    return datasets.load_dataset("json", data_files={"test": str(MC_FILE)})
