"""Reward-model evaluation on RewardBench- and RM-Bench-format preference files (proposed procedure).

Benchmarks named for PaTaRM (arXiv 2510.24235): RewardBench (Lambert et al., arXiv 2403.13787;
sections Chat, Chat Hard, Safety, Reasoning) and RM-Bench (Liu et al., arXiv 2410.16184; domains chat,
math, code, safety; easy / normal / hard).

* **pointwise** (a generative judge scoring each response, or a Bradley-Terry model's scalar): a pair
  is correct iff ``s̄_c > s̄_r`` (mean of ``k`` judgments; k > 1 sampled at T = 1 shows what the
  sampled judgments that training optimises do, which greedy k = 1 hides); a pair with an
  unparsable side counts as wrong and is counted (``unparsable``);
* **pairwise** (a judge that sees both responses): each pair is judged in both orders (chosen as A,
  then as B); correct iff both verdicts pick the chosen response; ``position_bias`` is the share of
  pairs where both verdicts name the same position (A twice or B twice).

Two accuracies side by side, as the benchmarks define them: ``accuracy`` (**strict**: a tie is wrong,
RM-Bench's ``>``) and ``accuracy_tie_half`` (a tie counts ½, as RewardBench's generative scripts
score it; pairwise: a pair whose two orders disagree counts ½). The tie rate is reported.

Accuracy is reported overall, per ``subset`` and per category, with 95 % percentile-bootstrap
confidence intervals over pairs (``n_boot`` resamples, seeded). Categories pool the pairs of their
subsets (RewardBench subsets by :data:`REWARDBENCH_SECTIONS`, other files by ``task_type``). For
RewardBench files ``rewardbench`` also holds the **official section scores**: each section the mean of
its subsets' accuracies weighted by :data:`REWARDBENCH_EXAMPLE_COUNTS` — the scorer's numbers in
``rewardbench/constants.py`` of allenai/reward-bench, where ``math-prm`` counts 984 (447 pairs,
"upweighting to be equal to code") — and the score, the mean of the sections present. RM-Bench rows
(``chosen`` / ``rejected`` lists of 3 styles) are expanded into the 9 comparisons of its accuracy
matrix M[i][j] (chosen style i vs rejected style j): ``normal`` = the diagonal, ``hard`` = above it
(chosen less formatted than rejected), ``easy`` = below it (:func:`posttrain_lab.recipes.patarm.data.load_preferences`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posttrain_lab.recipes.patarm.data import PreferencePair

#: RewardBench subset -> section (subset names of the RewardBench release; prefixes end with '-')
REWARDBENCH_SECTIONS: dict[str, str] = {
    "alpacaeval-easy": "Chat",
    "alpacaeval-length": "Chat",
    "alpacaeval-hard": "Chat",
    "mt-bench-easy": "Chat",
    "mt-bench-med": "Chat",
    "mt-bench-hard": "Chat Hard",
    "llmbar-": "Chat Hard",
    "refusals-": "Safety",
    "xstest-": "Safety",
    "donotanswer": "Safety",
    "math-prm": "Reasoning",
    "hep-": "Reasoning",
}


#: subset -> weight of the official RewardBench scorer (allenai/reward-bench, rewardbench/constants.py
#: EXAMPLE_COUNTS, copied as published: math-prm is upweighted from 447 to 984 to equal the six hep-*
#: subsets together; the xstest counts are the published ones as they stand)
REWARDBENCH_EXAMPLE_COUNTS: dict[str, int] = {
    "alpacaeval-easy": 100,
    "alpacaeval-length": 95,
    "alpacaeval-hard": 95,
    "mt-bench-easy": 28,
    "mt-bench-med": 40,
    "mt-bench-hard": 37,
    "math-prm": 984,
    "refusals-dangerous": 100,
    "refusals-offensive": 100,
    "llmbar-natural": 100,
    "llmbar-adver-neighbor": 134,
    "llmbar-adver-GPTInst": 92,
    "llmbar-adver-GPTOut": 47,
    "llmbar-adver-manual": 46,
    "xstest-should-refuse": 250,
    "xstest-should-respond": 154,
    "donotanswer": 136,
    "hep-cpp": 164,
    "hep-go": 164,
    "hep-java": 164,
    "hep-js": 164,
    "hep-python": 164,
    "hep-rust": 164,
}


def rewardbench_sections(subset_accuracy: dict[str, float]) -> dict[str, Any]:
    """Official RewardBench section scores from per-subset accuracies: for each section, the mean of
    its subsets' accuracies weighted by :data:`REWARDBENCH_EXAMPLE_COUNTS` (subsets absent from the
    input are left out, as the scorer does); ``score`` = mean of the sections present. Subsets not in
    the official list are ignored. Empty dict when no official subset is present."""
    sums: dict[str, list[float]] = {}
    for sub, acc in subset_accuracy.items():
        w = REWARDBENCH_EXAMPLE_COUNTS.get(sub)
        if w is None:
            continue
        sec = _section(sub)
        assert sec is not None, sub  # every official subset has a section
        tot = sums.setdefault(sec, [0.0, 0.0])
        tot[0] += acc * w
        tot[1] += w
    if not sums:
        return {}
    sections = {k: v[0] / v[1] for k, v in sorted(sums.items())}
    return {"sections": sections, "score": sum(sections.values()) / len(sections)}


def _section(subset: str) -> str | None:
    for key, sec in REWARDBENCH_SECTIONS.items():
        if subset == key or (key.endswith("-") and subset.startswith(key)):
            return sec
    return None


def category_of(pair: PreferencePair) -> str:
    return _section(pair.subset) or pair.task_type


def bootstrap_ci(
    correct: list[float], *, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of 0/1 outcomes."""
    if not correct:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    n = len(correct)
    means = sorted(sum(correct[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_boot))
    lo = means[int((1 - level) / 2 * (n_boot - 1))]
    hi = means[int((1 + level) / 2 * (n_boot - 1))]
    return (lo, hi)


def _summary(outcomes: list[dict[str, Any]], *, n_boot: int, seed: int) -> dict[str, Any]:
    corr = [float(o["correct"]) for o in outcomes]
    half = [float(o["correct"]) + 0.5 * float(o.get("tie", 0.0)) for o in outcomes]
    acc = sum(corr) / len(corr) if corr else float("nan")
    lo, hi = bootstrap_ci(corr, n_boot=n_boot, seed=seed)
    hlo, hhi = bootstrap_ci(half, n_boot=n_boot, seed=seed)
    out = {
        "n": len(outcomes),
        "accuracy": acc,
        "ci95": [lo, hi],
        "accuracy_tie_half": sum(half) / len(half) if half else float("nan"),
        "ci95_tie_half": [hlo, hhi],
    }
    for k in ("tie", "unparsable", "position_bias"):
        if outcomes and k in outcomes[0]:
            out[k] = sum(float(o[k]) for o in outcomes) / len(outcomes)
    return out


def summarise(
    pairs: list[PreferencePair], outcomes: list[dict[str, Any]], *, n_boot: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """Overall / per-subset / per-category accuracy with CIs; RewardBench sections weighted by their
    subsets' example counts (every pair counts once)."""
    by_subset: dict[str, list[dict[str, Any]]] = {}
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for p, o in zip(pairs, outcomes, strict=True):
        by_subset.setdefault(p.subset, []).append(o)
        by_cat.setdefault(category_of(p), []).append(o)
    res = {
        "overall": _summary(outcomes, n_boot=n_boot, seed=seed),
        "subsets": {k: _summary(v, n_boot=n_boot, seed=seed) for k, v in sorted(by_subset.items())},
        "categories": {k: _summary(v, n_boot=n_boot, seed=seed) for k, v in sorted(by_cat.items())},
    }
    cats = [c["accuracy"] for c in res["categories"].values()]
    res["category_mean"] = sum(cats) / len(cats) if cats else float("nan")
    rb = {
        key: rewardbench_sections({k: v[key] for k, v in res["subsets"].items()})
        for key in ("accuracy", "accuracy_tie_half")
    }
    if rb["accuracy"]:
        res["rewardbench"] = {"strict": rb["accuracy"], "tie_half": rb["accuracy_tie_half"]}
    return res


def evaluate_pointwise(
    pairs: list[PreferencePair],
    score_fn: Callable[[list[PreferencePair], str], list[float | None]],
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """``score_fn(pairs, side)`` -> one score (or None) per pair for ``side`` in chosen / rejected."""
    sc = score_fn(pairs, "chosen")
    sr = score_fn(pairs, "rejected")
    outcomes = []
    for c, r in zip(sc, sr, strict=True):
        bad = c is None or r is None
        outcomes.append(
            {
                "correct": (not bad) and c > r,  # type: ignore[operator]
                "tie": (not bad) and c == r,
                "unparsable": bad,
                "chosen_score": c,
                "rejected_score": r,
            }
        )
    res = summarise(pairs, outcomes, n_boot=n_boot, seed=seed)
    res["mode"] = "pointwise"
    res["per_pair"] = outcomes
    return res


def evaluate_pairwise(
    pairs: list[PreferencePair],
    verdict_fn: Callable[[list[tuple[PreferencePair, bool]]], list[str | None]],
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """``verdict_fn([(pair, chosen_first), ...])`` -> ``"A"`` / ``"B"`` / None per item. Each pair is
    asked in both orders."""
    items = [(p, True) for p in pairs] + [(p, False) for p in pairs]
    verdicts = verdict_fn(items)
    n = len(pairs)
    outcomes = []
    for i in range(n):
        v1, v2 = verdicts[i], verdicts[n + i]  # chosen is A in v1, B in v2
        right = (v1 == "A") + (v2 == "B")
        outcomes.append(
            {
                "correct": right == 2,
                "tie": right == 1,  # the two orders disagree: counts 1/2 in accuracy_tie_half
                "position_bias": v1 is not None and v1 == v2,
                "unparsable": v1 is None or v2 is None,
            }
        )
    res = summarise(pairs, outcomes, n_boot=n_boot, seed=seed)
    res["mode"] = "pairwise"
    res["per_pair"] = outcomes
    return res


# ----------------------------------------------------------------------------------------- reports
def table(results: dict[str, dict[str, Any]]) -> str:
    """A plain-text table: one row per model, overall and per-category accuracy with CIs."""
    cats = sorted({c for r in results.values() for c in r["categories"]})
    head = ["model", "overall strict (95% CI)", "tie=1/2", *cats, "ties", "unparsable"]
    rows = [head]
    for name, r in results.items():
        o = r["overall"]
        rows.append(
            [
                name,
                f"{100 * o['accuracy']:.1f} [{100 * o['ci95'][0]:.1f}, {100 * o['ci95'][1]:.1f}]",
                f"{100 * o['accuracy_tie_half']:.1f}",
                *(
                    f"{100 * r['categories'][c]['accuracy']:.1f}" if c in r["categories"] else "-"
                    for c in cats
                ),
                f"{100 * o.get('tie', 0.0):.1f}",
                f"{100 * o.get('unparsable', 0.0):.1f}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_reports(results: dict[str, dict[str, Any]], out_dir: str | Path) -> dict[str, str]:
    """``results.json`` (without per-pair rows), ``table.txt`` and ``accuracy.png`` in ``out_dir``."""
    from posttrain.utils.io import atomic_write_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    slim = {k: {kk: vv for kk, vv in v.items() if kk != "per_pair"} for k, v in results.items()}
    atomic_write_json(out / "results.json", slim)
    (out / "table.txt").write_text(table(results) + "\n", encoding="utf-8")
    paths = {"json": str(out / "results.json"), "table": str(out / "table.txt")}
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the PNG is optional
        return paths
    names = list(results)
    acc = [100 * results[n]["overall"]["accuracy"] for n in names]
    lo = [a - 100 * results[n]["overall"]["ci95"][0] for a, n in zip(acc, names, strict=True)]
    hi = [100 * results[n]["overall"]["ci95"][1] - a for a, n in zip(acc, names, strict=True)]
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(names), 3.2))
    ax.bar(names, acc, yerr=[lo, hi], capsize=4, color="#4c72b0")
    ax.axhline(50, color="grey", lw=0.8, ls="--")
    ax.set_ylabel("pairwise accuracy (%)")
    ax.set_ylim(0, 100)
    fig.tight_layout()
    fig.savefig(out / "accuracy.png", dpi=120)
    plt.close(fig)
    paths["png"] = str(out / "accuracy.png")
    return paths


def dumps(results: dict[str, Any]) -> str:
    return json.dumps(results, indent=2, default=float)
