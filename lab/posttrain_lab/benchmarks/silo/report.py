"""Reports over a sweep's results.jsonl: the paper's Table 1 layout, failure modes, plots, JSON.

Table 1 (arXiv 2603.01045 §4, Table 1): rows are slices — each protocol, each level, each N, and the average
over all cases — and each agent/model gets one cell ``SR / PCS / tokens-per-round / density`` where

* SR  = 100 x mean over cases of 1[S = 1]  (instance success rate),
* PCS = 100 x mean of P (partial correctness score),
* tokens/round = mean of ``C_paper`` (output tokens / R_max, the paper's definition, arXiv 2603.01045 §3.3),
* density = mean of ``D_paper`` (messages sent; SFS: successful reads of others' files, arXiv 2603.01045
  §3.3).

That is the ``default`` scoring mode's cell; in the ``paper`` mode (`posttrain_lab.benchmarks.silo.scoring`) a cell is
``SR / PCS / C_code / C_paper / D_code`` (C as the authors' code computes it beside the paper's formula, D
with m counted as their code does). Every table states the mode it was scored in; ``write_report(dir,
scoring=...)`` in a mode other than the sweep's rescores the saved cases (`rescore_rows`) without running
any agent, and `compare_scorings` puts SR and PCS of both modes side by side. The code variants are in the
JSON next to them. Averages are recomputed from the raw rows (the paper's printed Average row matches
neither the mean over levels nor over protocols).

Table 2 (arXiv 2603.01045 §4.1, Table 2), when the run has N = 1 oracle rows (``posttrain silo run
--oracle``): for each agent/model, level and k, ``SR(N=1) / SR(N=k) / RCC`` with RCC = 1 − SR(N=k) / SR(N=1)
(`metrics.relative_coordination_cost`), over PAIRED cases only: an oracle row (task, protocol, agent, seed,
oracle_of = k) and its N = k row must both be present, so both rates are over the same global inputs. RCC is
undefined (reported as such, never divided) when SR(N=1) = 0. Oracle rows are kept out of Table 1, the
failure modes, the per-task table and the plots, which describe the multi-agent runs.

Outputs of `write_report(dir)`: ``report.md``, ``report.json``, ``success_vs_n.png`` (SR vs N, one panel
per level, one line per agent x protocol) and ``heatmap_task_protocol.png`` (SR per task x protocol, one
panel per agent).
"""

from __future__ import annotations

import io
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError
from posttrain.utils.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from posttrain.utils.tables import markdown_table, print_table
from posttrain_lab.benchmarks.silo.metrics import relative_coordination_cost
from posttrain_lab.benchmarks.silo.scoring import DEFAULT_SCORING, Scoring, get_scoring, inputs_from_results

PROTO_ORDER = ("bp", "p2p", "sfs")
PROTO_LABEL = {"bp": "BP", "p2p": "P2P", "sfs": "SFS"}
LEVEL_LABEL = {1: "Level I", 2: "Level II", 3: "Level III"}


