"""Post-train one model to coordinate across information silos, and measure it on SILO-BENCH itself
(issue 39 items 2-3): ``posttrain silo rl-experiment``.

1. **Warm start**: SFT on the scripted reference agents' conversations (every seat of every training
   case, rendered with the model's chat template; loss on the agents' replies only), so the policy
   first learns the protocol. One warm start per experiment, shared by every arm and seed.
2. **Pre-check** (printed first, written to ``precheck.json``): the warm start's greedy S on the
   training cases, per task. RL can only act where S is neither 0 nor 1: a task outside 10-90 % is
   flagged (``in_range``), and the experiment says so rather than reporting a null result as one.
3. **Arms**, the same rollout budget (``steps`` x ``prompts_per_step`` x ``group_size`` sessions) and
   the same seeds: ``sft`` (the warm start alone), ``grpo`` (GRPO on S), ``duca`` (DuCA/HIAN: S as the
   session reward, the ``format``/``protocol`` criteria as turn rewards, ``turn_inputs: true``).
4. **Evaluation** by the benchmark's own engine and scoring (each session's
   :class:`~posttrain_lab.benchmarks.silo.engine.CaseResult`): S, P, C, D, failure modes, by split
   (``heldout``: the trained tasks and N from unseen seeds; ``ood``: tasks and N never trained on),
   level and N; greedy, batched through the multi-turn runner (the same engine code as
   ``posttrain silo run``). Paired differences against ``sft`` over cases (SE over cases, per seed),
   and the spread of the seeds. Gates per arm from its RL log: share of groups with mixed S, valid-call
   rate, messages per agent.

Resumable per arm and seed: ``warm/model``, ``precheck.json``, ``<arm>/seed<N>/eval.json`` are written as
they finish and kept by ``--resume``; an RL run continues from its last checkpoint.
"""

from __future__ import annotations

import json
import time
from importlib.resources import files
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError
from posttrain.utils.io import atomic_write_json

ARMS = ("sft", "grpo", "duca")
ARM_OVERRIDES: dict[str, list[str]] = {
    "grpo": [],
    "duca": [
        "advantage.name=duca",
        "rollout.runner.params.turn_inputs=true",
        "objective.name=ppo",
    ],
}
SPLITS = ("heldout", "ood")


def config_path() -> str:
    return str(files("posttrain_lab.benchmarks.silo.rl") / "silo-rl.yaml")


