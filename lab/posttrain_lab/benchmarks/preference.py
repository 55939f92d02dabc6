"""``posttrain bench preference``: GRPO vs online DPO vs offline DPO from one warm start, at the same
number of generated completions (issue 57 item 4).

Every arm starts from the same model (the warm start, saved once to ``<out>/warm_start`` and loaded by
every arm, so even a preset whose weights depend on the seed is shared), trains on the same task's
prompts with the same reward, and generates the same number of completions, ``steps × prompts_per_step ×
group_size``:

* ``grpo``: the RL stage of ``posttrain demo smol`` (``demo_smol.yaml``: the instruction task, the
  guarded reward ``instructions_guarded``, its rollout, objective and optimizer), through
  :func:`posttrain.train.rl.train_to_end`, WITHOUT the demo's DAPO overlong shaper (``hooks.shapers=[]``
  comes before the caller's overrides): every arm then learns from the same reward, the one that ranks
  the DPO arms' pairs (the shaper is an RL hook the DPO arms do not have);
* ``online-dpo``: :class:`~posttrain.train.preference.PreferenceTrainer` with ``online.enabled``: each
  step samples ``group_size`` completions for each of ``prompts_per_step`` prompts from the current
  policy with the same task, reward, temperature, length cap and engine, and trains DPO on each group's
  best vs worst completion (groups without a margin skipped);
* ``offline-dpo``: the same pairs' recipe, but all ``steps × prompts_per_step`` groups sampled ONCE from
  the warm start (before training; the same prompt order and sampling seed as the online arm, so its
  first step's pairs are the online arm's), then DPO on them in shuffled epochs.

Pre-check (before any arm): one round of groups sampled from the warm start; the share of groups with a
reward margin. With none, the DPO arms have nothing to train on and the bench stops with that message.

Evaluation (before, once, and after each arm and seed): greedy answers to the task's first ``eval.n``
held-out prompts (the same prompts for every arm), scored by the task's report
(IFEval's checkers, the hack probes): prompt-level strict accuracy, ``hacked_frac``
(the share of answers a hack probe flags) and the mean answer length. Standard errors are paired over
prompts: each arm's gain over the warm start, and each pair of arms' difference, on the per-prompt
verdicts averaged over seeds (:func:`posttrain.utils.stats.paired_gain`). The seed SE is the SE over
seeds of the per-seed accuracy (a gain) or of the per-seed difference of two arms (paired by seed): it
carries the run-to-run noise of training, which the prompt SE does not. A difference within 2 of either
SE is reported as no difference resolved.

Gates per arm (from its ``metrics.jsonl``): did it train at all (GRPO: some group with reward variance,
``zero_var_frac`` < 1; DPO: some step with a pair, ``pairs/n`` > 0), and the reward's mechanisms
(``reward/hacked``, the share of groups without margin, ``rewards/accuracies``).

Arms run seed by seed (every arm of seed 0, then of seed 1, ...); after each seed but the last,
``<out>/summary_partial.md`` holds the table of the seeds done. Resumable per arm and seed:
``<out>/before.json`` and each finished ``<out>/<arm>-s<seed>/result.json``
are kept (``--resume``); an arm stopped midway continues from its last checkpoint (every 4 steps), with
the offline arm's pairs sampled again from the warm start (the same, by seed). ``summary.json`` holds
everything, ``summary.md`` the table.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError, option
from posttrain.utils.io import atomic_write_json, read_jsonl
from posttrain.utils.stats import mean_se, paired_gain

ARMS = ("grpo", "online-dpo", "offline-dpo")


class NoMarginError(InvalidValueError):
    """The warm start's groups have no reward margin: DPO has no pair to train on."""


def rl_config(model: str | None, steps: int, overrides: list[str]) -> Any:
    """The GRPO arm's config: ``demo_smol.yaml`` with ``model.name``, ``steps``, no shaper (the arms share
    one reward), then ``overrides``."""
    from importlib.resources import files

    from posttrain.train.config import RLConfig
    from posttrain.utils.config import build_config

    extra = [f"steps={steps}", "hooks.shapers=[]", *([f"model.name={model}"] if model else [])]
    return build_config(RLConfig, str(files("posttrain_lab.demos") / "demo_smol.yaml"), [*extra, *overrides])


