"""`posttrain bench rl-step --async`: synchronous vs asynchronous RL on the same budget (docs/async.md).

Two arms train the same model on the same prompts and seeds for the same number of steps (so the same
number of rollouts: ``steps · prompts · group_size``):

- **sync**: the synchronous loop (``rollout.max_staleness: 0``) with ``sync_threads`` torch threads
  (2), generation and training one after the other;
- **sync_1t**: the synchronous loop with the trainer's single thread (a control, see ``ARMS``);
- **async**: ``rollout.max_staleness: max_staleness`` (1, one-step-off), the trainer with
  ``trainer_threads`` (1) and one Ray generation worker with ``gen_threads`` (1): the same 2 CPUs,
  split between generation and training, which overlap.

Each arm's run is an ``RLTrainer(...).train()`` writing its own run folder; once it finishes its
figures go to ``<out>/<arm>-seed<seed>.json`` at once, and a rerun with the same ``out`` skips every
arm whose JSON exists with the same settings (resumable per arm and seed). Reported per arm: wall time
per 100 rollouts over the steady steps (every step but the first, which loads Ray, the workers and
warms the kernels), the time split (generation or waiting for groups, forwards, update), generator
and trainer utilisation, the async arm's staleness, and the held-out accuracy after the budget; then
the throughput ratio sync / async and the accuracy difference, paired over seeds (mean ± SE).
"""

from __future__ import annotations

import json
import math
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError

#: ``sync_1t`` is a control: the synchronous loop with the trainer's single thread, which tells the
#: overlap's gain apart from what 2 torch threads cost or give on this machine (tiny models on a busy
#: CPU run faster with 1 thread).
ARMS = ("sync", "sync_1t", "async")


@dataclass(frozen=True)
class AsyncBenchSpec:
    """One comparison: model, batch (prompts x completions x new tokens), steps, seeds and threads."""

    model: str = "tiny"
    num_prompts: int = 8
    group_size: int = 8
    new_tokens: int = 8
    steps: int = 8
    seeds: int = 1
    max_staleness: int = 1
    sync_threads: int = 2
    trainer_threads: int = 1
    gen_threads: int = 1
    lr: float = 1e-5
    precision: str = "fp32"
    engine: str = "fast"
    eval_n: int = 32
    task_params: str = '{digits: 2, ops: "+", n_train: 400, n_heldout: 64}'
    chat_template: bool = False
    prompt_template: str = "{prompt}"
    reward: str = "exact_match"

    def __post_init__(self) -> None:
        for key in ("num_prompts", "group_size", "new_tokens", "seeds", "max_staleness", "eval_n"):
            if getattr(self, key) < 1:
                raise InvalidValueError(f"rl-step --async: {key} must be >= 1, got {getattr(self, key)}")
        if self.steps < 2:
            raise InvalidValueError(
                f"rl-step --async: steps must be >= 2 (the first is warm-up), got {self.steps}"
            )

    @property
    def rollouts(self) -> int:
        return self.steps * self.num_prompts * self.group_size


def arm_overrides(spec: AsyncBenchSpec, arm: str, seed: int, out_dir: Path) -> list[str]:
    """The ``posttrain rl`` overrides of one arm and seed."""
    if arm not in ARMS:
        raise InvalidValueError(f"rl-step --async: unknown arm {arm!r}; arms: {', '.join(ARMS)}")
    common = [
        f"model.name={spec.model}",
        "model.device=cpu",
        f"model.precision={spec.precision}",
        f"task.params={spec.task_params}",
        f"task.chat_template={str(spec.chat_template).lower()}",
        f"task.prompt_template={json.dumps(spec.prompt_template)}",  # quoted: {prompt} is a YAML mapping
        f"reward.name={spec.reward}",
        "reward.num_workers=0",
        f"rollout.prompts_per_step={spec.num_prompts}",
        f"rollout.group_size={spec.group_size}",
        f"rollout.max_new_tokens={spec.new_tokens}",
        f"rollout.engine.name={spec.engine}",
        f"optimizer.lr={spec.lr}",
        f"steps={spec.steps}",
        f"seed={seed}",
        f"eval.n={spec.eval_n}",
        # the warm start's held-out accuracy too: the gate that says whether the budget moved it
        "eval.at_start=true",
        "checkpoint.final=false",
        "logging.every=0",
        "logging.samples_every=0",
        f"out_dir={out_dir}",
    ]
    if arm == "sync":
        return [*common, f"threads={spec.sync_threads}"]
    if arm == "sync_1t":
        return [*common, f"threads={spec.trainer_threads}"]
    return [
        *common,
        f"threads={spec.trainer_threads}",
        f"rollout.max_staleness={spec.max_staleness}",
        "rollout.generators.num=1",
        f"rollout.generators.threads={spec.gen_threads}",
        f"rollout.generators.num_cpus={spec.gen_threads}",
    ]