def _agg(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    k = len(rows)
    if k == 0:
        return {"cases": 0}

    def mean(key: str) -> float:
        return sum(float(r[key]) for r in rows) / k

    return {
        "cases": k,
        "SR": 100.0 * sum(bool(r["success"]) for r in rows) / k,
        "PCS": 100.0 * mean("P"),
        "C_paper": mean("C_paper"),
        "C_code": mean("C_code"),
        "D_paper": mean("D_paper"),
        "D_code": mean("D_code"),
        "rounds": mean("rounds"),
    }


def slices(rows: Sequence[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(label, rows) for every Table-1 slice present in `rows`, in the paper's order."""
    out = []
    for p in PROTO_ORDER:
        sel = [r for r in rows if r["protocol"] == p]
        if sel:
            out.append((PROTO_LABEL[p], sel))
    for lv in (1, 2, 3):
        sel = [r for r in rows if int(r["level"]) == lv]
        if sel:
            out.append((LEVEL_LABEL[lv], sel))
    for n in sorted({int(r["num_agents"]) for r in rows}):
        out.append((f"N={n}", [r for r in rows if int(r["num_agents"]) == n]))
    out.append(("Average", list(rows)))
    return out


def table1(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """{agent: {slice: aggregate}}."""
    agents = sorted({r["agent"] for r in rows})
    return {
        a: {label: _agg([r for r in sel if r["agent"] == a]) for label, sel in slices(rows)} for a in agents
    }


def failure_summary(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per agent: counts and shares of success and each failure mode (paper Table 4), co-occurrences."""
    out: dict[str, dict[str, Any]] = {}
    modes = ("premature_submission", "consensus_failure", "computation_error")
    for a in sorted({r["agent"] for r in rows}):
        sel = [r for r in rows if r["agent"] == a]
        k = len(sel)
        d: dict[str, Any] = {"cases": k, "success": sum(bool(r["success"]) for r in sel)}
        for m in modes:
            d[m] = sum(bool(r[m]) for r in sel)
        # failed cases none of the three modes explains (e.g. a wrong answer after full exchange)
        d["other_failure"] = sum(not r["success"] and not any(bool(r[m]) for m in modes) for r in sel)
        d["share"] = {m: (d[m] / k if k else 0.0) for m in ("success", *modes, "other_failure")}
        d["co_occurrence"] = {
            f"{m1}&{m2}": sum(bool(r[m1]) and bool(r[m2]) for r in sel)
            for i, m1 in enumerate(modes)
            for m2 in modes[i + 1 :]
        }
        d["cases_with_emergent_leader"] = sum(int(r.get("emergent_leaders", 0)) > 0 for r in sel)
        out[a] = d
    return out


def per_task(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """{agent: {task_id: {protocol: SR}}} (paper Table 10 layout)."""
    acc: dict[str, dict[str, dict[str, list[bool]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for r in rows:
        acc[r["agent"]][r["task_id"]][r["protocol"]].append(bool(r["success"]))
    return {
        a: {
            t: {p: 100.0 * sum(v) / len(v) for p, v in by_p.items()}
            for t, by_p in sorted(by_t.items(), key=_task_sort)
        }
        for a, by_t in acc.items()
    }


def _task_sort(item: tuple[str, Any]) -> tuple[int, int]:
    roman, _, num = item[0].partition("-")
    return (len(roman), int(num) if num.isdigit() else 0)


def _cell(agg: dict[str, float], scoring: Scoring) -> str:
    if not agg.get("cases"):
        return "-"
    c = " / ".join(f"{agg[k]:.1f}" for k in scoring.c_columns)
    return f"{agg['SR']:.1f} / {agg['PCS']:.1f} / {c} / {agg[scoring.d_column]:.2f}"


def cell_legend(scoring: Scoring) -> str:
    """What a Table 1 cell holds in this scoring mode, e.g. ``SR / PCS / C_paper / D_paper``."""
    return " / ".join(("SR", "PCS", *scoring.c_columns, scoring.d_column))


def table1_rows(
    t1: dict[str, dict[str, dict[str, float]]],
    rows: Sequence[dict[str, Any]],
    scoring: Scoring | None = None,
) -> tuple[list[str], list[list[str]]]:
    scoring = scoring or get_scoring(DEFAULT_SCORING)
    agents = list(t1)
    columns = ["Slice", *[f"{a} ({cell_legend(scoring)})" for a in agents], "cases"]
    body = []
    for label, sel in slices(rows):
        body.append([label, *[_cell(t1[a][label], scoring) for a in agents], str(len(sel))])
    return columns, body


def is_oracle(row: dict[str, Any]) -> bool:
    """An N = 1 oracle row (`posttrain_lab.benchmarks.silo.oracle`); rows written before the oracle existed lack the key."""
    return row.get("oracle_of") is not None


def _pair_key(row: dict[str, Any], k: int) -> tuple:
    return (row["task_id"], row["protocol"], row["agent"], int(row["seed"]), k)


RCC_UNDEFINED = "undefined (SR(N=1) = 0)"


def table2(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """{agent: {"Level I" | "Level II" | "Level III" | "All": {"k": cell}}} with cell = ``{SR_1, SR_k,
    RCC, RCC_pct, pairs}``: SR in percent over the paired cases, RCC a fraction (None when undefined,
    with ``RCC_note``). Pairs: oracle row of N = k matched with the N = k row of the same task, protocol,
    agent and seed. Empty when the rows hold no oracle."""
    multi = {_pair_key(r, int(r["num_agents"])): r for r in rows if not is_oracle(r)}
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for r in rows:
        if is_oracle(r):
            partner = multi.get(_pair_key(r, int(r["oracle_of"])))
            if partner is not None:
                pairs.append((r, partner))
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for a in sorted({o["agent"] for o, _ in pairs}):
        mine = [(o, m) for o, m in pairs if o["agent"] == a]
        groups = [(LEVEL_LABEL[lv], [p for p in mine if int(p[0]["level"]) == lv]) for lv in (1, 2, 3)]
        groups.append(("All", mine))
        out[a] = {}
        for label, sel in groups:
            if not sel:
                continue
            cells: dict[str, dict[str, Any]] = {}
            for k in sorted({int(o["oracle_of"]) for o, _ in sel}):
                ps = [(o, m) for o, m in sel if int(o["oracle_of"]) == k]
                sr1 = 100.0 * sum(bool(o["success"]) for o, _ in ps) / len(ps)
                srk = 100.0 * sum(bool(m["success"]) for _, m in ps) / len(ps)
                rcc = relative_coordination_cost(srk, sr1)
                cell: dict[str, Any] = {"SR_1": sr1, "SR_k": srk, "pairs": len(ps)}
                if math.isnan(rcc):  # SR(N=1) = 0
                    cell.update(RCC=None, RCC_pct=None, RCC_note=RCC_UNDEFINED)
                else:
                    cell.update(RCC=rcc, RCC_pct=100.0 * rcc)
                cells[str(k)] = cell
            out[a][label] = cells
    return out


def _cell2(cell: dict[str, Any] | None) -> str:
    if not cell:
        return "-"
    rcc = "undefined" if cell["RCC"] is None else f"{cell['RCC_pct']:.1f}%"
    return f"{cell['SR_1']:.1f} / {cell['SR_k']:.1f} / {rcc}"


def table2_rows(t2: dict[str, dict[str, dict[str, dict[str, Any]]]]) -> tuple[list[str], list[list[str]]]:
    """Paper Table 2 layout: one row per (agent, k), one column per level (+ all levels)."""
    labels = [*LEVEL_LABEL.values(), "All"]
    present = [lb for lb in labels if any(lb in t2[a] for a in t2)]
    columns = ["agent", "k", *present, "pairs"]
    body = []
    for a, by_level in t2.items():
        ks = sorted({int(k) for cells in by_level.values() for k in cells})
        for k in ks:
            cells = [by_level.get(lb, {}).get(str(k)) for lb in present]
            n_pairs = by_level.get("All", {}).get(str(k), {}).get("pairs", 0)
            body.append([a, str(k), *[_cell2(c) for c in cells], str(n_pairs)])
    return columns, body


def _save_png(fig: Any, path: Path) -> None:
    """Render to memory, then write atomically (a killed report never leaves a torn PNG); closes `fig`."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")  # tight: labels (colorbar's) not clipped
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def plot_success_vs_n(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted({int(r["level"]) for r in rows})
    fig, axes = plt.subplots(1, len(levels), figsize=(5 * len(levels), 4), squeeze=False)
    for ax, lv in zip(axes[0], levels, strict=True):
        sel = [r for r in rows if int(r["level"]) == lv]
        for a in sorted({r["agent"] for r in sel}):
            for p in PROTO_ORDER:
                pts = [r for r in sel if r["agent"] == a and r["protocol"] == p]
                if not pts:
                    continue
                ns = sorted({int(r["num_agents"]) for r in pts})
                sr = [_agg([r for r in pts if int(r["num_agents"]) == n])["SR"] for n in ns]
                ax.plot(ns, sr, marker="o", label=f"{a} {PROTO_LABEL[p]}")
        ax.set_xscale("log")
        ax.set_xlabel("N agents")
        ax.set_ylabel("success rate (%)")
        ax.set_ylim(-5, 105)
        ax.set_title(LEVEL_LABEL[lv])
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save_png(fig, path)


def plot_heatmap(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pt = per_task(rows)
    agents = sorted(pt)
    tasks = sorted({r["task_id"] for r in rows}, key=lambda t: _task_sort((t, None)))
    protos = [p for p in PROTO_ORDER if any(r["protocol"] == p for r in rows)]
    fig, axes = plt.subplots(
        1, len(agents), figsize=(2 + 2.2 * len(agents), 0.3 * len(tasks) + 1.5), squeeze=False
    )
    for ax, a in zip(axes[0], agents, strict=True):
        grid = [[pt[a].get(t, {}).get(p, float("nan")) for p in protos] for t in tasks]
        im = ax.imshow(grid, vmin=0, vmax=100, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(protos)), [PROTO_LABEL[p] for p in protos])
        ax.set_yticks(range(len(tasks)), tasks, fontsize=7)
        ax.set_title(a, fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), label="SR (%)")
    _save_png(fig, path)


def rows_scoring(rows: Sequence[dict[str, Any]], where: Path) -> str:
    """The one scoring mode the rows were written with (rows from before scoring modes: default)."""
    from posttrain_lab.benchmarks.silo.runner import row_scoring

    modes = sorted({row_scoring(r) for r in rows})
    if len(modes) != 1:
        raise InvalidValueError(f"{where} mixes scoring modes {modes}; rescore it with --scoring NAME")
    return modes[0]


def rescore_rows(run_dir: Path, rows: Sequence[dict[str, Any]], scoring: Scoring) -> list[dict[str, Any]]:
    """The rows scored again in mode `scoring` from each case's saved ``results.json`` and
    ``transcript.jsonl`` (no agent is run): S, P, success, C, D and the failure modes, which depend on
    which answers count as correct. Needs the per-case files (`posttrain silo run` without
    ``--no-save-cases``)."""
    from posttrain.utils.io import read_jsonl
    from posttrain_lab.benchmarks.silo.failures import analyze_failures
    from posttrain_lab.benchmarks.silo.runner import case_dir_name

    out = []
    for row in rows:
        d = run_dir / case_dir_name(row)
        res_path = d / "results.json"
        if not res_path.exists():
            raise FileNotFoundError(
                f"{res_path} does not exist: rescoring needs every case's results.json and transcript.jsonl "
                f"(the sweep was run with --no-save-cases, or the folder was moved)"
            )
        try:
            doc = json.loads(res_path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise InvalidValueError(f"{res_path}: invalid JSON ({e})") from None
        inp = inputs_from_results(doc, str(res_path))
        met = scoring.score(inp)
        correct = scoring.correct_list(inp)
        tpath = d / "transcript.jsonl"
        if not tpath.exists():
            raise FileNotFoundError(f"{tpath} does not exist (needed to recompute the failure modes)")
        fm = analyze_failures(
            read_jsonl(tpath),
            protocol=str(doc["protocol"]),
            task_id=inp.task_id,
            num_agents=inp.num_agents,
            answers=list(inp.answers),
            submit_rounds=[s.get("round") for s in doc["submissions"]],
            correct=correct,
        )
        new = dict(row)
        new.update(
            S=met["S_success_rate"],
            P=met["P_partial_correctness"],
            C_code=met["C_code"],
            C_paper=met["C_paper"],
            D_code=met["D_code"],
            D_paper=met["D_paper"],
            success=met["S_success_rate"] == 1.0,
            scoring=scoring.name,
            premature_submission=fm["premature_submission"],
            consensus_failure=fm["consensus_failure"],
            computation_error=fm["computation_error"],
        )
        out.append(new)
    return out


def load_scored_rows(
    run_dir: str | Path, scoring: str | None = None
) -> tuple[list[dict[str, Any]], str, bool]:
    """``(rows, mode, rescored)``: the run's rows in mode `scoring` (default: the mode they were run
    with), rescored from the saved cases when that mode differs from the stored one."""
    from posttrain_lab.benchmarks.silo.runner import load_rows

    run_dir = Path(run_dir)
    path = run_dir / "results.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (run `posttrain silo run --out {run_dir}` first)")
    rows = load_rows(path)
    if not rows:
        raise InvalidValueError(f"{path} has no finished cases")
    stored = rows_scoring(rows, path)
    mode = get_scoring(scoring).name if scoring is not None else stored
    if mode == stored:
        return rows, mode, False
    return rescore_rows(run_dir, rows, get_scoring(mode)), mode, True


def write_report(
    run_dir: str | Path, *, show: bool = True, plots: bool = True, scoring: str | None = None
) -> dict[str, Any]:
    """Build every report artefact from ``run_dir/results.jsonl``; returns the JSON summary.

    `scoring`: the mode to report in (`posttrain_lab.benchmarks.silo.scoring.SCORINGS`); default the mode the sweep
    was run with. In another mode the sweep is rescored from its saved cases, and the artefacts get the
    mode in their names (``report.paper.md``, ``report.paper.json``, ``success_vs_n.paper.png``, ...)
    so the sweep's own report is kept."""
    run_dir = Path(run_dir)
    path = run_dir / "results.jsonl"
    all_rows, mode, rescored = load_scored_rows(run_dir, scoring)
    sc = get_scoring(mode)
    suffix = f".{mode}" if rescored else ""
    rows = [r for r in all_rows if not is_oracle(r)]
    if not rows:
        raise InvalidValueError(
            f"{path} holds only N = 1 oracle rows; Table 1 and Table 2 need the N = k runs too"
        )
    t2 = table2(all_rows)
    t1 = table1(rows)
    fails = failure_summary(rows)
    columns, body = table1_rows(t1, rows, sc)
    fcols = [
        "agent",
        "cases",
        "success",
        "premature",
        "consensus",
        "computation",
        "other failure",
        "with leader",
    ]
    frows = [
        [
            a,
            d["cases"],
            d["success"],
            d["premature_submission"],
            d["consensus_failure"],
            d["computation_error"],
            d["other_failure"],
            d["cases_with_emergent_leader"],
        ]
        for a, d in fails.items()
    ]
    t2cols, t2body = table2_rows(t2)
    n_oracle = len(all_rows) - len(rows)
    how = f"scoring: {mode}" + (" (rescored from the saved cases)" if rescored else "")
    if show:
        print_table(f"SILO-BENCH (paper Table 1 layout; {how})", columns, body)
        print_table(f"Failure modes (paper Table 4; {how})", fcols, frows)
        if t2body:
            print_table(
                f"N = 1 oracle vs N = k (paper Table 2; {how}): SR(N=1) / SR(N=k) / RCC", t2cols, t2body
            )
    summary = {
        "scoring": mode,
        "scoring_description": sc.description,
        "rescored": rescored,
        "table1": t1,
        "failure_modes": fails,
        "per_task": per_task(rows),
        "cases": len(rows),
        "oracle_cases": n_oracle,
        "table2": t2,
    }
    md = [
        f"# SILO-BENCH report ({how})\n",
        f"Scoring mode `{mode}`: {sc.description}.\n",
        f"{len(rows)} cases from `{path}`. Cells: {cell_legend(sc)}.\n",
        f"## Table 1 layout (scoring: {mode})\n",
        markdown_table(columns, body),
        f"\n## Failure modes (scoring: {mode})\n",
        markdown_table(fcols, frows),
    ]
    if t2body:
        md += [
            f"\n## N = 1 oracle vs N = k (paper Table 2; scoring: {mode})\n",
            "Cells: SR(N=1) / SR(N=k) / RCC, RCC = 1 − SR(N=k) / SR(N=1) (arXiv 2603.01045 §4.1), over paired "
            "cases (the oracle of an N = k case and that case: same task, protocol, agent, seed). RCC is "
            f"{RCC_UNDEFINED.split(' (')[0]} where SR(N=1) = 0.\n",
            markdown_table(t2cols, t2body),
        ]
    elif n_oracle:
        md.append(f"\n{n_oracle} oracle rows have no paired N = k row; no Table 2.\n")
    if plots:
        sv, hm = f"success_vs_n{suffix}.png", f"heatmap_task_protocol{suffix}.png"
        plot_success_vs_n(rows, run_dir / sv)
        plot_heatmap(rows, run_dir / hm)
        md.append(f"\n![success vs N]({sv})\n\n![task x protocol]({hm})\n")
    atomic_write_text(run_dir / f"report{suffix}.md", "\n".join(md))
    atomic_write_json(run_dir / f"report{suffix}.json", summary)
    return summary


def compare_scorings(
    run_dir: str | Path, modes: Sequence[str] = ("default", "paper")
) -> tuple[list[str], list[list[str]]]:
    """Side-by-side Table 1 slices of one sweep scored in each of `modes` (rescored from the saved cases
    where needed): per agent and slice, ``SR`` and ``PCS`` in every mode, then the cases."""
    scored = {m: load_scored_rows(run_dir, m)[0] for m in modes}
    tables = {m: table1([r for r in rows if not is_oracle(r)]) for m, rows in scored.items()}
    base = [r for r in scored[modes[0]] if not is_oracle(r)]
    columns = ["agent", "slice", *[f"SR ({m})" for m in modes], *[f"PCS ({m})" for m in modes], "cases"]
    body = []
    for a in sorted({r["agent"] for r in base}):
        for label, _sel in slices(base):
            cells = [tables[m][a][label] for m in modes]
            if not cells[0].get("cases"):
                continue
            body.append(
                [
                    a,
                    label,
                    *[f"{c['SR']:.1f}" for c in cells],
                    *[f"{c['PCS']:.1f}" for c in cells],
                    str(cells[0]["cases"]),
                ]
            )
    return columns, body
