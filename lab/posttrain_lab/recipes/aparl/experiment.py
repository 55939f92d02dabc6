"""APARL experiment (proposed design) on ``dialogue-events``: a calibrated warm start, a gate printed
before RL, then the arms ``dapo``, ``aparl``, ``aparl-frozen`` and ``aparl-reverse`` from the same warm
start, resumable per arm and seed (each finished arm is written to ``<out>/s<seed>/<arm>.json`` at once).

1. **Warm start** (per seed): SFT on the training labels in chunks of ``--sft-chunk`` steps until the
   *sampled* training accuracy (``--gate-n`` training items x ``--gate-g`` samples at temperature 1)
   reaches 0.3. **Gate** (printed, ``gate.json``): sampled training accuracy in [0.3, 0.6] and at most
   20 % saturated items (all samples correct). A seed whose gate fails is not trained (``--force``
   trains it anyway and says so).
2. **Arms** (same seed, steps, batch): ``dapo`` (uniform sampler + DAPO dynamic sampling);
   ``aparl`` (perplexity curriculum, threshold = the arm's own first-stage signal + ``--margin``,
   0.03, re-based at every level; by default no item leaves the pool: ``--saturated-ppl`` 1.0, solved
   items kept — the setting in which the level rose, 2026-12-02); ``aparl-frozen`` (level fixed at 0: p ∝ PPL over the whole
   pool); ``aparl-reverse`` (p ∝ 1/PPL, same level rule). **Gate** for ``aparl``: the level rises at
   least twice and the sampled perplexity rises with it (mean ``sampler/ppl_sampled_mean`` at the last
   level above level 0's).
3. **Outcomes**: greedy macro-F1 on the OOD split and on the hardest quartile of the held-out split by
   the warm start's reference-completion perplexity; ``summary.json`` / ``summary.md`` with the paired
   differences (arm − dapo) over seeds, mean ± standard error.

Run: ``nice -n 10 python -m posttrain_lab.recipes.aparl.experiment --out runs/aparl-exp --seeds 0 1``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from posttrain.utils.stats import mean_se

CONFIG = Path(__file__).resolve().parent / "grpo-aparl-events.yaml"
ARMS = ("dapo", "aparl", "aparl-frozen", "aparl-reverse")
GATE_ACC = (0.3, 0.6)
GATE_SATURATED = 0.2


def arm_overrides(
    arm: str,
    *,
    baseline: float | None,
    margin: float,
    stage_steps: int,
    drop_solved: bool = True,
    saturated_ppl: float = 1.05,
) -> list[str]:
    """The RL config overrides of an arm (every APARL rule here is a proposed design). ``baseline``
    None: level 0's threshold is the arm's own first-stage signal + ``margin`` (the signal under the
    arm's own sampling distribution); a number: that value + ``margin`` (the warm start's uniform
    sampled accuracy — which p ∝ PPL sampling, tilted to harder items, can sit below for good).
    ``drop_solved`` False keeps items whose latest group was all right in the pool (measured
    2026-12-02 on dialogue-events, seed 0: the same run to the last digit, because the items the policy
    solved had already left the pool as perplexity-saturated, PPL <= ``saturated_ppl``)."""
    if arm == "dapo":
        return [
            "hooks.sampler={name: uniform}",
            "hooks.filter={name: dynamic-sampling, params: {max_rounds: 10}}",
        ]
    base = "null" if baseline is None else f"{baseline:.4f}"
    common = (
        f"stage_steps: {stage_steps}, accuracy_source: train, shift_margin: {margin}, "
        f"shift_baseline: {base}, saturated_ppl: {saturated_ppl}, drop_solved: {str(drop_solved).lower()}, "
        "min_pool: 256, max_quantile: 0.75"
    )
    extra = {
        "aparl": "gamma: 1.0, quantile_step: 0.25",
        "aparl-frozen": "gamma: 1.0, quantile_step: 0.0",
        "aparl-reverse": "gamma: -1.0, quantile_step: 0.25",
    }[arm]
    return [
        f"hooks.sampler={{name: aparl, params: {{{common}, {extra}}}}}",
        "hooks.filter={name: dynamic-sampling, params: {max_rounds: 10}}",  # the inner loop, as dapo's
    ]


def sampled_accuracy(trainer: Any, examples: list[Any], g: int) -> dict[str, float]:
    """Per item, ``g`` samples at temperature 1: mean accuracy and the saturated share (all correct)."""
    from posttrain_lab.recipes.aparl.dialogue_events import EVENTS, parse_label

    runner = trainer.collector.runner
    from posttrain.rollout import SamplingParams

    eps = runner.run(
        examples, [g] * len(examples), SamplingParams(temperature=1.0, max_new_tokens=12, logprobs=False)
    )
    labels = getattr(trainer.task, "labels", EVENTS)
    ok = [parse_label(t, labels) == e.answer for t, e in zip(eps.texts, eps.examples, strict=True)]
    per = [sum(ok[i * g : (i + 1) * g]) / g for i in range(len(examples))]
    return {
        "accuracy": sum(per) / len(per),
        "saturated": sum(p == 1.0 for p in per) / len(per),
        "unsolved": sum(p == 0.0 for p in per) / len(per),
        "items": float(len(per)),
        "samples": float(g),
    }


def level_gate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """From an APARL run's step rows: level rises, and the mean sampled perplexity per level."""
    steps = [r for r in rows if r.get("kind") == "step" and "sampler/level" in r]
    levels = [int(r["sampler/level"]) for r in steps]
    rises = sum(1 for a, b in itertools.pairwise(levels) if b > a)
    by_level: dict[int, list[float]] = {}
    for r in steps:
        if "sampler/ppl_sampled_mean" in r:
            by_level.setdefault(int(r["sampler/level"]), []).append(float(r["sampler/ppl_sampled_mean"]))
    ppl = {lv: statistics.fmean(v) for lv, v in sorted(by_level.items())}
    top = max(ppl) if ppl else 0
    return {
        "level_rises": rises,
        "levels": levels,
        "ppl_sampled_by_level": ppl,
        "passes": bool(rises >= 2 and ppl and 0 in ppl and ppl[top] > ppl[0]),
    }


