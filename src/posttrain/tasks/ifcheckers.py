"""Verifiable-instruction checkers from a maintained library, and IFEval/IFBench scoring.

The checkers are those of `if-verifiable` (PyPI; the ``ifbench`` extra: ``pip install -e ".[ifbench]"``): the IFEval
set (Zhou et al. 2023, arXiv:2311.07911, ``google-research/instruction_following_eval``) and the IFBench
set (Pyatkin et al. 2025, arXiv:2507.02833, ``allenai/IFBench``), each a registry
``instruction_id -> Instruction class`` with ``build_description(**kwargs)`` (the instruction text)
and ``check_following(response)``. posttrain does not re-implement any checker.

Scoring (:func:`check_instructions`) is the benchmark authors' ``evaluation_lib``:

- strict: instruction *i* is followed when ``response.strip()`` is non-empty and
  ``check_following(response)`` is true;
- loose: followed when any of 8 variants passes: the response, with its first line removed, its last
  line removed, both removed (split on ``"\\n"``, re-joined, stripped), and each of those four with
  every ``*`` removed;
- kwargs whose value is ``None`` are dropped before ``build_description``; checkers whose arguments
  include ``prompt`` are rebuilt with the prompt.

`langdetect` (used by the IFEval language and case checkers) is seeded (``DetectorFactory.seed = 0``)
so a verdict does not change between calls; unseeded it is random on short texts.

Prompt level = all instructions of a prompt followed; instruction level = followed / all instructions,
pooled over prompts (:func:`aggregate`).

No network at run time: the IFBench utilities call ``nltk.download`` at import for data that is not
installed; posttrain imports them with ``nltk.download`` replaced by a function that downloads nothing.
Instruction types whose checker then needs missing NLTK data (punkt sentence splitting, stopwords, the
POS tagger) are found by a probe (:func:`unavailable_types`) and reported as skipped, with a count.
"""

from __future__ import annotations

import importlib
import random
from functools import cache
from typing import Any

from posttrain.utils.errors import InvalidValueError, PosttrainError

REGISTRIES = {
    "ifeval": "if_verifiable.ifeval.instructions_registry",
    "ifbench": "if_verifiable.ifbench.instructions_registry",
}
_PROBE = (
    "Hello world. This is a short probe answer, with a comma.\n\n"
    "Second paragraph here: it has words, numbers like 12, and a question? Yes!\n\n"
    "* a bullet\n* another bullet"
)


class CheckerUnavailable(PosttrainError, RuntimeError):
    """The checker library, or data a checker needs, is not installed."""


#: the checkers' extra (posttrain is installed from its checkout; there is no `posttrain` on PyPI)
INSTALL_HINT = 'pip install -e ".[ifbench]" (or pip install if-verifiable==0.1.2)'


def _import_blocking_downloads(module: str) -> Any:
    try:
        import nltk
    except ImportError as e:
        raise CheckerUnavailable(
            f"verifiable-instruction checkers need the `if-verifiable` package (and its `nltk`): {INSTALL_HINT}"
        ) from e
    real = nltk.download
    nltk.download = lambda *a, **k: False  # never the network: missing data is reported per type
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise CheckerUnavailable(
            f"verifiable-instruction checkers ({module}) need the `if-verifiable` package: {INSTALL_HINT}"
        ) from e
    finally:
        nltk.download = real


@cache
def registry(which: str) -> dict[str, type]:
    """``instruction_id -> checker class`` of the ``"ifeval"`` or ``"ifbench"`` set."""
    if which not in REGISTRIES:
        raise InvalidValueError(f"unknown checker set {which!r}; accepted: {', '.join(REGISTRIES)}")
    reg = dict(_import_blocking_downloads(REGISTRIES[which]).INSTRUCTION_DICT)
    try:  # langdetect (IFEval's language/case checkers) is random unless seeded: make verdicts repeatable
        from langdetect import DetectorFactory

        DetectorFactory.seed = 0
    except ImportError:
        pass
    return reg