def dpo_config(rl: Any, *, online: bool, lr: float, beta: float, out_dir: str, seed: int) -> Any:
    """The DPO arms' config, from the GRPO arm's: the same model, task, reward, sampling (temperature,
    length cap, engine, prompts and completions per step), steps, seed and threads; DPO (sigmoid) with
    ``beta`` at ``lr``; one batch = ``prompts_per_step`` pairs at most."""
    from posttrain.train.preference import PreferenceConfig

    r = rl.rollout
    return PreferenceConfig(
        model=rl.model.model_dump(),
        loss={"name": "dpo", "params": {"beta": beta}},
        steps=rl.steps,
        batch_size=r.prompts_per_step,
        micro_batch_size=rl.micro_batch_size,
        optimizer={"lr": lr, "grad_clip": rl.optimizer.grad_clip},
        seed=seed,
        threads=rl.threads,
        out_dir=out_dir,
        progress=False,
        checkpoint={"every": 4, "keep": 1, "final": True},
        online={
            "enabled": online,
            "prompts_per_step": r.prompts_per_step,
            "group_size": r.group_size,
            "max_rounds": 1,
            "temperature": r.temperature,
            "top_p": r.top_p,
            "max_new_tokens": r.max_new_tokens,
            "max_batch_size": r.max_batch_size,
            "engine": r.engine.model_dump(),
            "task": rl.task.model_dump(),
            "reward": rl.reward.model_dump(),
        },
    )


# ----------------------------------------------------------------------------------- warm start
def sample_from(
    pcfg: Any, model_dir: str, *, rounds: int, seed: int
) -> tuple[list[Any], list[dict[str, float]]]:
    """``rounds`` rounds of groups sampled from the model in ``model_dir`` (no update between them) by
    the online source of ``pcfg`` (seed ``seed``): the pairs with a margin and each round's metrics."""
    from posttrain.models.adapter import load_adapter
    from posttrain.train.evaluate import config_precision
    from posttrain.train.preference_online import OnlinePairs

    lm = load_adapter(model_dir, kind=pcfg.model.adapter, dtype=pcfg.model.dtype, device="cpu", seed=seed)
    lm.model.eval()
    source = OnlinePairs.from_config(pcfg.online, lm, precision=config_precision(pcfg, lm.model), seed=seed)
    pairs, stats = [], []
    try:
        for _ in range(rounds):
            pairs += source.next_pairs(pcfg.online.prompts_per_step)
            stats.append(source.step_metrics())
    finally:
        source.close()
    return pairs, stats


def evaluate_model(rl: Any, model: Any, tokenizer: Any, task: Any, examples: list[Any]) -> dict[str, Any]:
    """Greedy held-out answers of ``model``, generated as the GRPO arm's evaluation runner generates them
    (its engine, batch cap, precision and prompt format: :func:`posttrain.train.evaluate.config_eval_runner`),
    scored by the task's report (the IFEval checkers for strict accuracy, the hack probes for
    ``hacked_frac``); each prompt's verdicts in ``items``."""
    from posttrain.rewards import get_reward
    from posttrain.rollout.reward_source import FunctionRewardSource
    from posttrain.train.builder import build_formatter
    from posttrain.train.evaluate import config_eval_runner, config_precision, run_eval

    precision = config_precision(rl, model)
    runner = config_eval_runner(
        rl, model, tokenizer, build_formatter(rl.task, tokenizer), precision=precision
    )
    source = FunctionRewardSource(get_reward("instructions_strict"), num_workers=0)
    try:
        res = run_eval(
            runner, examples, source, max_new_tokens=rl.rollout.max_new_tokens, report=task.eval_report
        )
    finally:
        source.close()
    rep = res["report"]
    return {
        "n": rep["n_prompts"],
        "prompt_strict": rep["prompt_strict"],
        "hacked_frac": rep.get("hacked_frac"),
        "length_mean": res["length_mean"],
        "truncated": res["truncated"],
        "precision": precision,
        "items": rep["items"],
    }