#: The task settings of the real-model preset (``smol``), where the tiny model's default (the plain
#: ``12+34=`` prompt, exact match on the first line) gives RL no signal: SmolLM2-135M-Instruct scored
#: 0/64 greedy on it with 32 new tokens, and 0 reward in 8 sampled steps; with its chat template it talks
#: about the number (9 % right by the last number, 73 % of answers cut at 32 tokens). Asked "What is
#: 12+34=? Reply with the number only." it scored 11/64 (17 %) greedy, by the last number of the answer,
#: none cut off (12.5 tokens on average).
PRESET_TASK: dict[str, dict[str, Any]] = {
    "smol": {
        "chat_template": True,
        "prompt_template": "What is {prompt}? Reply with the number only.",
        "reward": "last_number",
        "lr": 2e-5,
        "eval_n": 64,
    }
}


def summarise_arm(
    rows: list[dict[str, float]],
    spec: AsyncBenchSpec,
    eval_end: dict[str, Any],
    eval_start: dict[str, Any] | None = None,
) -> dict:
    """An arm's figures from its per-step metrics (the first step left out as warm-up)."""
    steady = rows[1:]
    wall = sum(r["time_step"] for r in steady)
    per_step = spec.num_prompts * spec.group_size
    out: dict[str, Any] = {
        "steps": len(rows),
        "steady_steps": len(steady),
        "steady_wall_s": wall,
        "wall_per_100_rollouts_s": 100.0 * wall / (len(steady) * per_step),
        "time_generation_s": sum(r["time_generation"] for r in steady),
        "time_forward_s": sum(r["time_forward_overlap"] for r in steady),
        "time_update_s": sum(r["time_update"] for r in steady),
        "heldout_accuracy": eval_end.get("accuracy"),
        "heldout_accuracy_start": (eval_start or {}).get("accuracy"),
        "reward_mean_first": rows[0]["reward_mean"],
        "reward_mean_last": rows[-1]["reward_mean"],
        "zero_var_frac_mean": statistics.fmean(r["zero_var_frac"] for r in rows),
    }
    if "staleness_max" in rows[-1]:  # asynchronous: the trainer waits in the rollout phase
        out["time_wait_groups_s"] = sum(r["time_wait_groups"] for r in steady)
        out["trainer_util"] = 1.0 - out["time_wait_groups_s"] / max(wall, 1e-9)
        out["generator_util"] = rows[-1]["generator_util"]
        out["staleness_mean"] = statistics.fmean(r["staleness_mean"] for r in steady)
        out["staleness_max"] = max(r["staleness_max"] for r in rows)
        out["stale_regenerated"] = rows[-1]["stale_regenerated_total"]
    else:  # one thread of control: generation and training take turns on the same cores
        out["generator_util"] = out["time_generation_s"] / max(wall, 1e-9)
        out["trainer_util"] = 1.0 - out["generator_util"]
    return out


def run_arm(spec: AsyncBenchSpec, arm: str, seed: int, out: Path) -> dict[str, Any]:
    """Train one arm and seed (its run folder ``<out>/runs/<arm>-seed<seed>``) and summarise it."""
    from posttrain.train.config import load_rl_config
    from posttrain.train.rl import DegenerateSettingWarning, RLTrainer

    cfg = load_rl_config(None, arm_overrides(spec, arm, seed, out / "runs" / f"{arm}-seed{seed}"))
    rows: list[dict[str, float]] = []
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        with RLTrainer(cfg) as tr:
            real = tr.step

            def step() -> dict[str, float]:
                m = real()
                rows.append(m)
                return m

            tr.step = step
            summary = tr.train(progress=False, overwrite=True)
    res = summarise_arm(rows, spec, summary.get("eval_end") or {}, summary.get("eval_start"))
    res.update(arm=arm, seed=seed, total_wall_s=time.perf_counter() - t0, spec=asdict(spec))
    return res