def warm_start_rows(examples: list[Any], env_params: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """Every seat's scripted conversation of every example, ending with its last reply (the SFT rows),
    and the most rounds a case took. The scripted agents play with the environment's prompts and
    scoring and the benchmark's round limit (100), so a warm start is never cut by the RL budget; a
    case they do not solve is an error."""
    import dataclasses

    from posttrain_lab.benchmarks.silo.env import SiloEnv, scripted_conversations

    cfg = dataclasses.replace(SiloEnv(**env_params).cfg, max_rounds=100)
    rows: list[dict[str, Any]] = []
    rounds = 0
    for ex in examples:
        convs, res = scripted_conversations(ex.meta["case"], ex.meta["protocol"], cfg)
        if not res.success:
            raise InvalidValueError(f"silo warm start: the scripted agents did not solve {ex.id}")
        rounds = max(rounds, res.rounds_executed)
        for msgs in convs:
            while msgs and msgs[-1]["role"] != "assistant":
                msgs = msgs[:-1]
            rows.append({"messages": msgs})
    return rows, rounds


def evaluate_cases(model: Any, tok: Any, cfg: Any, examples: list[Any]) -> list[dict[str, Any]]:
    """Greedy sessions of ``examples`` through the config's runner; one benchmark row per case (the
    engine's ``CaseResult.row()`` plus the split's example id and S per agent)."""
    from posttrain.rollout import PromptFormatter, SamplingParams
    from posttrain.train.evaluate import config_eval_runner

    if not examples:
        return []
    runner = config_eval_runner(cfg, model, tok, PromptFormatter(tok, chat=cfg.task.chat_template))
    runner.run(
        examples,
        [1] * len(examples),
        SamplingParams(temperature=0.0, max_new_tokens=cfg.rollout.max_new_tokens, logprobs=False),
    )
    rows, seen = [], set()
    for s in runner.last_sessions:
        if id(s.env) in seen:
            continue
        seen.add(id(s.env))
        res = s.env.case_result()
        row = res.row()
        row.update(
            example_id=s.example.id,
            truncated=bool(s.truncated),
            valid_calls=s.env.metrics().get("silo_valid_calls", 0.0),
            messages_per_agent=res.message_counts.get("code", 0) / res.num_agents,
        )
        rows.append(row)
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Means of S, P, C_code, D_code, the solved share and the failure modes, overall and by (level, N)."""
    keys = (
        "S",
        "P",
        "C_code",
        "D_code",
        "success",
        "premature_submission",
        "consensus_failure",
        "computation_error",
        "valid_calls",
        "messages_per_agent",
    )

    def mean(rs: list[dict[str, Any]]) -> dict[str, float]:
        return {k: sum(float(r[k]) for r in rs) / len(rs) for k in keys} | {"n": len(rs)} if rs else {"n": 0}

    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(f"L{r['level']}_n{r['num_agents']}", []).append(r)
    return {"all": mean(rows), "by_level_n": {k: mean(v) for k, v in sorted(by.items())}}


def _gate(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if r.get("kind") == "step"]
    if not steps:
        return {"steps": 0}

    def m(k: str) -> float:
        return sum(float(r.get(k, 0.0)) for r in steps) / len(steps)

    return {
        "steps": len(steps),
        "mixed_groups_mean": 1.0 - m("zero_var_frac"),
        "silo_success_first": float(steps[0].get("silo_success", 0.0)),
        "silo_success_last": float(steps[-1].get("silo_success", 0.0)),
        "valid_calls_mean": m("silo_valid_calls"),
        "messages_per_agent_mean": m("silo_messages_per_agent"),
    }


def _paired(after: list[dict[str, Any]], before: list[dict[str, Any]]) -> dict[str, float]:
    from posttrain.utils.stats import paired_gain

    b = {r["example_id"]: float(r["S"]) for r in before}
    a = {r["example_id"]: float(r["S"]) for r in after}
    ids = sorted(set(a) & set(b))
    if not ids:
        return {"diff": 0.0, "se": 0.0, "n": 0}
    g = paired_gain([b[i] for i in ids], [a[i] for i in ids])
    return {"diff": g["gain"], "se": g["se"], "n": len(ids)}


def run_silo_experiment(
    out_dir: str | Path = "runs/silo-rl-experiment",
    *,
    arms: tuple[str, ...] = ARMS,
    seeds: tuple[int, ...] = (0, 1, 2),
    steps: int | None = None,
    sft_steps: int = 60,
    sft_lr: float = 5e-5,
    sft_overlong: str = "error",
    precheck_n: int = 16,
    overrides: list[str] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool | None = None,
) -> dict[str, Any]:
    from posttrain.models import load_model_and_tokenizer
    from posttrain.models.saving import save_model_dir
    from posttrain.tasks import get_task
    from posttrain.train.config import RLConfig
    from posttrain.train.rl import train_to_end
    from posttrain.train.run_dir import prepare_driver_dir
    from posttrain.train.sft import sft_warm_start
    from posttrain.utils.config import build_config
    from posttrain.utils.tables import print_table

    bad = [a for a in arms if a not in ARMS]
    if bad:
        raise InvalidValueError(f"silo rl-experiment: unknown arm(s) {bad}; known: {', '.join(ARMS)}")
    out = prepare_driver_dir(out_dir, "silo rl-experiment", resume=resume, overwrite=overwrite)
    extra = [f"steps={steps}"] if steps is not None else []
    cfg = build_config(RLConfig, config_path(), [*extra, *(overrides or [])])
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    task = get_task(cfg.task.name, **cfg.task.params)
    env_params = dict(cfg.rollout.runner.params.get("env_params") or {})
    t0 = time.perf_counter()

    # 1. the warm start
    warm = out / "warm" / "model"
    if not (warm / "config.json").is_file():
        rows, rounds = warm_start_rows(task.split("train"), env_params)
        limit = int(env_params.get("max_rounds", 8))
        if rounds > limit:
            print(
                f"[silo-rl] WARNING: the scripted agents need up to {rounds} rounds, the environment allows "
                f"{limit} (rollout.runner.params.env_params.max_rounds): the warm start's protocol cannot "
                "finish within the RL episodes",
                flush=True,
            )
        model, tok = load_model_and_tokenizer(
            cfg.model.name, dtype=cfg.model.dtype, device="cpu", seed=cfg.seed
        )
        print(
            f"[silo-rl] warm start: SFT on {len(rows)} scripted seat conversations, {sft_steps} steps",
            flush=True,
        )
        sft_warm_start(cfg, model, tok, steps=sft_steps, lr=sft_lr, seed=cfg.seed, out_dir=out / "warm",
                       progress=progress, rows=rows, batch_size=8, overwrite=True, overlong=sft_overlong)  # fmt: skip
        save_model_dir(model, tok, warm)

    def load(spec: str, seed: int) -> tuple[Any, Any]:
        return load_model_and_tokenizer(spec, dtype=cfg.model.dtype, device="cpu", seed=seed)

    # 2. the pre-check: the warm start's S on training cases, per task
    pre_path = out / "precheck.json"
    if pre_path.is_file():
        pre = json.loads(pre_path.read_text())
    else:
        model, tok = load(str(warm), cfg.seed)
        rows = evaluate_cases(model, tok, cfg, task.split("train")[:precheck_n])
        per: dict[str, list[float]] = {}
        for r in rows:
            per.setdefault(r["task_id"], []).append(float(r["S"]))
        pre = {
            "n": len(rows),
            "S_mean": sum(float(r["S"]) for r in rows) / max(len(rows), 1),
            "by_task": {
                t: {"S": sum(v) / len(v), "n": len(v), "in_range": 0.1 <= sum(v) / len(v) <= 0.9}
                for t, v in sorted(per.items())
            },
        }
        pre["in_range"] = 0.1 <= pre["S_mean"] <= 0.9
        atomic_write_json(pre_path, pre)
    print(
        f"[silo-rl] pre-check: warm start S on {pre['n']} training cases = {pre['S_mean']:.3f} "
        + ("(in 10-90 %: RL can act)" if pre["in_range"] else "(OUTSIDE 10-90 %: RL has little to act on)")
        + "; by task: "
        + ", ".join(f"{t} {v['S']:.2f}" for t, v in pre["by_task"].items()),
        flush=True,
    )

    # 3-4. arms x seeds, each evaluated on the held-out splits as it finishes
    results: dict[str, dict[int, dict[str, Any]]] = {}
    for arm in arms:
        for seed in seeds if arm != "sft" else seeds[:1]:  # the warm start is greedy: one evaluation
            folder = out / arm / f"seed{seed}"
            done = folder / "eval.json"
            if done.is_file():
                results.setdefault(arm, {})[seed] = json.loads(done.read_text())
                print(f"[silo-rl] {arm} seed {seed}: kept from {done}", flush=True)
                continue
            folder.mkdir(parents=True, exist_ok=True)
            policy, gate = str(warm), {}
            if arm != "sft":
                rcfg = build_config(
                    RLConfig, config_path(), [*extra, *(overrides or []), *ARM_OVERRIDES[arm]]
                )
                rcfg.seed, rcfg.model.name, rcfg.out_dir = seed, str(warm), str(folder / "rl")
                rcfg.checkpoint.every = 5
                train_to_end(rcfg, progress=progress, label=f"[silo-rl] {arm} seed {seed}")
                policy, gate = str(folder / "rl" / "model"), _gate(folder / "rl")
            model, tok = load(policy, seed)
            ev: dict[str, Any] = {"arm": arm, "seed": seed, "gate": gate, "splits": {}}
            for split in SPLITS:
                rows = evaluate_cases(model, tok, cfg, task.split(split))
                ev["splits"][split] = {"rows": rows, "summary": summarize(rows)}
            atomic_write_json(done, ev)
            results.setdefault(arm, {})[seed] = ev
            s = ev["splits"]["heldout"]["summary"]["all"]
            print(f"[silo-rl] {arm} seed {seed}: held-out S {s.get('S', 0.0):.3f} (n={s['n']})", flush=True)

    # paired differences against the warm start, per seed and pooled
    paired: dict[str, Any] = {}
    base = results.get("sft", {}).get(seeds[0])
    for arm in (a for a in arms if a != "sft"):
        for split in SPLITS:
            if base is None:
                continue
            per_seed = {
                str(s): _paired(ev["splits"][split]["rows"], base["splits"][split]["rows"])
                for s, ev in results.get(arm, {}).items()
            }
            diffs = [v["diff"] for v in per_seed.values()]
            m = sum(diffs) / len(diffs) if diffs else 0.0
            sd = (sum((d - m) ** 2 for d in diffs) / (len(diffs) - 1)) ** 0.5 if len(diffs) > 1 else 0.0
            paired[f"{arm}-sft/{split}"] = {
                "diff_mean": m,
                "se_seeds": sd / max(len(diffs), 1) ** 0.5,
                "by_seed": per_seed,
            }
    summary = {
        "model": cfg.model.name,
        "task": {"name": cfg.task.name, **task.params()},
        "env_params": env_params,
        "budget": {
            "steps": cfg.steps,
            "prompts_per_step": cfg.rollout.prompts_per_step,
            "group_size": cfg.rollout.group_size,
        },
        "precheck": pre,
        "arms": {
            arm: {
                str(s): {"gate": ev["gate"], **{sp: ev["splits"][sp]["summary"] for sp in SPLITS}}
                for s, ev in per.items()
            }
            for arm, per in results.items()
        },
        "paired": paired,
        "wall_s_this_call": time.perf_counter() - t0,
    }
    atomic_write_json(out / "summary.json", summary)
    table = []
    for arm, per in results.items():
        for s, ev in sorted(per.items()):
            row = [f"{arm} s{s}"]
            for sp in SPLITS:
                a = ev["splits"][sp]["summary"]["all"]
                row += [a.get("S", float("nan")), a.get("P", float("nan"))]
            row += [
                ev["gate"].get("mixed_groups_mean", float("nan")),
                ev["splits"]["heldout"]["summary"]["all"].get("valid_calls", float("nan")),
            ]
            table.append(row)
    print_table(
        f"silo rl-experiment: {cfg.model.name}, tasks {task.params()['tasks']}, N {task.params()['agents']}",
        ["arm", "held-out S", "held-out P", "ood S", "ood P", "mixed groups", "valid calls"],
        table,
    )
    if paired:
        print_table(
            "S difference to the warm start, paired over cases (mean over seeds, SE of the seeds)",
            ["pair", "diff", "SE seeds"],
            [[k, v["diff_mean"], v["se_seeds"]] for k, v in paired.items()],
        )
    return summary


__all__ = ["ARMS", "evaluate_cases", "run_silo_experiment", "summarize", "warm_start_rows"]