def _steps(run: Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(run / "metrics.jsonl") if r.get("kind") == "step"]


def _series(steps: list[dict[str, Any]], key: str) -> dict[str, float] | None:
    vals = [float(r[key]) for r in steps if key in r]
    return {"first": vals[0], "last": vals[-1], "mean": sum(vals) / len(vals)} if vals else None


def arm_gates(arm: str, run: Path) -> dict[str, Any]:
    """Whether the arm trained at all (``trained``) and the series of its reward's mechanisms."""
    steps = _steps(run)
    if arm == "grpo":
        keys = ("zero_var_frac", "reward/hacked", "truncated_frac", "reward_mean")
        zero = [float(r["zero_var_frac"]) for r in steps if "zero_var_frac" in r]
        trained = bool(zero) and min(zero) < 1.0
    else:
        keys = (
            "pairs/n",
            "pairs/groups_skipped_no_margin",
            "pairs/margin_mean",
            "reward/hacked",
            "rewards/accuracies",
            "rewards/margins",
            "pairs/reward_mean",
        )
        trained = any(float(r.get("pairs/n", r.get("tokens", 0))) > 0 for r in steps)
    out: dict[str, Any] = {"trained": trained, "steps": len(steps)}
    for k in keys:
        s = _series(steps, k)
        if s is not None:
            out[k] = s
    return out


# ------------------------------------------------------------------------------------- the arms
def _train_dpo(pcfg: Any, source: Any = None) -> tuple[dict[str, Any], Any]:
    """Train a DPO arm to its last step (continuing from its checkpoint when there is one) and return
    (the run's summary, the trainer, still open: the caller evaluates and closes it)."""
    from posttrain.train.preference import PreferenceTrainer
    from posttrain.train.run_dir import prepare_run_dir

    out = Path(pcfg.out_dir)
    resumed = (out / "checkpoints" / "latest").is_file()
    if not resumed:
        prepare_run_dir(out, overwrite=True)
    trainer = PreferenceTrainer(pcfg, source=source, resume=resumed)
    try:
        summary = trainer.train()
    except BaseException:
        trainer.__exit__(None, None, None)
        raise
    return summary, trainer


def run_arm(
    arm: str,
    seed: int,
    rl: Any,
    *,
    warm_dir: str,
    run: Path,
    dpo_lr: float,
    beta: float,
    evaluate: Callable[[Any, Any], dict[str, Any]],
) -> dict[str, Any]:
    """One (arm, seed): train from the warm start, evaluate, gates; generated completions counted."""
    from posttrain.train.preference_data import OfflinePairs
    from posttrain.train.rl import train_to_end

    t0 = time.perf_counter()
    per_step = rl.rollout.prompts_per_step * rl.rollout.group_size
    extra: dict[str, Any] = {}
    if arm == "grpo":
        cfg = rl.model_copy(deep=True)
        cfg.out_dir, cfg.seed, cfg.model.name = str(run), seed, warm_dir
        summary, after = train_to_end(
            cfg, label=f"[preference] {arm} seed {seed}", after=lambda t: evaluate(t.model, t.tokenizer)
        )
        generated = rl.steps * per_step  # no dynamic sampling in the GRPO arm: a fixed budget per step
    else:
        rlw = rl.model_copy(deep=True)
        rlw.model.name = warm_dir
        pcfg = dpo_config(rlw, online=arm == "online-dpo", lr=dpo_lr, beta=beta, out_dir=str(run), seed=seed)
        source = None
        if arm == "offline-dpo":  # every group sampled once from the warm start, before training
            pairs, stats = sample_from(pcfg, warm_dir, rounds=rl.steps, seed=seed)
            if not pairs:
                raise NoMarginError(
                    f"offline-dpo seed {seed}: none of the warm start's {sum(s['pairs/groups'] for s in stats):.0f} "
                    "groups has a reward margin; no pair to train on"
                )
            generated = int(sum(s["pairs/completions"] for s in stats))
            extra["pairs"] = len(pairs)
            extra["groups_kept_frac"] = len(pairs) / sum(s["pairs/groups"] for s in stats)
            source = OfflinePairs(pairs, seed=seed)
        print(f"[preference] {arm} seed {seed}: DPO {pcfg.steps} steps", flush=True)
        summary, trainer = _train_dpo(pcfg, source)
        with trainer:
            after = evaluate(trainer.model, trainer.tokenizer)
        if arm == "online-dpo":
            generated = int(sum(r.get("pairs/completions", 0) for r in _steps(run)))
    return {
        "arm": arm,
        "seed": seed,
        "steps": summary["steps"],
        "generated": generated,
        "wall_s": time.perf_counter() - t0,
        "gates": arm_gates(arm, run),
        "after": after,
        **extra,
    }


