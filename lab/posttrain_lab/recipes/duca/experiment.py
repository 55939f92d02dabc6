"""DuCA experiment (HIAN is a proposed design) on the ``sales`` simulator, tiny preset: a warm start,
a gate printed before RL, then the arms below from the same warm start, resumable per arm and seed
(each finished arm is written to ``<out>/s<seed>/<arm>.json`` at once).

Environment: ``multi_offer: decline`` (a turn naming several products is declined) and
``accept_prob`` < 1 (a fitting offer is bought only sometimes), so the warm start converts sometimes
and conversion varies inside a group.

**Gate** (warm start, ``--gate-n`` held-out scenarios x ``--gate-g`` sampled conversations at
temperature 1): conversion in [0.2, 0.8], at least 40 % of the groups mixed (some but not all
conversations convert), every turn criterion's violation rate in [0.05, 0.5]. Printed and saved to
``gate.json``; a seed whose gate fails is not trained unless ``--force``.

**Arms** (same seed, steps, batch): ``duca`` (HIAN, fused turn term re-normalised), ``duca-mean``
(turn term = mean of the per-criterion z-scores), ``duca-x10`` (HIAN with the conversion reward x10:
HIAN z-scores the session reward, so it should not move), ``grpo-sum`` and ``grpo-sum-x10`` (GRPO on
session + every turn criterion, conversion worth 1 or 10), ``grpo-session`` (GRPO on conversion only).
Metrics: sampled conversion and each violation rate on the gate's scenarios after RL.

**With a real model** (``--model smollm2-135m``): the built-in real model is the seller (chat template,
a one-line system prompt saying it is a salesperson, bf16 autocast, the ``fast`` engine, lr 2e-5, no SFT
warm start: it is instruction-tuned), and with ``--customer llm`` the customer's replies come from
``sales-llm``: a model (``--customer-model``, default the seller's) served by ``posttrain serve`` in
this process on 127.0.0.1 (a free port), started before the first seed and stopped at the end; an
endpoint failure ends that conversation with a flag (``endpoint_failed_rate`` in the metrics). The gate
is printed the same way; a real-model warm start is what it is, so such runs usually need ``--force``.

Run: ``nice -n 10 python -m posttrain_lab.recipes.duca.experiment --out runs/duca-exp --seeds 0``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from posttrain.utils.errors import InvalidValueError
from posttrain.utils.stats import mean_se
from posttrain_lab.recipes.duca.sales import CRITERIA

CONFIG = Path(__file__).resolve().parent / "duca-sales.yaml"
GRPO = ["advantage.name=grpo", "advantage.params={}", "rollout.runner.params.turn_inputs=false"]
ARMS: dict[str, tuple[list[str], float]] = {  # overrides, conversion reward
    "duca": (["advantage.params.turn_norm=fused"], 1.0),
    "duca-mean": (["advantage.params.turn_norm=mean"], 1.0),
    "grpo-sum": ([*GRPO, "rollout.runner.params.reward=sum"], 1.0),
    "grpo-sum-x10": ([*GRPO, "rollout.runner.params.reward=sum"], 10.0),
    "grpo-session": (GRPO, 1.0),
    "duca-x10": (["advantage.params.turn_norm=fused"], 10.0),
}
GATE_CONV = (0.2, 0.8)
GATE_MIXED = 0.4
GATE_VIOL = (0.05, 0.5)


#: the seller's system prompt with a real (chat) model: the task's store line after one sentence of role
REAL_PROMPT = (
    "You are a salesperson in an electronics store, chatting with a customer. Find out what they need "
    "and offer one product that fits. Reply in one or two short sentences. {prompt}"
)


def real_model(a: argparse.Namespace) -> bool:
    return a.model != "tiny"


def model_overrides(a: argparse.Namespace) -> list[str]:
    """The seller: the recipe's tiny preset, or a real chat model (bf16 autocast, fast engine, chat template,
    :data:`REAL_PROMPT`, lr 2e-5 unless ``--lr``)."""
    if not real_model(a):
        return []
    lr = [] if a.lr is not None else ["optimizer.lr=2e-5"]
    return [
        f"model.name={a.model}",
        "model.precision=bf16",
        "rollout.engine={name: fast}",
        "task.chat_template=true",
        f'task.prompt_template="{REAL_PROMPT}"',
        f"rollout.max_new_tokens={a.max_new_tokens}",
        # 4 conversations per forward/backward (the same update): with all 16 at once the process (seller,
        # its AdamW state and the served customer) reached 12 GB RSS on 2026-12-02
        "micro_batch_size=4",
        *lr,
    ]


def env_params(a: argparse.Namespace, customer_url: str | None, conversion_reward: float = 1.0) -> list[str]:
    """The environment overrides: ``sales`` (rule customer) or ``sales-llm`` against ``customer_url``."""
    common = (
        f"max_turns: {a.max_turns}, multi_offer: decline, accept_prob: {a.accept_prob}, "
        f"conversion_reward: {conversion_reward}"
    )
    if a.customer == "rule":
        return [f"rollout.runner.params.env_params={{{common}}}"]
    if not customer_url:
        raise InvalidValueError("--customer llm needs the served customer's URL (run inside customer_server)")
    return [
        "rollout.runner.params.env=sales-llm",
        f'rollout.runner.params.env_params={{{common}, base_url: "{customer_url}", '
        f'model: "{a.customer_model or a.model}", max_tokens: {a.customer_tokens}, timeout_s: 120, '
        "max_retries: 1}",
    ]


#: the value a ``made_with`` key had before gate files recorded it (the tiny seller, the rule customer)
BEFORE_KEYS: dict[str, Any] = {"model": "tiny", "customer": "rule", "p_format": 0.0}


def made_with(a: argparse.Namespace) -> dict[str, Any]:
    """What a saved warm start and gate depend on (a rerun reuses them only if this matches)."""
    real = real_model(a)
    return {
        "model": a.model,
        "customer": a.customer,
        "sft_steps": 0 if real else a.sft_steps,
        "p_format": 0.0 if real else a.p_format,
    }


@contextlib.contextmanager
def customer_server(a: argparse.Namespace):
    """``posttrain serve`` of the customer model on 127.0.0.1 (a free port), in this process, for the whole
    run (``--customer llm``); yields its base URL. None for the rule-based customer (nothing served)."""
    if a.customer == "rule":
        yield None
        return
    from posttrain.serve import ServeConfig
    from posttrain.serve.server import BackgroundServer

    cfg = ServeConfig(
        model=a.customer_model or a.model,
        port=0,
        max_tokens=max(64, a.customer_tokens),
        default_max_tokens=a.customer_tokens,
        max_concurrent_requests=4,
        seed=0,
    )
    with BackgroundServer(cfg) as srv:
        yield srv.base_url


def sampled_metrics(trainer: Any, examples: list[Any], g: int, max_new: int) -> dict[str, Any]:
    """``g`` sampled conversations (temperature 1) per scenario with the trainer's runner: conversion,
    share of mixed groups, per-criterion violation rate (per turn), average turns, cut-turn rate."""
    from posttrain.rollout import SamplingParams

    runner = trainer.collector.runner
    eps = runner.run(examples, [g] * len(examples), SamplingParams(temperature=1.0, max_new_tokens=max_new))
    ev = runner.eval_metrics(eps)
    conv = [bool(s.env.converted) for s in runner.last_sessions]
    groups = [conv[i * g : (i + 1) * g] for i in range(len(examples))]
    out = {
        **({"endpoint_failed_rate": ev["endpoint_failed_rate"]} if "endpoint_failed_rate" in ev else {}),
        "conversion": sum(conv) / len(conv),
        "mixed_groups": sum(0 < sum(x) < g for x in groups) / len(groups),
        "avg_turns": ev["avg_turns"],
        "turn_cut_rate": ev["turn_cut_rate"],
        "violations": {c: ev[f"{c}_rate"] for c in CRITERIA},
        "multi_offer_turns": sum(s.env.multi_offers for s in runner.last_sessions),
        "scenarios": len(examples),
        "samples": g,
    }
    return out


def gate_check(m: dict[str, Any]) -> bool:
    return (
        GATE_CONV[0] <= m["conversion"] <= GATE_CONV[1]
        and m["mixed_groups"] >= GATE_MIXED
        and all(GATE_VIOL[0] <= v <= GATE_VIOL[1] for v in m["violations"].values())
    )


def _fmt(m: dict[str, Any]) -> str:
    v = ", ".join(f"{k} {x:.3f}" for k, x in m["violations"].items())
    return f"conversion {m['conversion']:.3f}, mixed groups {m['mixed_groups']:.2f}, violations: {v}"


def summarise(out: Path, seeds: list[int]) -> str:
    keys = ["conversion", *CRITERIA]
    lines = ["| arm | seeds | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
    for name in ["warm start", *ARMS]:
        vals: dict[str, list[float]] = {k: [] for k in keys}
        for s in seeds:
            p = out / f"s{s}" / ("gate.json" if name == "warm start" else f"{name}.json")
            if not p.exists():
                continue
            m = json.loads(p.read_text())
            m = m.get("metrics", m)
            vals["conversion"].append(m["conversion"])
            for c in CRITERIA:
                vals[c].append(m["violations"][c])
        if not vals["conversion"]:
            continue
        cells = []
        for k in keys:
            mu, se = mean_se(vals[k])
            cells.append(f"{mu:.3f}" + ("" if math.isnan(se) else f" ± {se:.3f}"))
        lines.append(f"| {name} | {len(vals['conversion'])} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def run_seed(a: argparse.Namespace, seed: int, say: Any, customer_url: str | None = None) -> None:
    from posttrain.models import load_model_and_tokenizer
    from posttrain.train.config import load_rl_config
    from posttrain.train.rl import DegenerateSettingWarning, RLTrainer
    from posttrain_lab.recipes.duca.demo import sft_on_episodes, teacher_episodes
    from posttrain_lab.recipes.duca.sales import SalesTask

    d = a.out / f"s{seed}"
    d.mkdir(parents=True, exist_ok=True)
    base = [
        f"seed={seed}",
        f"steps={a.steps}",
        "eval.every=0",
        "eval.at_start=false",  # the arms are measured by sampled_metrics; a greedy start eval is unused
        "eval.at_end=false",
        "logging.progress=false",
        *model_overrides(a),
        *([f"optimizer.lr={a.lr}"] if a.lr is not None else []),
    ]
    cfg0 = load_rl_config(str(CONFIG), [*base, *env_params(a, customer_url), f"out_dir={d / 'gate'}"])
    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(cfg0.model.name, device="cpu", seed=seed)
    task = SalesTask(**cfg0.task.params)
    held = task.split("heldout")[: a.gate_n]
    max_new = cfg0.rollout.max_new_tokens
    warm, gate_path = d / "warm.pt", d / "gate.json"
    real = real_model(a)
    want = made_with(a)
    if gate_path.exists() and (real or warm.exists()):
        gate = json.loads(gate_path.read_text())
        # gate files written before a key existed were made with its first value
        made = {k: gate.get(k, BEFORE_KEYS.get(k)) for k in want}
        if made != want:
            raise SystemExit(
                f"{gate_path}: the warm start there was made with {made}, this run asks for {want}; "
                "use another --out"
            )
        if not real:
            model.load_state_dict(torch.load(warm, weights_only=True))
        say(f"seed {seed}: warm start and gate reused from {d}")
    else:
        t = time.perf_counter()
        losses: list[float] = []
        if not real:  # the real model is instruction-tuned: its warm start is itself
            rp = dict(cfg0.rollout.runner.params)
            eps = teacher_episodes(
                tok, task.split("train"), rp, max_new_tokens=max_new, seed=seed, p_format=a.p_format
            )
            losses = sft_on_episodes(model, eps, steps=a.sft_steps, batch_size=16, lr=1e-3, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tr = RLTrainer(cfg0, model, tok)
        with tr:
            m = sampled_metrics(tr, held, a.gate_g, max_new)
        gate = {
            "seed": seed,
            **m,
            **want,
            "sft_loss_first_last": [losses[0], losses[-1]] if losses else None,
            "accept_prob": a.accept_prob,
            "passes": gate_check(m),
            "rule": f"conversion in {list(GATE_CONV)}, mixed groups >= {GATE_MIXED}, "
            f"each violation rate in {list(GATE_VIOL)}",
            "wall_s": time.perf_counter() - t,
        }
        if not real:
            torch.save(model.state_dict(), warm)
        gate_path.write_text(json.dumps(gate, indent=2))
    say(
        f"GATE seed {seed} (warm start, {a.gate_n} scenarios x {a.gate_g}): {_fmt(gate)}: "
        f"{'PASS' if gate['passes'] else 'FAIL'} ({gate['rule']})"
    )
    if not gate["passes"] and not a.force:
        say(f"seed {seed}: gate failed, no RL (use --force)")
        return
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for arm in a.arms:
        path = d / f"{arm}.json"
        if path.exists():
            say(f"seed {seed} {arm}: done earlier")
            continue
        extra, scale = ARMS[arm]
        model.load_state_dict(state)
        cfg = load_rl_config(
            str(CONFIG), [*base, *extra, *env_params(a, customer_url, scale), f"out_dir={d / arm}"]
        )
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateSettingWarning)
            with RLTrainer(cfg, model, tok) as trainer:
                trainer.train(progress=False, overwrite=True)
                # evaluate with conversion worth 1 whatever the arm trained with (rates only)
                ecfg = load_rl_config(
                    str(CONFIG), [*base, *env_params(a, customer_url), f"out_dir={d / 'gate'}"]
                )
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    etr = RLTrainer(ecfg, trainer.model, tok)
                with etr:
                    m = sampled_metrics(etr, held, a.gate_g, max_new)
        rows = [json.loads(x) for x in (d / arm / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if r.get("kind") == "step"]
        res = {
            "arm": arm,
            "seed": seed,
            "steps": a.steps,
            "overrides": extra,
            "conversion_reward": scale,
            "metrics": m,
            "train_conversion_first_last": [steps[0]["accuracy"], steps[-1]["accuracy"]] if steps else None,
            "zero_var_frac_mean": statistics.fmean(r["zero_var_frac"] for r in steps) if steps else None,
            "wall_s": time.perf_counter() - t,
        }
        path.write_text(json.dumps(res, indent=2))
        say(f"seed {seed} {arm}: {_fmt(m)}, {res['wall_s']:.0f} s")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/duca-exp"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--max-turns", type=int, default=5)
    ap.add_argument("--accept-prob", type=float, default=0.4)
    ap.add_argument(
        "--p-format",
        type=float,
        default=0.15,
        help="share of the teacher's turns that end with a role marker (a format violation), so the warm "
        "start shows every failure the turn rewards target (calibration of this experiment; with 0 the "
        "warm start's format rate was 0.03-0.05, below the gate's 0.05, 2026-12-02)",
    )
    ap.add_argument(
        "--lr",
        type=float,
        default=None,
        help="RL learning rate (default: the recipe's 3e-4, at which the tiny agent's text collapsed within "
        "5 steps in every arm, 2026-12-02)",
    )
    ap.add_argument(
        "--model", default="tiny", help="the seller: tiny (default) or a real chat model, e.g. smollm2-135m"
    )
    ap.add_argument(
        "--customer",
        choices=("rule", "llm"),
        default="rule",
        help="rule: the sales simulator's customer; llm: sales-llm against posttrain serve on 127.0.0.1",
    )
    ap.add_argument("--customer-model", default=None, help="the served customer model (default: --model)")
    ap.add_argument("--customer-tokens", type=int, default=40, help="customer reply length cap")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="seller turn length with a real model")
    ap.add_argument("--gate-n", type=int, default=40)
    ap.add_argument("--gate-g", type=int, default=4)
    ap.add_argument("--force", action="store_true", help="train a seed whose gate failed")
    ap.add_argument("--summary-only", action="store_true")
    a = ap.parse_args(argv)

    def say(msg: str) -> None:
        print(f"[duca-exp {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    a.out.mkdir(parents=True, exist_ok=True)
    if not a.summary_only:
        with customer_server(a) as url:
            if url is not None:
                say(f"customer: {a.customer_model or a.model} served at {url}")
            for seed in a.seeds:
                run_seed(a, seed, say, customer_url=url)
                summarise(a.out, a.seeds)
    print(summarise(a.out, a.seeds))


if __name__ == "__main__":
    main()
