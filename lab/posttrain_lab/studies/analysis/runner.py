"""The three analyses as runnable workflows with typed configs and reports (JSON, Markdown, PNG):

- :func:`run_consistency`: probe a base and a tuned model on the same MCQs (base: few-shot, no
  template; tuned: 0-shot, Vicuna or chat template) → accuracies, rank consistency (× 100), KL, cosine;
- :func:`run_intervention`: build the knowledge-intervention groups from the base model's probe
  results, instruction-tune the base model on each group with the SFT trainer, probe each tuned model →
  tuned accuracy and consistency per group, and the Spearman partial correlation across the
  wrong-item groups (Ren et al. 2024, arXiv 2402.18243);
- :func:`run_forgetting`: the restoration protocol (proposed design; :mod:`posttrain_lab.studies.analysis.forgetting`)
  along one IFT run of the SFT trainer, with the restored base model as control.

Each one runs on user data (model directories, MCQ / SFT JSONL files) or, with ``synthetic`` set, on
the built-in synthetic setting (:mod:`posttrain_lab.studies.analysis.synthetic`; its base model is pre-trained
once and cached in ``synthetic_dir``).
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from posttrain.utils.config import StrictModel
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.studies.analysis.synthetic import SyntheticConfig


# ----------------------------------------------------------------------------------------- configs
class SourceConfig(StrictModel):
    """Where the base model and the probes come from: ``synthetic`` or files."""

    synthetic: SyntheticConfig | None = None
    """Use the built-in synthetic setting (its fields; ``synthetic: {}`` takes the defaults)."""
    synthetic_dir: str | None = None
    """Where the synthetic base model is pre-trained and cached (default ``<out_dir>/base``)."""
    base: str | None = None
    """Base model: a preset, a Hugging Face model directory or a run folder (not with ``synthetic``)."""
    probes: str | None = None
    """JSONL of MCQs ``{"question", "choices", "answer", "id"?}``: the probe (test) set."""
    dev: str | None = None
    """JSONL of MCQs: the few-shot examples of the base-model prompt (the first ``shots`` after the
    ``dev_seed`` shuffle)."""
    domain: str = "general knowledge"
    shots: int = Field(3, ge=0)
    """Few-shot examples in base-model prompts (the authors' default 3; their analysis files use 5)."""
    dev_seed: int | None = 42
    """The dev set is shuffled with Python's ``random.seed(dev_seed)`` before the first ``shots`` are
    taken, as the authors' ``my_domain_eval.py`` (42); ``null`` keeps the file order."""
    batch_size: int = Field(32, ge=1)
    """Prompts per forward when probing."""
    seed: int = 0
    threads: int | None = Field(None, ge=1)
    out_dir: str = "runs/analysis"
    progress: bool | None = None

    @model_validator(mode="after")
    def _source(self) -> SourceConfig:
        if self.synthetic is None and (self.base is None or self.probes is None):
            raise InvalidValueError(
                "set `synthetic` (the built-in setting, e.g. synthetic={}) or both `base` and `probes`"
            )
        if self.synthetic is None and self.shots and self.dev is None:
            raise InvalidValueError(f"shots={self.shots} needs `dev` (a JSONL of solved MCQs) or shots=0")
        return self


class TrainConfig(StrictModel):
    """An SFT budget (instruction tuning or restoration) run by :class:`posttrain.train.sft.SFTTrainer`."""

    steps: int = Field(60, ge=1)
    batch_size: int = Field(8, ge=1)
    lr: float = Field(1e-3, gt=0)
    schedule: Literal["constant", "cosine"] = "constant"


class ConsistencyConfig(SourceConfig):
    tuned: str | None = None
    """Tuned model (preset, model directory or run folder); with ``synthetic`` and no ``tuned``, the
    synthetic base model is tuned on the consistent-correct group (``ift``)."""
    tuned_style: Literal["vicuna", "chat"] = "vicuna"
    """Prompt of the tuned model: the authors' Vicuna template, or the tokenizer's chat template."""
    ties: Literal["dense", "average"] = "dense"
    ift: TrainConfig = TrainConfig()


class InterventionConfig(SourceConfig):
    pool: str | None = None
    """JSONL of MCQs the groups are built from (the authors' train split); required without synthetic."""
    groups: list[str] | None = None
    """Group names (default: all, posttrain_lab.studies.analysis.intervention.group_names(ratios))."""
    ratios: list[float] = Field(default_factory=lambda: [0.05, 0.1, 0.2, 0.4, 0.6, 0.8])
    group_size: int | None = Field(None, ge=1)
    explain: Literal["template", "model"] = "template"
    explain_template: str | None = None
    """Template explanation (fields {question}, {answer}, {letter} and the MCQ's meta keys); default
    'The answer is "{answer}".', or '{subject} lives in {answer}.' in the synthetic setting."""
    tuned_style: Literal["vicuna", "chat"] = "chat"
    """Chat rows are trained with the tokenizer's chat template, so the tuned probe uses it too."""
    ties: Literal["dense", "average"] = "dense"
    ift: TrainConfig = TrainConfig()

    @model_validator(mode="after")
    def _pool(self) -> InterventionConfig:
        if self.synthetic is None and self.pool is None:
            raise InvalidValueError(
                "set `pool` (a JSONL of MCQs the groups are built from) or use `synthetic`"
            )
        return self


class ForgettingConfig(SourceConfig):
    ift_data: str | None = None
    """SFT JSONL (chat rows or prompt/completion) of the instruction-tuning run; synthetic: generated."""
    ift_run: str | None = None
    """An existing SFT or RL run folder: restore its saved checkpoints (``checkpoints/step_*``; all of
    them, or those in ``checkpoints``) instead of running IFT here."""
    ift_rows: int = Field(400, ge=1)
    """Synthetic instruction rows to generate."""
    restore_data: str | None = None
    """JSONL of ``{"text": ...}`` rows: the pre-training-like restoration text; synthetic: generated."""
    ift: TrainConfig = TrainConfig(steps=300, lr=3e-3)
    checkpoints: list[int] | None = None
    """IFT steps to save and restore (default: ``n_checkpoints`` log-spaced steps up to ift.steps)."""
    n_checkpoints: int = Field(5, ge=1)
    restore: TrainConfig = TrainConfig(steps=40, lr=1e-3)
    """Restoration budget, the same for every checkpoint and the control (proposed design)."""
    restore_lrs: list[float] = Field(default_factory=list)
    """Further restoration learning rates: the control and every checkpoint are restored again with
    each (same budget otherwise) and the transition steps per learning rate are reported next to the
    verdict, since the verdict moves with it."""
    control_seeds: int = Field(2, ge=1)
    """Restorations of the base model (data-order seeds seed, seed+1, ...): control score and ε."""
    eps_floor: float = Field(1.0, ge=0)
    """ε = max(eps_floor, 2 × std of the control's scores) in accuracy points (proposed design)."""

    @model_validator(mode="after")
    def _data(self) -> ForgettingConfig:
        if self.synthetic is None and (
            (self.ift_data is None and self.ift_run is None) or self.restore_data is None
        ):
            raise InvalidValueError(
                "set `ift_data` (or `ift_run`) and `restore_data` (JSONL files) or use `synthetic`"
            )
        if self.checkpoints is not None and self.ift_run is None:
            bad = [s for s in self.checkpoints if not 1 <= s <= self.ift.steps]
            if bad:
                raise InvalidValueError(f"checkpoints {bad} outside 1..ift.steps={self.ift.steps}")
        return self


# ------------------------------------------------------------------------------------------ shared
class _Setting:
    """Resolved base model, probes, dev examples and domain of a config."""

    def __init__(self, cfg: SourceConfig) -> None:
        import torch

        from posttrain_lab.studies.analysis.probe import load_mcqs

        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.cfg = cfg
        self.world = None
        if cfg.synthetic is not None:
            from posttrain_lab.studies.analysis.synthetic import build_world, pretrain_base

            self.world = build_world(cfg.synthetic)
            sdir = cfg.synthetic_dir or str(Path(cfg.out_dir) / "base")
            self.base = pretrain_base(self.world, sdir, threads=cfg.threads, progress=cfg.progress)
            self.probes = self.world.mcqs("test")
            self.dev = self.world.dev
            self.domain = cfg.synthetic.domain
            self.shots = cfg.synthetic.shots
        else:
            self.base = cfg.base
            self.probes = load_mcqs(cfg.probes)
            self.dev = load_mcqs(cfg.dev) if cfg.dev else []
            self.domain = cfg.domain
            self.shots = cfg.shots

    def load(self, spec: str) -> tuple[Any, Any]:
        from posttrain.models import load_model_and_tokenizer

        return load_model_and_tokenizer(spec, device="cpu", seed=self.cfg.seed)

    def probe(self, model: Any, tok: Any, questions: list | None = None, *, style: str = "base") -> Any:
        from posttrain_lab.studies.analysis.probe import probe

        qs = self.probes if questions is None else questions
        shots = self.shots if style == "base" else 0
        return probe(
            model,
            tok,
            qs,
            domain=self.domain,
            style=style,
            dev=self.dev,
            shots=shots,
            batch_size=self.cfg.batch_size,
            dev_seed=self.cfg.dev_seed,
        )


def _sft(
    model: Any,
    tok: Any,
    rows: list[dict],
    tc: TrainConfig,
    *,
    seed: int,
    threads: int | None,
    out_dir: str | None = None,
) -> Any:
    """An SFT trainer over in-memory rows (not yet trained); writes nothing unless ``out_dir``."""
    from posttrain.train.sft import SFTConfig, SFTTrainer

    cfg = SFTConfig(
        model={"name": "tiny", "device": "cpu"},
        steps=tc.steps,
        batch_size=tc.batch_size,
        optimizer={"lr": tc.lr, "schedule": tc.schedule},
        seed=seed,
        threads=threads,
        out_dir=out_dir or "runs/unused",
        save=out_dir is not None,
        checkpoint={"every": 0, "final": False, "keep": 1000},
        progress=False,
        eval={"at_end": False},
    )
    return SFTTrainer(cfg, model, tok, rows=rows)


def _write_reports(
    out_dir: str, name: str, results: dict[str, Any], markdown: str, png: bytes | None
) -> dict[str, str]:
    from posttrain.utils.io import atomic_write_bytes, atomic_write_json, atomic_write_text

    out = Path(out_dir)
    paths = {"json": str(atomic_write_json(out / f"{name}.json", results))}
    paths["markdown"] = str(atomic_write_text(out / f"{name}.md", markdown))
    if png is not None:
        paths["png"] = str(atomic_write_bytes(out / f"{name}.png", png))
    return paths


def _png(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _consistency(p_base: Any, p_ft: Any, ties: str) -> dict[str, float]:
    from posttrain_lab.studies.analysis.metrics import cosine_consistency, kl_consistency, rank_consistency

    return {
        "consistency": 100.0 * rank_consistency(p_base.probs, p_ft.probs, ties=ties),
        "kl": kl_consistency(p_base.probs, p_ft.probs),
        "cosine": cosine_consistency(p_base.probs, p_ft.probs),
    }


# ------------------------------------------------------------------------------------- consistency
def run_consistency(cfg: ConsistencyConfig) -> dict[str, Any]:
    """Base vs tuned model on the probe set: accuracies, rank consistency × 100, KL, cosine."""
    from posttrain.utils.tables import markdown_table
    from posttrain_lab.studies.analysis.intervention import (
        CORRECT,
        build_groups,
        chat_row,
        template_explainer,
    )

    t0 = time.perf_counter()
    st = _Setting(cfg)
    base_m, base_t = st.load(st.base)
    pb = st.probe(base_m, base_t, style="base")
    if cfg.tuned is not None:
        tuned_m, tuned_t = st.load(cfg.tuned)
        tuned_name = cfg.tuned
    else:
        if st.world is None:
            raise InvalidValueError("set `tuned` (the fine-tuned model)")
        pool = st.world.mcqs("pool")
        groups = build_groups(
            pool,
            st.probe(base_m, base_t, pool),
            groups=[CORRECT],
            explain=lambda reqs: [template_explainer("{subject} lives in {answer}.")(q, t) for q, t in reqs],
        )
        rows = [chat_row(it, st.domain) for it in groups[CORRECT]]
        tr = _sft(base_m, base_t, rows, cfg.ift, seed=cfg.seed, threads=cfg.threads)
        tr.train()
        tuned_m, tuned_t, tuned_name = (
            tr.model,
            tr.tokenizer,
            f"base tuned on {CORRECT} ({cfg.ift.steps} steps)",
        )
    pf = st.probe(tuned_m, tuned_t, style=cfg.tuned_style)
    res = {
        "base": st.base,
        "tuned": tuned_name,
        "n_questions": len(st.probes),
        "base_accuracy": pb.accuracy,
        "tuned_accuracy": pf.accuracy,
        **_consistency(pb, pf, cfg.ties),
        "tuned_style": cfg.tuned_style,
        "shots": st.shots,
        "wall_s": time.perf_counter() - t0,
        "probes_base": pb.to_json(),
        "probes_tuned": pf.to_json(),
    }
    cols = ["questions", "base acc", "tuned acc", "consistency (x100)", "KL (nats)", "cosine"]
    row = [len(st.probes), pb.accuracy, pf.accuracy, res["consistency"], res["kl"], res["cosine"]]
    md = "# Knowledge consistency\n\n" + markdown_table(cols, [row], floatfmt=".2f")
    res["table"] = {"columns": cols, "rows": [row]}
    res["files"] = _write_reports(cfg.out_dir, "consistency", res, md, None)
    return res


# ------------------------------------------------------------------------------------ intervention
def run_intervention(cfg: InterventionConfig) -> dict[str, Any]:
    """Groups → IFT per group → tuned accuracy, consistency; partial correlation across groups."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posttrain.utils.io import atomic_write_text
    from posttrain.utils.progress import progress_bar
    from posttrain.utils.tables import markdown_table
    from posttrain_lab.studies.analysis.intervention import (
        CORRECT,
        build_groups,
        chat_row,
        group_names,
        group_ratio,
        group_row_json,
        model_explanations,
        template_explainer,
    )
    from posttrain_lab.studies.analysis.metrics import spearman_partial_correlation
    from posttrain_lab.studies.analysis.probe import load_mcqs

    t0 = time.perf_counter()
    st = _Setting(cfg)
    pool = st.world.mcqs("pool") if st.world is not None else load_mcqs(cfg.pool)
    base_m, base_t = st.load(st.base)
    p_pool = st.probe(base_m, base_t, pool)
    p_test = st.probe(base_m, base_t)
    template = cfg.explain_template or ("{subject} lives in {answer}." if st.world is not None else None)
    if cfg.explain == "model":

        def explain(reqs):
            return model_explanations(base_m, base_t, reqs, domain=st.domain, seed=cfg.seed)
    else:
        tmpl = template_explainer(template) if template else template_explainer()

        def explain(reqs):
            return [tmpl(q, t) for q, t in reqs]

    names = cfg.groups or group_names(cfg.ratios)
    groups = build_groups(
        pool, p_pool, groups=names, ratios=cfg.ratios, size=cfg.group_size, seed=cfg.seed, explain=explain
    )
    out = Path(cfg.out_dir)
    for n, items in groups.items():
        atomic_write_text(
            out / "groups" / f"{n}.jsonl",
            "".join(json.dumps(group_row_json(it, st.domain)) + "\n" for it in items),
        )
    rows_out = []
    with progress_bar("groups", total=len(groups), enabled=cfg.progress, log_every=1) as bar:
        for n, items in groups.items():
            m, t = st.load(st.base)
            tr = _sft(
                m, t, [chat_row(it, st.domain) for it in items], cfg.ift, seed=cfg.seed, threads=cfg.threads
            )
            summary = tr.train()
            pf = st.probe(tr.model, tr.tokenizer, style=cfg.tuned_style)
            rows_out.append(
                {
                    "group": n,
                    "ratio": group_ratio(n),
                    "n_items": len(items),
                    "own_prediction_items": sum(it.own_prediction for it in items),
                    "tuned_accuracy": pf.accuracy,
                    **_consistency(p_test, pf, cfg.ties),
                    "final_loss": summary["last"].get("loss"),
                }
            )
            bar.advance(group=n)
    wrong = [r for r in rows_out if r["group"] != CORRECT]
    partial = None
    if len(wrong) >= 3:
        rho, p = spearman_partial_correlation(
            [r["consistency"] for r in wrong],
            [r["tuned_accuracy"] for r in wrong],
            [p_test.accuracy] * len(wrong),
        )
        partial = {
            "rho": rho,
            "p_value": p,
            "n_groups": len(wrong),
            "x": "consistency x100",
            "y": "tuned accuracy",
            "z": "base accuracy",
        }
    cols = ["group", "items", "own-pred items", "tuned acc", "consistency (x100)", "KL", "cosine"]
    table = [
        [
            r["group"],
            r["n_items"],
            r["own_prediction_items"],
            r["tuned_accuracy"],
            r["consistency"],
            r["kl"],
            r["cosine"],
        ]
        for r in rows_out
    ]
    md = (
        f"# Knowledge intervention\n\nbase accuracy (few-shot, {st.shots}-shot) on {len(st.probes)} probe questions: "
        f"{p_test.accuracy:.2f}; pool: {len(pool)} questions, base accuracy {p_pool.accuracy:.2f}\n\n"
        + markdown_table(cols, table, floatfmt=".2f")
    )
    if partial:
        md += (
            f"\nSpearman partial correlation (consistency vs tuned accuracy | base accuracy) over "
            f"{partial['n_groups']} wrong-item groups: rho = {partial['rho']:.3f}, p = {partial['p_value']:.3g}\n"
        )
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for r in rows_out:
        ax.scatter(r["consistency"], r["tuned_accuracy"], color="C1" if r["group"] == CORRECT else "C0")
        label = "correct" if r["group"] == CORRECT else f"r={r['ratio']:g}"
        ax.annotate(
            label,
            (r["consistency"], r["tuned_accuracy"]),
            fontsize=8,
            xytext=(3, 3),
            textcoords="offset points",
        )
    ax.axhline(p_test.accuracy, color="gray", ls="--", lw=1, label="base accuracy")
    ax.set_xlabel("rank consistency with the base model (x100)")
    ax.set_ylabel("tuned accuracy (%)")
    ax.set_title("knowledge-intervention groups")
    ax.legend(fontsize=8)
    res = {
        "base": st.base,
        "n_questions": len(st.probes),
        "n_pool": len(pool),
        "base_accuracy": p_test.accuracy,
        "base_pool_accuracy": p_pool.accuracy,
        "groups": rows_out,
        "partial_correlation": partial,
        "ift": cfg.ift.model_dump(),
        "tuned_style": cfg.tuned_style,
        "wall_s": time.perf_counter() - t0,
        "table": {"columns": cols, "rows": table},
    }
    res["files"] = _write_reports(cfg.out_dir, "intervention", res, md, _png(fig))
    return res


# -------------------------------------------------------------------------------------- forgetting
def run_forgetting(cfg: ForgettingConfig) -> dict[str, Any]:
    """The restoration protocol (proposed design) along one IFT run; see the module docstring."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posttrain.train.sft import load_sft_jsonl
    from posttrain.utils.progress import progress_bar
    from posttrain.utils.tables import markdown_table
    from posttrain_lab.studies.analysis.forgetting import epsilon, log_steps, transition_step, verdicts
    from posttrain_lab.studies.analysis.metrics import rank_consistency

    t0 = time.perf_counter()
    st = _Setting(cfg)
    ift_rows: list[dict[str, Any]] = []
    if st.world is not None:  # the pool and test entities
        st.probes = st.world.mcqs("pool") + st.world.mcqs("test")
        ift_rows = st.world.instruction_rows(cfg.ift_rows)
        restore_rows = st.world.restoration_rows()
    else:
        if cfg.ift_run is None:
            ift_rows = _raw_rows(load_sft_jsonl(cfg.ift_data))
        restore_rows = _raw_rows(load_sft_jsonl(cfg.restore_data))
    steps = sorted(set(cfg.checkpoints)) if cfg.checkpoints else log_steps(cfg.ift.steps, cfg.n_checkpoints)
    out = Path(cfg.out_dir)
    base_m, base_t = st.load(st.base)
    p0 = st.probe(base_m, base_t)
    ckpts: dict[int, str] = {}
    ift_loss: list[tuple[int, float]] = []
    if cfg.ift_run is not None:  # the checkpoints of an existing run
        ckpts = _run_checkpoints(cfg.ift_run)
        if cfg.checkpoints:
            missing = [s for s in cfg.checkpoints if s not in ckpts]
            if missing:
                raise InvalidValueError(
                    f"{cfg.ift_run}: no checkpoint for steps {missing} (saved: {sorted(ckpts)})"
                )
        steps = sorted(set(cfg.checkpoints)) if cfg.checkpoints else sorted(ckpts)
    else:  # 1. IFT with the SFT trainer, checkpoints at the chosen steps
        tr = _sft(
            base_m, base_t, ift_rows, cfg.ift, seed=cfg.seed, threads=cfg.threads, out_dir=str(out / "ift")
        )
        with progress_bar(
            "ift", total=cfg.ift.steps, enabled=cfg.progress, log_every=0 if not cfg.progress else None
        ) as bar:
            while tr.step_idx < cfg.ift.steps:
                m = tr.step()
                ift_loss.append((tr.step_idx, m["loss"]))
                if tr.step_idx in steps:
                    ckpts[tr.step_idx] = str(tr.save() / "model")
                bar.advance(loss=m["loss"])

    def restore(spec: str, seed: int, tc: TrainConfig = cfg.restore) -> Any:
        m, t = st.load(spec)
        r = _sft(m, t, restore_rows, tc, seed=seed, threads=cfg.threads)
        r.train()
        return st.probe(r.model, r.tokenizer)

    # 2-3. restoration of every checkpoint and of the base model (control)
    control = [restore(st.base, cfg.seed + i) for i in range(cfg.control_seeds)]
    control_scores = [c.accuracy for c in control]
    eps = epsilon(control_scores, floor=cfg.eps_floor)
    tuned_scores, restored_scores, extra = [], [], []
    with progress_bar("restore", total=len(steps), enabled=cfg.progress, log_every=1) as bar:
        for s in steps:
            m, t = st.load(ckpts[s])
            pm = st.probe(m, t)
            pr = restore(ckpts[s], cfg.seed)
            tuned_scores.append(pm.accuracy)
            restored_scores.append(pr.accuracy)
            extra.append(
                {
                    "consistency_tuned": 100 * rank_consistency(p0.probs, pm.probs),
                    "consistency_restored": 100 * rank_consistency(p0.probs, pr.probs),
                }
            )
            bar.advance(step=s)
    ctrl_mean = sum(control_scores) / len(control_scores)
    vs = verdicts(p0.accuracy, steps, tuned_scores, restored_scores, eps, control=ctrl_mean)
    trans = transition_step(vs)
    trans_cal = transition_step(vs, calibrated=True)
    # the same protocol with every further restoration learning rate (the verdict's sensitivity)
    sensitivity = [
        {
            "lr": cfg.restore.lr,
            "control_scores": control_scores,
            "epsilon": eps,
            "restored_scores": restored_scores,
            "transition_step": trans,
            "transition_step_vs_control": trans_cal,
        }
    ]
    for lr in cfg.restore_lrs:
        tc = cfg.restore.model_copy(update={"lr": lr})
        c_lr = [restore(st.base, cfg.seed + i, tc).accuracy for i in range(cfg.control_seeds)]
        e_lr = epsilon(c_lr, floor=cfg.eps_floor)
        r_lr = [restore(ckpts[s], cfg.seed, tc).accuracy for s in steps]
        v_lr = verdicts(p0.accuracy, steps, tuned_scores, r_lr, e_lr, control=sum(c_lr) / len(c_lr))
        sensitivity.append(
            {
                "lr": lr,
                "control_scores": c_lr,
                "epsilon": e_lr,
                "restored_scores": r_lr,
                "transition_step": transition_step(v_lr),
                "transition_step_vs_control": transition_step(v_lr, calibrated=True),
            }
        )

    def _ts(x: int | None) -> str:
        return str(x) if x is not None else "none"

    sens_line = ""
    if len(sensitivity) > 1:
        sens_line = (
            "sensitivity to the restoration learning rate (transition step; against the control): "
            + (
                "; ".join(
                    f"lr {d['lr']:g}: {_ts(d['transition_step'])}; {_ts(d['transition_step_vs_control'])}"
                    for d in sensitivity
                )
                + "\n"
            )
        )
    rows = [
        [
            v.step,
            v.score_tuned,
            v.score_restored,
            v.forgetting,
            v.recovery_gap,
            v.stage,
            v.control_gap,
            v.control_stage,
            e["consistency_tuned"],
            e["consistency_restored"],
        ]
        for v, e in zip(vs, extra, strict=True)
    ]
    cols = [
        "IFT step",
        "score(M_s)",
        "score(R_s)",
        "F_s",
        "G_s",
        "stage",
        "R_0 - R_s",
        "stage vs control",
        "cons(M_0,M_s)",
        "cons(M_0,R_s)",
    ]
    md = (
        f"# Pseudo vs actual forgetting (restoration protocol, proposed design)\n\n"
        f"score(M_0) = {p0.accuracy:.2f} on {len(st.probes)} probe questions ({st.shots}-shot, no chat template); "
        f"control score(R_0) = {ctrl_mean:.2f} (seeds: {', '.join(f'{c:.2f}' for c in control_scores)}); "
        f"epsilon = {eps:.2f}; restoration: {cfg.restore.steps} steps x {cfg.restore.batch_size} rows, "
        f"lr {cfg.restore.lr:g}\n\n"
        + markdown_table(cols, rows, floatfmt=".2f")
        + f"\ntransition step (first G_s > epsilon): {trans if trans is not None else 'none'}; "
        f"against the control (first R_0 - R_s > epsilon): {trans_cal if trans_cal is not None else 'none'}\n"
        + sens_line
    )
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(steps, tuned_scores, "o-", label="tuned M_s")
    ax.plot(steps, restored_scores, "s-", label="restored R_s")
    ax.axhline(p0.accuracy, color="k", lw=1, label="base M_0")
    ax.axhline(ctrl_mean, color="gray", ls="--", lw=1, label="control R_0")
    ax.axhspan(p0.accuracy - eps, p0.accuracy, color="gray", alpha=0.15, label="within epsilon of base")
    if trans is not None:
        ax.axvline(trans, color="C3", ls=":", label=f"transition (step {trans})")
    ax.set_xscale("log")
    ax.set_xlabel("IFT step")
    ax.set_ylabel("probe accuracy (%)")
    ax.set_title("forgetting and recovery along IFT")
    ax.legend(fontsize=8)
    res = {
        "base": st.base,
        "n_questions": len(st.probes),
        "score_base": p0.accuracy,
        "control_scores": control_scores,
        "epsilon": eps,
        "checkpoints": [{**v.to_json(), **e, "path": ckpts[v.step]} for v, e in zip(vs, extra, strict=True)],
        "transition_step": trans,
        "transition_step_vs_control": trans_cal,
        "sensitivity": sensitivity,
        "ift": cfg.ift.model_dump(),
        "restore": cfg.restore.model_dump(),
        "ift_loss": ift_loss,
        "wall_s": time.perf_counter() - t0,
        "table": {"columns": cols, "rows": rows},
    }
    res["files"] = _write_reports(cfg.out_dir, "forgetting", res, md, _png(fig))
    return res


def _run_checkpoints(run: str) -> dict[int, str]:
    """step -> model directory of every complete checkpoint ``<run>/checkpoints/step_*/model``."""
    root = Path(run) / "checkpoints"
    found = {}
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and p.name.startswith("step_") and (p / "model" / "config.json").is_file():
                found[int(p.name[len("step_") :])] = str(p / "model")
    if not found:
        raise InvalidValueError(
            f"ift_run {run!r}: no saved checkpoints (expected {root}/step_*/model; save them with "
            "checkpoint.every and a checkpoint.keep large enough to keep the early ones)"
        )
    return found


def _raw_rows(parsed: list[Any]) -> list[dict[str, Any]]:
    """Parsed SFT rows back to in-memory dict rows (the trainer re-encodes them)."""
    from posttrain.train.sft_data import Chat, PromptCompletion, Text

    out: list[dict[str, Any]] = []
    for r in parsed:
        if isinstance(r, Text):
            out.append({"text": r.text})
        elif isinstance(r, PromptCompletion):
            out.append({"prompt": r.prompt, "completion": r.completion})
        elif isinstance(r, Chat):
            out.append({"messages": [{"role": a, "content": b} for a, b in r.messages]})
    return out