# ------------------------------------------------------------------------------------- summary
def _verdicts(ev: dict[str, Any]) -> list[float]:
    return [float(i["strict"]) for i in ev["items"]]


def _seed_mean(evals: list[dict[str, Any]]) -> list[float]:
    cols = zip(*(_verdicts(e) for e in evals), strict=True)
    return [sum(c) / len(c) for c in cols]


def _seed_se(xs: list[float]) -> float | None:
    """SE of the mean over seeds; None with one seed."""
    return mean_se(xs)[1] if len(xs) > 1 else None


def compare(a: list[float], b: list[float], seed_diffs: list[float] | None = None) -> dict[str, Any]:
    """``a`` minus ``b`` (per-prompt verdicts) with its paired SE over prompts and, from ``seed_diffs``
    (the per-seed differences, two seeds or more), its SE over seeds; ``resolved`` when |diff| exceeds
    2 of each SE there is."""
    g = paired_gain(b, a)
    seed_se = _seed_se(seed_diffs or [])
    ses = [g["se"], *([seed_se] if seed_se is not None else [])]
    resolved = all(abs(g["gain"]) > 2 * se for se in ses)
    return {"diff": g["gain"], "se": g["se"], "seed_se": seed_se, "resolved": resolved}


def summarise(before: dict[str, Any], results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per arm: accuracy, gain over the warm start (paired SE), hacked_frac, length, budget, gates; per
    pair of arms: the difference with its paired SEs (over prompts, over seeds) and which wins (or none
    resolved)."""
    b = _verdicts(before)
    b_acc = sum(b) / len(b)
    arms: dict[str, Any] = {}
    means: dict[str, list[float]] = {}
    per_seed: dict[str, dict[int, float]] = {}
    for arm, rs in results.items():
        evs = [r["after"] for r in rs]
        means[arm] = _seed_mean(evs)
        acc = [sum(_verdicts(e)) / len(e["items"]) for e in evs]
        per_seed[arm] = {r["seed"]: a for r, a in zip(rs, acc, strict=True)}
        hacked = [float(e["hacked_frac"] or 0.0) for e in evs]
        length = [float(e["length_mean"]) for e in evs]
        gain = compare(means[arm], b, [a - b_acc for a in acc])
        arms[arm] = {
            "accuracy": sum(means[arm]) / len(means[arm]),
            "accuracy_per_seed": acc,
            "accuracy_seed_se": _seed_se(acc),
            "gain": gain["diff"],
            "gain_se": gain["se"],
            "gain_seed_se": gain["seed_se"],
            "gain_resolved": gain["resolved"],
            "hacked_frac": statistics.fmean(hacked),
            "hacked_frac_seed_se": _seed_se(hacked),
            "length_mean": statistics.fmean(length),
            "length_seed_se": _seed_se(length),
            "generated_per_seed": [r["generated"] for r in rs],
            "seeds": [r["seed"] for r in rs],
            "trained_all_seeds": all(r["gates"]["trained"] for r in rs),
        }
    pairs = {}
    names = list(results)
    for i, x in enumerate(names):
        for y in names[i + 1 :]:
            common = [k for k in per_seed[x] if k in per_seed[y]]
            c = compare(means[x], means[y], [per_seed[x][k] - per_seed[y][k] for k in common])
            c["winner"] = (x if c["diff"] > 0 else y) if c["resolved"] else None
            pairs[f"{x} - {y}"] = c
    return {
        "before": {
            "accuracy": b_acc,
            "hacked_frac": before["hacked_frac"],
            "length_mean": before["length_mean"],
            "n": len(b),
        },
        "arms": arms,
        "differences": pairs,
    }


def _ses(prompt_se: float, seed_se: float | None) -> str:
    return f"{prompt_se:.3f}, {seed_se:.3f}" if seed_se is not None else f"{prompt_se:.3f}, -"


def table(summary: dict[str, Any]) -> str:
    """The markdown table of :func:`summarise`; SEs as (over prompts, over seeds)."""
    bf = summary["before"]
    rows = [
        "| arm | held-out accuracy (per seed) | gain (SE prompts, SE seeds) | hacked_frac | answer length "
        "| completions / seed | trained |",
        "|---|---|---|---|---|---|---|",
        f"| warm start | {bf['accuracy']:.3f} | | {bf['hacked_frac'] or 0:.3f} | {bf['length_mean']:.1f} | | |",
    ]
    for arm, a in summary["arms"].items():
        seeds = ", ".join(f"{x:.3f}" for x in a["accuracy_per_seed"])
        rows.append(
            f"| {arm} | {a['accuracy']:.3f} ({seeds}) | {a['gain']:+.3f} ({_ses(a['gain_se'], a['gain_seed_se'])}) "
            f"| {a['hacked_frac']:.3f} | {a['length_mean']:.1f} | {', '.join(map(str, a['generated_per_seed']))} "
            f"| {'yes' if a['trained_all_seeds'] else 'NO'} |"
        )
    rows += ["", "| difference | accuracy diff (SE prompts, SE seeds) | verdict |", "|---|---|---|"]
    for name, d in summary["differences"].items():
        verdict = f"{d['winner']} wins" if d["winner"] else "no difference resolved (within 2 SE)"
        rows.append(f"| {name} | {d['diff']:+.3f} ({_ses(d['se'], d['seed_se'])}) | {verdict} |")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------- the bench
def run_preference_bench(
    out_dir: str | Path = "runs/bench-preference",
    *,
    model: str | None = None,
    steps: int = 30,
    seeds: int = 3,
    seed: int = 0,
    arms: tuple[str, ...] = ARMS,
    dpo_lr: float = 2e-5,
    beta: float = 0.1,
    overrides: list[str] | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """The bench (module docstring); returns the summary also written to ``<out>/summary.json``."""
    from posttrain.models.adapter import load_adapter
    from posttrain.models.saving import save_model_dir
    from posttrain.tasks import get_task
    from posttrain.train.run_dir import RunDirError

    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise InvalidValueError(
            f"arms: unknown {', '.join(unknown) or '(none given)'}; accepted: {', '.join(ARMS)}"
        )
    if seeds < 1 or steps < 1:
        raise InvalidValueError(f"seeds and steps must be >= 1, got seeds={seeds}, steps={steps}")
    t0 = time.perf_counter()
    out = Path(out_dir)
    rl = rl_config(model, steps, list(overrides or []))
    settings = {
        "rl": rl.model_dump(mode="json", exclude={"out_dir", "seed"}),
        "dpo_lr": dpo_lr,
        "beta": beta,
    }
    if out.exists() and any(out.iterdir()):
        if overwrite:
            shutil.rmtree(out)
        elif not resume:
            raise RunDirError(
                f"{out} already holds a preference bench; continue it with {option('resume')}, start again with "
                f"{option('overwrite')}, or choose another out_dir"
            )
    out.mkdir(parents=True, exist_ok=True)
    task = get_task(rl.task.name, **rl.task.params)
    heldout = task.split("heldout")[: rl.eval.n]
    warm_dir = out / "warm_start"

    before_path = out / "before.json"
    if before_path.is_file():
        saved = json.loads(before_path.read_text())
        if saved["settings"] != settings:
            raise RunDirError(
                f"{option('resume')}: {before_path} was measured with other settings; start again with "
                f"{option('overwrite')} or choose another out_dir"
            )
        before, precheck = saved["before"], saved["precheck"]
        print(f"[preference] warm start: kept from {before_path}", flush=True)
    else:
        lm = load_adapter(rl.model.name, kind=rl.model.adapter, dtype=rl.model.dtype, device="cpu", seed=seed)
        save_model_dir(lm.model, lm.tokenizer, warm_dir)
        print(f"[preference] warm start {rl.model.name}: {len(heldout)} held-out prompts", flush=True)
        before = evaluate_model(rl, lm.model, lm.tokenizer, task, heldout)
        del lm
        # pre-check: one round of groups from the warm start, the share with a reward margin
        pcfg = dpo_config(rl, online=True, lr=dpo_lr, beta=beta, out_dir=str(out / "precheck"), seed=seed)
        _, stats = sample_from(pcfg, str(warm_dir), rounds=1, seed=seed + 10_000)
        s = stats[0]
        precheck = {
            "groups": s["pairs/groups"],
            "with_margin": s["pairs/groups_kept"],
            "margin_frac": s["pairs/groups_kept"] / s["pairs/groups"],
            "margin_mean": s["pairs/margin_mean"],
            "reward_mean": s["pairs/reward_mean"],
        }
        atomic_write_json(before_path, {"settings": settings, "before": before, "precheck": precheck})
    print(
        f"[preference] pre-check: {precheck['with_margin']:.0f} of {precheck['groups']:.0f} warm-start groups have "
        f"a reward margin (mean margin {precheck['margin_mean']:.2f})",
        flush=True,
    )
    if precheck["with_margin"] == 0 and any(a != "grpo" for a in arms):
        raise NoMarginError(
            "pre-check: no group sampled from the warm start has a reward margin, so the DPO arms have no pair "
            "to train on (and GRPO no group with reward variance); use a higher temperature, larger groups or "
            "another reward"
        )

    def evaluate(m: Any, tok: Any) -> dict[str, Any]:
        return evaluate_model(rl, m, tok, task, heldout)

    results: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    # seed-major: every arm of a seed before the next seed, so a bench stopped midway (and its
    # summary_partial.md, rewritten after each finished seed) holds complete, paired seeds
    for s in range(seed, seed + seeds):
        for arm in arms:
            run = out / f"{arm}-s{s}"
            path = run / "result.json"
            if path.is_file():
                print(f"[preference] {arm} seed {s}: kept from {path}", flush=True)
                res = json.loads(path.read_text())
            else:
                res = run_arm(
                    arm, s, rl, warm_dir=str(warm_dir), run=run, dpo_lr=dpo_lr, beta=beta, evaluate=evaluate
                )
                atomic_write_json(path, res)
                shutil.rmtree(run / "checkpoints", ignore_errors=True)
            results[arm].append(res)
        if s < seed + seeds - 1:
            partial = table(summarise(before, results))
            (out / "summary_partial.md").write_text(
                f"seeds {seed}..{s} of {seed}..{seed + seeds - 1}\n\n{partial}\n"
            )
            print(f"[preference] after seed {s}:\n{partial}", flush=True)
    (out / "summary_partial.md").unlink(missing_ok=True)
    summary = {
        "model": rl.model.name,
        "task": {"name": rl.task.name, **rl.task.params},
        "reward": {"name": rl.reward.name, "params": rl.reward.params},
        "steps": steps,
        "seeds": list(range(seed, seed + seeds)),
        "prompts_per_step": rl.rollout.prompts_per_step,
        "group_size": rl.rollout.group_size,
        "dpo": {"lr": dpo_lr, "beta": beta},
        "precheck": precheck,
        **summarise(before, results),
        "gates": {arm: {str(r["seed"]): r["gates"] for r in rs} for arm, rs in results.items()},
        "wall_s_this_call": time.perf_counter() - t0,
    }
    atomic_write_json(out / "summary.json", summary)
    (out / "summary.md").write_text(table(summary) + "\n")
    return summary