@cache
def unavailable_types(which: str) -> dict[str, str]:
    """Instruction types of set ``which`` whose checker cannot run here -> why (missing NLTK data)."""
    out: dict[str, str] = {}
    state = random.getstate()
    try:
        random.seed(0)
        for iid, cls in registry(which).items():
            try:
                checker = cls(iid)
                checker.build_description()
                checker.check_following(_PROBE)
            except LookupError as e:
                first = str(e).strip().splitlines()
                out[iid] = "missing NLTK data: " + next((ln.strip() for ln in first if "Resource" in ln), "?")
            except Exception:  # a probe with random kwargs may fail for other reasons
                pass
    finally:
        random.setstate(state)
    return out


def build_checker(which: str, instruction_id: str, kwargs: dict[str, Any] | None, prompt: str) -> Any:
    """A built checker as the authors' evaluation_lib builds it (None-valued kwargs dropped)."""
    reg = registry(which)
    if instruction_id not in reg:
        raise KeyError(f"unknown {which} instruction id {instruction_id!r}")
    checker = reg[instruction_id](instruction_id)
    kw = {k: v for k, v in (kwargs or {}).items() if v is not None}
    checker.build_description(**kw)
    args = checker.get_instruction_args()
    if args and "prompt" in args:
        checker.build_description(prompt=prompt)
    return checker


def loose_variants(response: str) -> list[str]:
    """The 8 responses of IFEval/IFBench loose scoring (see the module docstring)."""
    r = response.split("\n")
    first = "\n".join(r[1:]).strip()
    last = "\n".join(r[:-1]).strip()
    both = "\n".join(r[1:-1]).strip()
    return [
        response,
        response.replace("*", ""),
        first,
        last,
        both,
        first.replace("*", ""),
        last.replace("*", ""),
        both.replace("*", ""),
    ]


def check_instructions(
    response: str, instruction_ids: list[str], kwargs: list[dict[str, Any]], prompt: str, which: str
) -> tuple[list[bool], list[bool]]:
    """(strict, loose) followed flags, one per instruction. A checker that needs missing data raises
    :class:`CheckerUnavailable` naming the instruction type."""
    variants = loose_variants(response)
    strict, loose = [], []
    for i, iid in enumerate(instruction_ids):
        try:
            checker = build_checker(which, iid, kwargs[i] if kwargs else None, prompt)
            strict.append(bool(response.strip() and checker.check_following(response)))
            loose.append(any(v.strip() and checker.check_following(v) for v in variants))
        except LookupError as e:
            raise CheckerUnavailable(f"instruction type {iid!r} needs NLTK data that is not installed") from e
    return strict, loose


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """IFEval/IFBench accuracies from rows ``{"instruction_id_list", "strict", "loose"}`` (one per
    prompt): prompt-level and instruction-level, strict and loose, and per instruction type."""
    if not rows:
        return {"n_prompts": 0, "n_instructions": 0}
    n_inst = sum(len(r["strict"]) for r in rows)
    per: dict[str, list[int]] = {}
    for r in rows:
        for iid, s, lo in zip(r["instruction_id_list"], r["strict"], r["loose"], strict=True):
            c = per.setdefault(iid, [0, 0, 0])
            c[0] += 1
            c[1] += int(s)
            c[2] += int(lo)
    return {
        "n_prompts": len(rows),
        "n_instructions": n_inst,
        "prompt_strict": sum(all(r["strict"]) for r in rows) / len(rows),
        "prompt_loose": sum(all(r["loose"]) for r in rows) / len(rows),
        "instruction_strict": sum(sum(r["strict"]) for r in rows) / n_inst,
        "instruction_loose": sum(sum(r["loose"]) for r in rows) / n_inst,
        "per_type": {
            k: {"n": c[0], "strict": c[1] / c[0], "loose": c[2] / c[0]} for k, c in sorted(per.items())
        },
    }
