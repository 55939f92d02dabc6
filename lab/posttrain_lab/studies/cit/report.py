"""Reports of a CIT run folder: per-method means over seeds (table, JSON, Markdown) and a PNG with the
accuracy-matrix heatmaps and forgetting curves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

COLUMNS = (
    "method",
    "seeds",
    "AA",
    "BWT",
    "FWT",
    "forgetting",
    "held-out",
    "P",
    "P (train rules)",
    "V",
    "wall s",
)


def load_summaries(out_dir: str | Path) -> dict[str, list[dict[str, Any]]]:
    """``{method: [summary per seed]}`` from ``<out_dir>/<method>/seed*/summary.json``."""
    out: dict[str, list[dict[str, Any]]] = {}
    root = Path(out_dir)
    for p in sorted(root.glob("*/seed*/summary.json")):
        s = json.loads(p.read_text())
        out.setdefault(p.parent.parent.name, []).append(s)
    if not out:
        raise FileNotFoundError(f"{root}: no */seed*/summary.json (run `posttrain cit run` first)")
    cfg = root / "config.yaml"
    if cfg.exists():  # order methods as configured
        import yaml

        order = [m["name"] for m in (yaml.safe_load(cfg.read_text()) or {}).get("methods", [])]
        out = {m: out[m] for m in [*order, *sorted(set(out) - set(order))] if m in out}
    return out


def _ms(vals: list[float | None]) -> tuple[float | None, float | None]:
    v = [x for x in vals if x is not None]
    if not v:
        return None, None
    return float(np.mean(v)), float(np.std(v)) if len(v) > 1 else 0.0


def aggregate(summaries: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Mean and standard deviation over seeds of every scalar, plus the mean accuracy matrix."""
    res: dict[str, Any] = {}
    for m, runs in summaries.items():
        met = [r["metrics"] for r in runs]
        row: dict[str, Any] = {
            "seeds": [r["seed"] for r in runs],
            "tasks": runs[0]["tasks"],
            "heldout": runs[0]["heldout"],
        }
        for key, vals in (
            ("average_accuracy", [x["average_accuracy"] for x in met]),
            ("backward_transfer", [x["backward_transfer"] for x in met]),
            ("forward_transfer", [x["forward_transfer"] for x in met]),
            ("mean_forgetting", [x["mean_forgetting"] for x in met]),
            ("heldout_final", [r.get("heldout_final") for r in runs]),
            ("p_score", [r.get("p_score") for r in runs]),
            ("p_score_train_rules", [r.get("p_score_train_rules") for r in runs]),
            ("v_score", [r.get("v_score") for r in runs]),
            ("wall_s", [r.get("wall_s_stages") for r in runs]),
        ):
            mean, std = _ms(vals)
            row[key] = {"mean": mean, "std": std, "values": vals}
        row["acc_mean"] = np.mean([r["acc"] for r in runs], axis=0).tolist()
        row["heldout_acc_mean"] = np.mean([r["heldout_acc"] for r in runs], axis=0).tolist()
        row["acc_init_mean"] = np.mean([r["acc_init"] for r in runs], axis=0).tolist()
        res[m] = row
    return res


def _fmt(d: dict[str, Any], pct: bool = True) -> str:
    if d["mean"] is None:
        return "-"
    k = 100.0 if pct else 1.0
    s = f"{d['mean'] * k:.1f}"
    return s + (f" ± {d['std'] * k:.1f}" if d["std"] else "")


def table_rows(agg: dict[str, Any]) -> list[list[Any]]:
    return [
        [
            m,
            len(r["seeds"]),
            _fmt(r["average_accuracy"]),
            _fmt(r["backward_transfer"]),
            _fmt(r["forward_transfer"]),
            _fmt(r["mean_forgetting"]),
            _fmt(r["heldout_final"]),
            _fmt(r["p_score"]),
            _fmt(r["p_score_train_rules"]),
            _fmt(r["v_score"]),
            _fmt(r["wall_s"], pct=False),
        ]
        for m, r in agg.items()
    ]


def markdown(agg: dict[str, Any]) -> str:
    from posttrain.utils.tables import markdown_table

    parts = [
        "Accuracies in % (mean ± std over seeds). AA/BWT/FWT: Lopez-Paz & Ranzato 2017; forgetting: mean "
        "over tasks 1..T-1; held-out: final accuracy on held-out tasks; P/V: KPIG-style scores (P: held-out tasks "
        "rewritten with wordings no method trained on; P (train rules): with the training rewrites' "
        "wordings, which the kpig arm trained on).\n",
        markdown_table(COLUMNS, table_rows(agg)),
    ]
    for m, r in agg.items():
        cols = [*r["tasks"], *r["heldout"]]
        init = [*r["acc_init_mean"], *r["heldout_acc_mean"][0]]
        rows = [["init", *(100 * x for x in init)]]
        for i, t in enumerate(r["tasks"]):
            rows.append(
                [f"after {t}", *(100 * x for x in [*r["acc_mean"][i], *r["heldout_acc_mean"][i + 1]])]
            )
        parts += [
            f"\n**{m}** — accuracy (%) after each stage (rows) on each task (columns)\n\n",
            markdown_table(["stage", *cols], rows, floatfmt=".1f"),
        ]
    return "".join(parts)


def plot(agg: dict[str, Any], path: str | Path) -> Path:
    """Heatmap of the mean accuracy matrix per method (seen + held-out columns) and forgetting curves
    (accuracy on the first task and mean accuracy over seen tasks, per stage)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posttrain.utils.io import atomic_write_bytes

    n = len(agg)
    fig, axes = plt.subplots(1, n + 1, figsize=(3.2 * n + 4.2, 3.4))
    for ax, (m, r) in zip(axes[:n], agg.items(), strict=False):
        cols = [*r["tasks"], *r["heldout"]]
        mat = np.array([[*r["acc_mean"][i], *r["heldout_acc_mean"][i + 1]] for i in range(len(r["tasks"]))])
        ax.imshow(mat, vmin=0, vmax=1, cmap="viridis")
        for (i, j), v in np.ndenumerate(mat):
            ax.text(
                j, i, f"{100 * v:.0f}", ha="center", va="center", fontsize=7, color="w" if v < 0.6 else "k"
            )
        ax.set_xticks(range(len(cols)), cols, rotation=60, fontsize=7)
        ax.set_yticks(range(len(r["tasks"])), [f"after {t}" for t in r["tasks"]], fontsize=7)
        ax.set_title(m, fontsize=9)
    ax = axes[-1]
    for m, r in agg.items():
        a = np.array(r["acc_mean"])
        stages = np.arange(1, len(a) + 1)
        (line,) = ax.plot(
            stages, [a[i, : i + 1].mean() for i in range(len(a))], marker="o", label=f"{m} seen-mean"
        )
        ax.plot(stages, a[:, 0], ls="--", color=line.get_color(), alpha=0.7)
    ax.set_xlabel("stage (tasks trained)")
    ax.set_ylabel("accuracy (solid: mean over seen; dashed: task 1)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def write_report(out_dir: str | Path) -> dict[str, Any]:
    """``report.json``, ``report.md``, ``report.png`` in ``out_dir``; returns the aggregate."""
    from posttrain.utils.io import atomic_write_json, atomic_write_text

    root = Path(out_dir)
    agg = aggregate(load_summaries(root))
    atomic_write_json(root / "report.json", agg)
    atomic_write_text(root / "report.md", markdown(agg))
    plot(agg, root / "report.png")
    return agg