def summarise(out: Path, seeds: list[int]) -> dict[str, Any]:
    """Paired differences (arm − dapo) over the seeds that finished both arms."""
    res: dict[int, dict[str, Any]] = {}
    for s in seeds:
        d = out / f"s{s}"
        res[s] = {a: json.loads((d / f"{a}.json").read_text()) for a in ARMS if (d / f"{a}.json").exists()}
    summary: dict[str, Any] = {"seeds": seeds, "arms": {}, "paired_vs_dapo": {}}
    for a in ARMS:
        for k in ("ood_f1", "hard_f1", "id_f1"):
            xs = [res[s][a][k] for s in seeds if a in res[s]]
            if xs:
                m, se = mean_se(xs)
                summary["arms"].setdefault(a, {})[k] = {"mean": m, "se": se, "n": len(xs)}
        if a == "dapo":
            continue
        for k in ("ood_f1", "hard_f1", "id_f1"):
            diffs = [res[s][a][k] - res[s]["dapo"][k] for s in seeds if a in res[s] and "dapo" in res[s]]
            if diffs:
                m, se = mean_se(diffs)
                summary["paired_vs_dapo"].setdefault(a, {})[k] = {"mean": m, "se": se, "n": len(diffs)}
    lines = ["| arm | seeds | OOD macro-F1 | hardest-quartile F1 | in-domain F1 |", "|---|---|---|---|---|"]
    for a, ks in summary["arms"].items():
        cells = [
            f"{ks[k]['mean']:.3f} ± {ks[k]['se']:.3f}" if k in ks else "-"
            for k in ("ood_f1", "hard_f1", "id_f1")
        ]
        lines.append(f"| {a} | {ks['ood_f1']['n']} | " + " | ".join(cells) + " |")
    for a, ks in summary["paired_vs_dapo"].items():
        cells = [
            f"{ks[k]['mean']:+.3f} ± {ks[k]['se']:.3f}" if k in ks else "-"
            for k in ("ood_f1", "hard_f1", "id_f1")
        ]
        lines.append(f"| {a} − dapo (paired) | {ks['ood_f1']['n']} | " + " | ".join(cells) + " |")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    return summary