def run_comparison(
    spec: AsyncBenchSpec, out: Path, *, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Every arm and seed (skipping finished ones whose JSON holds the same spec), then the paired
    comparison. Each finished arm's JSON is written as it completes."""
    from posttrain.utils.io import atomic_write_json

    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[int, dict[str, Any]]] = {a: {} for a in ARMS}
    for seed in range(spec.seeds):
        for arm in ARMS:
            path = out / f"{arm}-seed{seed}.json"
            if path.is_file():
                done = json.loads(path.read_text(encoding="utf-8"))
                if done.get("spec") == asdict(spec):
                    results[arm][seed] = done
                    if log:
                        log(f"{arm} seed {seed}: done before ({path})")
                    continue
            if log:
                log(f"{arm} seed {seed}: training {spec.steps} steps ...")
            res = run_arm(spec, arm, seed, out)
            atomic_write_json(path, res)
            results[arm][seed] = res
            if log:
                log(f"{arm} seed {seed}: {res['wall_per_100_rollouts_s']:.2f} s / 100 rollouts -> {path}")
    return compare(spec, results)


def _mean_se(xs: list[float]) -> tuple[float, float]:
    m = statistics.fmean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")
    return m, se


def compare(spec: AsyncBenchSpec, results: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """Per seed: throughput ratio sync wall / async wall (> 1: async is faster; also against the
    1-thread control) and the held-out accuracy difference async − sync; means with the SE over seeds."""
    seeds = sorted(set.intersection(*(set(results[a]) for a in ARMS)))

    def ratio(base: str) -> list[float]:
        return [
            results[base][s]["wall_per_100_rollouts_s"] / results["async"][s]["wall_per_100_rollouts_s"]
            for s in seeds
        ]

    ratios = ratio("sync")
    acc = [
        results["async"][s]["heldout_accuracy"] - results["sync"][s]["heldout_accuracy"]
        for s in seeds
        if results["async"][s]["heldout_accuracy"] is not None
        and results["sync"][s]["heldout_accuracy"] is not None
    ]
    out: dict[str, Any] = {"spec": asdict(spec), "arms": results, "seeds": seeds}
    if ratios:
        out["throughput_ratio"], out["throughput_ratio_se"] = _mean_se(ratios)
        out["throughput_ratio_vs_1t"], out["throughput_ratio_vs_1t_se"] = _mean_se(ratio("sync_1t"))
    if acc:
        out["accuracy_diff"], out["accuracy_diff_se"] = _mean_se(acc)
    return out


def print_report(result: dict[str, Any], console: Any = None) -> None:
    """The arms side by side (means over seeds), then the paired ratio and accuracy difference."""
    from rich.console import Console

    from posttrain.utils.tables import print_table

    console = console or Console()
    spec = result["spec"]
    keys = [
        ("wall_per_100_rollouts_s", "s / 100 rollouts"),
        ("time_generation_s", "rollout phase s (gen or wait)"),
        ("time_forward_s", "forwards s"),
        ("time_update_s", "update s"),
        ("generator_util", "generator util"),
        ("trainer_util", "trainer util"),
        ("staleness_mean", "staleness mean"),
        ("staleness_max", "staleness max"),
        ("stale_regenerated", "stale regenerated"),
        ("heldout_accuracy_start", "held-out accuracy, warm start"),
        ("heldout_accuracy", "held-out accuracy after the budget"),
        ("reward_mean_first", "reward mean, first step"),
        ("reward_mean_last", "reward mean, last step"),
        ("zero_var_frac_mean", "zero-variance groups (mean)"),
    ]
    rows = []
    for key, label in keys:
        row = [label]
        for arm in ARMS:
            vals = [r[key] for r in result["arms"][arm].values() if r.get(key) is not None]
            row.append(statistics.fmean(vals) if vals else "-")
        rows.append(row)
    title = (
        f"sync ({spec['sync_threads']} threads) vs async (max_staleness {spec['max_staleness']}: trainer "
        f"{spec['trainer_threads']} + generator {spec['gen_threads']} threads), model {spec['model']}, "
        f"{spec['num_prompts']}x{spec['group_size']}x{spec['new_tokens']}, {spec['steps']} steps "
        f"(first = warm-up), seeds {len(result['seeds'])}"
    )
    print_table(title, ["", *ARMS], rows, console=console)
    if "throughput_ratio" in result:
        console.print(
            f"throughput ratio async/sync: {result['throughput_ratio']:.2f}x "
            f"(SE {result['throughput_ratio_se']:.2f} over {len(result['seeds'])} seeds; target 1.4x); "
            f"against the 1-thread synchronous control: {result['throughput_ratio_vs_1t']:.2f}x "
            f"(SE {result['throughput_ratio_vs_1t_se']:.2f})"
        )
    if "accuracy_diff" in result:
        console.print(
            f"held-out accuracy async - sync: {result['accuracy_diff']:+.3f} (SE {result['accuracy_diff_se']:.3f})"
        )