def run_seed(a: argparse.Namespace, seed: int, say: Any) -> None:
    from posttrain.models import load_model_and_tokenizer
    from posttrain.train.config import load_rl_config
    from posttrain.train.rl import DegenerateSettingWarning, RLTrainer, step_rollouts
    from posttrain.train.sft import sft_warm_start
    from posttrain_lab.recipes.aparl.dialogue_events import classification_scores
    from posttrain_lab.recipes.aparl.event_eval import evaluate_event_detection
    from posttrain_lab.recipes.aparl.sampler import gold_perplexities

    d = a.out / f"s{seed}"
    d.mkdir(parents=True, exist_ok=True)
    base = [
        f"seed={seed}",
        f"steps={a.steps}",
        f"task.params={{n_train: {a.n_train}, n_heldout: 400, n_ood: 200, ood_business: pharmacy, window: 2, seed: 0}}",
        "eval.every=0",
        "eval.n=200",
        "logging.progress=false",
        "checkpoint.every=0",
    ]
    cfg0 = load_rl_config(str(CONFIG), [*base, f"out_dir={d / 'gate'}"])
    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(cfg0.model.name, device="cpu", seed=seed)
    warm = d / "warm.pt"
    gate_path = d / "gate.json"
    if warm.exists() and gate_path.exists():
        model.load_state_dict(torch.load(warm, weights_only=True))
        gate = json.loads(gate_path.read_text())
        say(f"seed {seed}: warm start and gate reused from {d}")
    else:
        t = time.perf_counter()
        done, history = 0, []
        while True:
            sft_warm_start(
                cfg0,
                model,
                tok,
                steps=a.sft_chunk,
                seed=seed + done,
                out_dir=d / "sft",
                progress=False,
                save=False,
            )
            done += a.sft_chunk
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tr = RLTrainer(cfg0, model, tok)
            with tr:  # closed at once: its reward workers do not outlive the check
                acc = sampled_accuracy(tr, tr.task.split("train")[: a.gate_n], a.gate_g)
            history.append({"sft_steps": done, **acc})
            say(
                f"seed {seed}: SFT {done} steps: sampled train accuracy {acc['accuracy']:.3f}, saturated {acc['saturated']:.2f}"
            )
            if acc["accuracy"] >= GATE_ACC[0] or done >= a.sft_max:
                break
        ok = GATE_ACC[0] <= acc["accuracy"] <= GATE_ACC[1] and acc["saturated"] <= GATE_SATURATED
        gate = {
            "seed": seed,
            "sft_steps": done,
            **acc,
            "history": history,
            "passes": ok,
            "rule": f"sampled train accuracy in {list(GATE_ACC)}, saturated <= {GATE_SATURATED}",
            "wall_s": time.perf_counter() - t,
        }
        torch.save(model.state_dict(), warm)
        gate_path.write_text(json.dumps(gate, indent=2))
    say(
        f"GATE seed {seed} (warm start): sampled train accuracy {gate['accuracy']:.3f} (want 0.3-0.6), "
        f"saturated {gate['saturated']:.2f} (want <= 0.20): {'PASS' if gate['passes'] else 'FAIL'}"
    )
    if not gate["passes"] and not a.force:
        say(f"seed {seed}: gate failed, no RL (use --force)")
        return
    state = {k: v.clone() for k, v in model.state_dict().items()}
    # the hardest held-out quartile by the warm start's reference-completion perplexity
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = RLTrainer(cfg0, model, tok)
    with tr:
        held = tr.task.split("heldout")
        ppl, _ = gold_perplexities(
            tr.lm, tr.formatter.encode, held, target=lambda e: tr.task.reference_completion(e)
        )
    order = sorted(range(len(held)), key=lambda i: -ppl[i])
    hard = [held[i] for i in order[: len(held) // 4]]
    for arm in a.arms:
        path = d / f"{arm}.json"
        if path.exists():
            say(f"seed {seed} {arm}: done earlier ({path})")
            continue
        model.load_state_dict(state)
        run_dir = d / arm
        base_acc = gate["accuracy"] if a.baseline == "gate" else None
        ov = arm_overrides(
            arm,
            baseline=base_acc,
            margin=a.margin,
            stage_steps=a.stage_steps,
            drop_solved=a.drop_solved,
            saturated_ppl=a.saturated_ppl,
        )
        cfg = load_rl_config(str(CONFIG), [*base, *ov, f"out_dir={run_dir}"])
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateSettingWarning)
            with RLTrainer(cfg, model, tok) as trainer:
                trainer.train(progress=False, overwrite=True)
                ev = evaluate_event_detection(trainer, n=200)
                from posttrain.rollout import SamplingParams

                eps = trainer.collector.runner.run(
                    hard, [1] * len(hard), SamplingParams(temperature=0.0, max_new_tokens=12, logprobs=False)
                )
                from posttrain_lab.recipes.aparl.dialogue_events import EVENTS, parse_label

                preds = [parse_label(x, getattr(trainer.task, "labels", EVENTS)) for x in eps.texts]
                hard_sc = classification_scores(preds, [e.answer for e in eps.examples])
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        res = {
            "arm": arm,
            "seed": seed,
            "steps": a.steps,
            "overrides": ov,
            "id_f1": ev["heldout"]["macro_f1"],
            "id_acc": ev["heldout"]["accuracy"],
            "ood_f1": ev["ood"]["macro_f1"],
            "ood_acc": ev["ood"]["accuracy"],
            "hard_f1": hard_sc["macro_f1"],
            "hard_acc": hard_sc["accuracy"],
            "hard_n": len(hard),
            "train_acc_last5": statistics.fmean(
                r["accuracy"] for r in rows if r.get("kind") == "step" and r["step"] > a.steps - 5
            )
            if a.steps >= 5
            else None,
            # DAPO's extra rounds included: the dapo arm's filter and the APARL sampler both draw them
            "rollouts_total": sum(step_rollouts(r) for r in rows if r.get("kind") == "step"),
            "wall_s": time.perf_counter() - t,
        }
        if arm.startswith("aparl"):
            res["level_gate"] = level_gate(rows)
            pool = [
                r.get("sampler/pool_size")
                for r in rows
                if r.get("kind") == "step" and "sampler/pool_size" in r
            ]
            res["pool_size_first_last"] = [pool[0], pool[-1]] if pool else None
        path.write_text(json.dumps(res, indent=2))
        say(
            f"seed {seed} {arm}: OOD F1 {res['ood_f1']:.3f}, hard-quartile F1 {res['hard_f1']:.3f}, "
            f"in-domain F1 {res['id_f1']:.3f}, {res['wall_s']:.0f} s"
            + (f"; level gate {res['level_gate']}" if "level_gate" in res else "")
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/aparl-exp"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--n-train", type=int, default=3000)
    # defaults: the calibration with which the level gate passed on both seeds (2026-12-02): 80 steps,
    # margin 0.03, nothing leaves the pool; with 40 steps, margin 0.05 and solved / saturated items
    # leaving, the level never rose (docs/replay-and-curriculum.md)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--stage-steps", type=int, default=4)
    ap.add_argument("--margin", type=float, default=0.03)
    ap.add_argument(
        "--baseline",
        choices=("first", "gate"),
        default="first",
        help="level-0 threshold base: the arm's own first-stage signal (default) or the warm-start gate's "
        "uniform sampled accuracy (the 2026-12-01 run: never reached)",
    )
    ap.add_argument("--sft-chunk", type=int, default=50)
    ap.add_argument("--sft-max", type=int, default=800)
    ap.add_argument("--gate-n", type=int, default=200)
    ap.add_argument("--gate-g", type=int, default=4)
    ap.add_argument(
        "--drop-solved",
        dest="drop_solved",
        action="store_true",
        default=False,
        help="drop items whose latest group was all right from the pool each stage (default: keep them)",
    )
    ap.add_argument("--keep-solved", dest="drop_solved", action="store_false", help="the default")
    ap.add_argument(
        "--saturated-ppl",
        type=float,
        default=1.0,
        help="items with reference perplexity <= this leave the pool at a stage boundary (default 1.0: none "
        "leave; 1.05 = the sampler's own default, with which the level never rose)",
    )
    ap.add_argument("--force", action="store_true", help="train a seed whose warm-start gate failed")
    ap.add_argument("--summary-only", action="store_true")
    a = ap.parse_args(argv)

    def say(msg: str) -> None:
        print(f"[aparl-exp {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    a.out.mkdir(parents=True, exist_ok=True)
    if not a.summary_only:
        for seed in a.seeds:
            run_seed(a, seed, say)
            summarise(a.out, a.seeds)
    s = summarise(a.out, a.seeds)
    print((a.out / "summary.md").read_text())
    print(json.dumps(s["paired_vs_dapo"], indent=2))


if __name__ == "__main__":
    main()
