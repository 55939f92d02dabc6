"""``posttrain bench ablation``: GRPO, DGPO, MASPO, E3, ASRR, DAPO and E3+ASRR+DGPO from one warm start.

Every arm starts from the same SFT warm start per seed (the demo's, :func:`posttrain_lab.demos.tiny.
sft_warm_start`, on the mixed set of :func:`warm_start_pairs` by default), uses the demo's RL settings
(tiny model, 2-digit scratchpad addition, 16 prompts × 8 completions per step, 72 new tokens, lr 1e-4)
on the same training questions, and differs only in the overrides of its arm (:data:`ARMS`).

Two settings differ from the demo, for every arm alike:

* **Mixed warm start** (``warm_start="mixed"``). The demo's SFT set is scratchpad-only, so a model
  prompted with ASRR's No-Thinking prefix has never seen it and cannot answer (0 % held-out). ASRR
  (arXiv:2505.15400) starts from a reasoning model that, after "I have finished thinking", either
  answers at once or keeps reasoning in its answer ("Continue-Thinking"). The mixed set gives the
  tiny model both: for every training question (a) the plain prompt → the scratchpad (thinking
  mode), (b) prompt + prefix → the one-line direct answer (the task's ``short`` completion) and
  (c) prompt + prefix → the scratchpad (self-recovery). Arms without the prefix only ever see (a)'s
  prompt format at RL time.
* **Two minibatches per step** (``minibatches=2``). With one on-policy update the ratio is exactly 1
  and the PPO-clip (GRPO), DGPO and MASPO gradients coincide (the runs were bit-identical); with two
  AdamW updates per rollout batch the second half is off-policy and the objectives differ.

The per-step rollout budget is the same for all arms except DAPO, whose dynamic sampling draws extra
rounds; the rollouts each arm spent are reported.

Outputs in the output folder: ``ablation.json`` (everything), ``ablation.md`` (the table) and
``ablation.png`` (held-out accuracy, mean response length, entropy, temperature, rollouts spent and
zero-variance share over steps, mean over seeds); each run in its own fresh folder ``runs/<arm>-s<seed>``.
What the numbers show, and why some claims do not hold at this scale: ``docs/sampling-methods.md``.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError
from posttrain.utils.stats import mean_se
from posttrain_lab.recipes.asrr.hooks import NO_THINKING_PREFIX

_E3 = [
    "hooks.sampler={name: e3, params: {g_min: 4, g_max: 12, widen: 2}}",
    "hooks.controllers=[{name: e3-temperature, params: {anneal: true}}]",
]
_PREFIX = f"task.assistant_prefix={json.dumps(NO_THINKING_PREFIX)}"
_ASRR = [_PREFIX, "hooks.shapers=[{name: asrr, params: {beta: 0.5, window: 24, tau: 1.0}}]"]

#: Arm name -> config overrides on top of the base (``configs/demo.yaml`` + the bench's settings).
ARMS: dict[str, list[str]] = {
    "grpo": ["objective.name=ppo"],
    "dgpo": ["objective.name=dgpo"],
    "maspo": ["objective.name=maspo"],
    "e3": ["objective.name=ppo", *_E3],
    "asrr": ["objective.name=ppo", *_ASRR],
    "dapo": [
        "objective.name=dapo",
        "objective.agg=token-mean",
        "hooks.filter={name: dynamic-sampling, params: {max_rounds: 10}}",
        "hooks.shapers=[{name: dapo-overlong, params: {max_length: 72, buffer: 16}}]",
    ],
    "e3-asrr-dgpo": ["objective.name=dgpo", *_E3, *_ASRR],
    # ASRR's control: the No-Thinking prefix alone, without the length penalty (on a model that was not
    # trained with the prefix, the prefix itself changes accuracy and length). The ASRR shaper with
    # beta 0 changes no reward and reports the Continue-Thinking ratio, which is ASRR's metric
    "nothink": ["objective.name=ppo", _PREFIX, "hooks.shapers=[{name: asrr, params: {beta: 0.0}}]"],
    # replay and curriculum (docs/replay-and-curriculum.md; NexGRPO and APARL are proposed designs)
    "nexgrpo": ["objective.name=ppo", "hooks.replay={name: nexgrpo}"],
    "random-failure": ["objective.name=ppo", "hooks.replay={name: random-failure}"],
    "success": ["objective.name=ppo", "hooks.replay={name: success}"],
    "aparl": [
        "objective.name=ppo",
        "hooks.sampler.name=aparl",
        "hooks.filter={name: dynamic-sampling, params: {max_rounds: 10}}",  # APARL's inner loop
    ],
}


def _smol_demo_config() -> dict[str, Any]:
    from importlib.resources import files

    import yaml

    return yaml.safe_load((files("posttrain_lab.demos") / "demo_smol.yaml").read_text())


def _smol_task_params(**changes: Any) -> str:
    """The demo smol task's params as a flow mapping, with ``changes`` (its ``ood`` split is left out:
    the ablation evaluates the trained types' held-out prompts)."""
    import json

    params = {
        k: v for k, v in _smol_demo_config()["task"]["params"].items() if k not in ("ood_types", "n_ood")
    }
    params.update(changes)
    return ", ".join(f"{k}: {json.dumps(v)}" for k, v in params.items())


def _smol_reward() -> list[str]:
    import json

    reward = _smol_demo_config()["reward"]
    return [f"reward.name={reward['name']}", f"reward.params={json.dumps(reward.get('params') or {})}"]


#: ``--task``: the task overrides of every run. dialogue-events adds in-domain / OOD accuracy and
#: macro-F1 columns (:func:`task_scores`) and generates at most 12 tokens (labels are <= 9 characters).
TASKS: dict[str, Callable[[Any], list[str]]] = {
    "arithmetic": lambda s: [
        f'task.params={{digits: 2, ops: "+", n_train: {s.n_train}, n_heldout: 200, format: scratchpad, seed: 0}}'
    ],
    # real built-in model (``--model smollm2-135m``): chat tasks, its own rewards, no SFT warm start
    "word_problems": lambda s: [
        "task.name=word_problems",
        f"task.params={{steps: {s.wp_steps}, max_value: {s.wp_max_value}, n_train: {s.n_train}, n_heldout: {max(s.eval_n, 50)}, seed: 0}}",
        "task.chat_template=true",
        # the model reasons before it answers ("9 - 5 = 4 ... She has 4"): read the last number, not the
        # first line (with `numeric` the pre-check gave 0.000 at 16 tokens)
        "reward.name=last_number",
    ],
    # the task and reward of `posttrain demo smol` (one source, demos/demo_smol.yaml): five IFEval types the
    # warm start follows on 25-65 % of prompts, scored by the demo's guarded reward (the checker, -1 when a
    # hack probe fires; issue 40: with the bare checker and postscript alone every arm reached 1.00 by
    # stacking `P.S.` lines). The demo's overlong shaper and temperature are not taken: the arms' own hooks
    # and sampling are what the ablation compares
    "instructions": lambda s: [
        "task.name=instructions",
        f"task.params={{{_smol_task_params(n_train=s.n_train, n_heldout=max(s.eval_n, 50))}}}",
        "task.chat_template=true",
        *_smol_reward(),
    ],
    "dialogue-events": lambda s: [
        "task.name=dialogue-events",
        f"task.params={{n_train: {s.n_train}, n_heldout: 200, n_ood: 200, seed: 0}}",
        f"rollout.max_new_tokens={min(s.max_new_tokens, 12)}",
    ],
}


#: SFT warm-start sets: the demo's scratchpad-only set, or the mixed set of :func:`warm_start_pairs`.
WARM_STARTS = ("mixed", "scratchpad")


def warm_start_pairs(task: Any, mode: str = "mixed") -> list[tuple[str, str]] | None:
    """The SFT set of the warm start shared by all arms (None = the demo's: scratchpad completions of
    the plain prompts). ``mixed``: for every training question, in this order, (prompt → scratchpad),
    (prompt + No-Thinking prefix → one-line direct answer), (prompt + prefix → scratchpad), so that
    after the prefix the model can either answer at once or keep reasoning (ASRR's starting point,
    arXiv:2505.15400 §3: a reasoning model that may answer directly or "Continue-Thinking")."""
    if mode == "scratchpad":
        return None
    if mode != "mixed":
        raise InvalidValueError(f"warm start must be one of {', '.join(WARM_STARTS)}, got {mode!r}")
    out: list[tuple[str, str]] = []
    for ex in task.split("train"):
        long, short = task.reference_completion(ex, "long"), task.reference_completion(ex, "short")
        no_think = ex.prompt + NO_THINKING_PREFIX
        out += [(ex.prompt, long), (no_think, short), (no_think, long)]
    return out


@dataclass
class AblationSettings:
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    steps: int = 60
    sft_steps: int = (
        1050  # the mixed set has 3 rows per question: 1050 steps = the demo's 350 of scratchpad exposure
    )
    prompts_per_step: int = 16
    group_size: int = 8
    max_new_tokens: int = 72
    n_train: int = 320  # 20 steps per epoch at 16 prompts/step: E3 ranks at steps 21 and 41
    eval_n: int = 200
    eval_every: int = 15
    dapo_max_rounds: int = 10  # verl's max_num_gen_batches
    task: str = "arithmetic"  # a key of TASKS
    warmup_frac: float = 0.25  # steps before this share of the run are E3's warm-up (entropy claim)
    warm_start: str = "mixed"  # "mixed" (warm_start_pairs) or "scratchpad" (the demo's SFT set)
    minibatches: int = 2  # AdamW updates per rollout batch: > 1 makes GRPO / DGPO / MASPO differ
    jobs: int = 1  # worker processes, one seed each (2 on a 2-core machine halves the wall time)
    # sequences per forward/backward (gradient accumulation; same update, less memory): None = a whole
    # minibatch. The real model at group size 8 (32 rows per update) reached 12.4 GB RSS and was OOM-killed
    micro_batch_size: int | None = None
    model: str = "tiny"  # "tiny" (SFT warm start first) or a real model such as smollm2-135m (no SFT)
    lr: float | None = None  # None: the base config's (1e-4 tiny; 2e-5 for a real model)
    wp_steps: int = 1  # word_problems operations per problem
    wp_max_value: int = 10  # word_problems largest start amount (38 % at start with 128 tokens)
    extra: list[str] = field(default_factory=list)

    @property
    def real(self) -> bool:
        return self.model != "tiny"

    @property
    def workers(self) -> int:
        """Worker processes the seeds run in: ``jobs``, but no more than there are seeds."""
        return min(self.jobs, len(self.seeds))

    @classmethod
    def quick(cls, **kw: Any) -> AblationSettings:
        """Small enough for a test: 2 RL steps, 10 SFT steps, 4 prompts x 4, 12 tokens, 8 eval questions,
        DAPO capped at 2 rounds."""
        base = dict(
            seeds=[0],
            steps=2,
            sft_steps=10,
            prompts_per_step=4,
            group_size=4,
            max_new_tokens=12,
            n_train=8,
            eval_n=8,
            eval_every=2,
            dapo_max_rounds=2,
        )
        return cls(**{**base, **kw})

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or not self.arms:
            raise InvalidValueError(
                f"--arms: unknown arm(s) {unknown or '(none)'}; choose from {', '.join(ARMS)}"
            )
        if not self.seeds:
            raise InvalidValueError("--seeds: give at least one seed")
        if self.task not in TASKS:
            raise InvalidValueError(f"--task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.warm_start not in WARM_STARTS:
            raise InvalidValueError(
                f"--warm-start must be one of {', '.join(WARM_STARTS)}, got {self.warm_start!r}"
            )
        if self.jobs < 1:
            raise InvalidValueError(f"--jobs must be >= 1, got {self.jobs}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise InvalidValueError(f"--micro-batch-size must be >= 1, got {self.micro_batch_size}")
        if self.minibatches < 1:
            raise InvalidValueError(f"--minibatches must be >= 1, got {self.minibatches}")
        if self.real and self.task in ("arithmetic", "dialogue-events"):
            raise InvalidValueError(
                f"--task {self.task} is for the tiny model; with --model {self.model} use word_problems or instructions"
            )
        if not self.real and self.task in ("word_problems", "instructions"):
            raise InvalidValueError(f"--task {self.task} needs a real model (--model smollm2-135m)")
        if not 4 <= self.group_size <= 12:
            raise InvalidValueError(
                f"--group-size must lie in [4, 12] (E3's budget bounds), got {self.group_size}"
            )


def real_model_threads(s: AblationSettings, cpus: int | None = None) -> int:
    """torch threads of each real-model run: the CPUs shared out over the worker processes."""
    import os

    return max(1, (cpus or os.cpu_count() or 1) // s.workers)


REAL_REPLAY_START_STEP = 2
"""Real model: the replay arms replay from this step on (the store holds the first step's groups)."""


def arm_overrides(s: AblationSettings, arm: str, seed: int, run_dir: Path) -> list[str]:
    """The overrides of one run: the bench's shared settings, then the arm's own."""
    tokens = s.max_new_tokens
    shared = [
        f"rollout.prompts_per_step={s.prompts_per_step}",
        f"rollout.group_size={s.group_size}",
        f"rollout.max_new_tokens={tokens}",
        *TASKS[s.task](s),
        f"steps={s.steps}",
        f"minibatches={s.minibatches}",
        *([f"micro_batch_size={s.micro_batch_size}"] if s.micro_batch_size else []),
        f"seed={seed}",
        f"eval.n={s.eval_n}",
        f"eval.every={s.eval_every}",
        "eval.at_start=true",
        "eval.at_end=true",
        "checkpoint.final=false",
        "logging.progress=false",
        f"out_dir={run_dir}",
    ]
    if s.real:  # the bench evaluates the start (once per seed) and the end itself, per question
        shared += [
            f"model.name={s.model}",
            f"optimizer.lr={s.lr or 2e-5}",
            "rollout.max_batch_size=32",
            # the CPU's native precision (bf16 autocast with AVX512-BF16/AMX, ~1.6x cheaper steps there;
            # fp32 on AVX2-only CPUs, where bf16 runs ~8x slower) and the fast decode loop
            # (docs/precision.md, docs/bench-generate.md)
            "model.precision=auto",
            "rollout.engine={name: fast}",
            # the base config's 1 thread suits the tiny model; the real model uses the cores its worker
            # process has (all of them at --jobs 1: with 1 thread it ran on one of two cores)
            f"threads={real_model_threads(s)}",
        ]
        shared = [o for o in shared if not o.startswith(("eval.at_start", "eval.at_end", "eval.every"))]
        shared += ["eval.at_start=false", "eval.at_end=false", "eval.every=0"]
    elif s.lr is not None:
        shared.append(f"optimizer.lr={s.lr}")
    own = [
        o.replace("max_length: 72", f"max_length: {tokens}").replace(
            "max_rounds: 10", f"max_rounds: {s.dapo_max_rounds}"
        )
        for o in ARMS[arm]
    ]
    own = [o.replace("window: 24", f"window: {max(1, tokens // 3)}") for o in own] if s.real else own
    if s.real:
        # replay's delayed start, calibrated (proposed): ExGRPO's "batch Pass@1 > 35 %" never triggered
        # on the real model, whose sampled accuracy at T = 1 is 3-16 % (2026-12-02: 0 trajectories
        # replayed in 12 steps); replay starts at step REAL_REPLAY_START_STEP, whatever the accuracy
        start = f", params: {{start_accuracy: 0.0, start_step: {REAL_REPLAY_START_STEP}}}}}"
        own = [o[:-1] + start if o.startswith("hooks.replay={name: ") else o for o in own]
    if tokens < 72:  # scale the DAPO buffer and ASRR window with the length limit
        own = [
            o.replace("buffer: 16", f"buffer: {max(1, tokens // 4)}").replace(
                "window: 24", f"window: {max(1, tokens // 3)}"
            )
            for o in own
        ]
    return [*shared, *own, *s.extra]


def run_ablation(
    s: AblationSettings,
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    resume: bool = False,
    summary_only: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every (seed, arm); write ablation.json / .md / .png into ``out_dir``; return the result.
    With ``s.jobs > 1`` the seeds run in that many worker processes (one seed each, one thread each).

    Each finished (arm, seed) is written at once to ``results/<arm>-s<seed>.json``; ``resume=True``
    keeps those and runs only the missing ones (the run folders of unfinished arms are replaced).
    ``summary_only=True`` runs nothing: it tabulates the finished (arm, seed) results in ``out_dir``
    (arms with some seeds missing are shown with the seeds they have). ``settings.json`` in ``out_dir``
    records the settings of its runs; resuming or summarising with other settings is refused."""

    out = Path(out_dir)
    runs = out / "runs"
    say = log or (lambda msg: None)
    if summary_only:
        check_settings(out, s, write=False)
        results = _finished_results(s, runs, say)
        return _write_result(s, out, runs, results, wall_s=0.0)
    if runs.exists() and any(runs.iterdir()) and not resume:
        if not overwrite:
            raise FileExistsError(
                f"{runs}: holds runs of an earlier ablation; pass --resume, --overwrite or choose another --out"
            )
        shutil.rmtree(runs)
        shutil.rmtree(out / "results", ignore_errors=True)
    runs.mkdir(parents=True, exist_ok=True)
    (out / "results").mkdir(parents=True, exist_ok=True)
    check_settings(out, s, write=True)
    t0 = time.perf_counter()
    results: dict[str, list[dict[str, Any]]] = {a: [] for a in s.arms}
    jobs = s.workers
    if jobs > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        say(f"seeds {s.seeds} in {jobs} worker processes (their progress goes to stderr)")
        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            per_seed = list(pool.map(_run_seed_logged, [(s, seed, runs) for seed in s.seeds]))
    else:
        per_seed = [run_seed(s, seed, runs, say) for seed in s.seeds]
    for by_arm in per_seed:
        for arm in s.arms:
            results[arm].append(by_arm[arm])
    return _write_result(s, out, runs, results, wall_s=time.perf_counter() - t0)


#: AblationSettings fields that may differ between invocations on one --out (what runs, not how)
_NOT_IDENTITY = ("arms", "seeds", "jobs", "micro_batch_size")


def settings_identity(s: AblationSettings) -> dict[str, Any]:
    """The settings that make two runs comparable (every field but :data:`_NOT_IDENTITY`)."""
    return {k: v for k, v in asdict(s).items() if k not in _NOT_IDENTITY}


def _settings_mismatch(saved: dict[str, Any], s: AblationSettings) -> str:
    """The keys whose saved value differs from ``s``'s identity, as "key: saved there, current now"
    ("" when they agree)."""
    from posttrain.utils.config import settings_diff

    diff = settings_diff(saved, settings_identity(s))
    return ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())


def check_settings(out: Path, s: AblationSettings, *, write: bool) -> None:
    """Refuse to mix runs made with other settings into ``out`` (``settings.json``: every field but
    arms, seeds, jobs and micro_batch_size). A folder without the file (made before it existed) gets it
    when ``write``."""
    from posttrain.utils.io import atomic_write_json

    path = out / "settings.json"
    if not path.exists():
        if write:
            atomic_write_json(path, settings_identity(s))
        return
    shown = _settings_mismatch(json.loads(path.read_text()), s)
    if shown:
        raise InvalidValueError(
            f"{path}: the runs in {out} were made with other settings ({shown}); use another --out"
        )


def _stored_result(s: AblationSettings, runs: Path, arm: str, seed: int) -> dict[str, Any]:
    """A finished (arm, seed) result as stored, its settings checked and its gate judged again with
    this version's rules from the run's logged steps where they are kept (a result written before a
    gate rule was fixed keeps no stale verdict)."""
    from posttrain.utils.io import read_jsonl

    p = _result_path(runs, arm, seed)
    res = json.loads(p.read_text())
    # results written since 2026-12-02 carry their settings; older ones rely on settings.json
    shown = _settings_mismatch(res["settings"], s) if "settings" in res else ""
    if shown:
        raise InvalidValueError(f"{p}: made with other settings ({shown})")
    rows_path = runs / f"{arm}-s{seed}" / "metrics.jsonl"
    if rows_path.exists():
        res["mech"] = mechanism_means([r for r in read_jsonl(rows_path) if r.get("kind") == "step"])
    res["gate"] = arm_gate(arm, res)
    return res


def _finished_results(s: AblationSettings, runs: Path, say: Callable[[str], None]) -> dict[str, list]:
    results: dict[str, list[dict[str, Any]]] = {}
    for arm in s.arms:
        for seed in s.seeds:
            p = _result_path(runs, arm, seed)
            if p.exists():
                results.setdefault(arm, []).append(_stored_result(s, runs, arm, seed))
            else:
                say(f"seed {seed} {arm}: no finished result ({p} missing), left out of the summary")
    if not results:
        raise FileNotFoundError(
            f"{runs.parent / 'results'}: no finished result for arms {s.arms} and seeds {s.seeds}"
        )
    return results


def _write_result(
    s: AblationSettings, out: Path, runs: Path, results: dict[str, list], *, wall_s: float
) -> dict[str, Any]:
    from posttrain.utils.io import atomic_write_json, atomic_write_text

    table = aggregate(results)
    result = {
        "settings": asdict(s),
        "arms": {a: ARMS[a] for a in results},
        "runs": results,
        "table": table,
        "claims": check_claims(table),
        "paired": paired_differences(results),
        "gates": {a: [r.get("gate") for r in rs] for a, rs in results.items()},
        "prechecks": _read_prechecks(runs, s.seeds),
        "wall_s": wall_s,
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "ablation.json", result)
    atomic_write_text(out / "ablation.md", markdown_table(result))
    result["plot"] = str(plot_ablation(results, out / "ablation.png"))
    return result


def _precheck_key(seed: int, cfg: Any) -> str:
    """The starting point an arm is compared with: the model before RL, prompted as the arm prompts it
    (arms that open the assistant turn with a prefix, ASRR and its control, start from their own)."""
    return f"{seed}-prefix" if cfg.task.assistant_prefix else str(seed)


def _precheck_text(pre: dict[str, Any]) -> str:
    """One line: greedy held-out accuracy (10-40 % band) and, when measured, what RL will sample."""
    text = (
        f"greedy held-out accuracy {pre['accuracy']:.3f} over {pre['n']} questions (10-40 % band: "
        f"{pre.get('greedy_in_band', pre['in_band'])}), mean length {pre['length_mean']:.1f} tokens"
    )
    sm = pre.get("sampled")
    if sm:
        text += (
            f"; sampled at T={sm['temperature']:g}, {sm['group_size']} per training prompt: accuracy "
            f"{sm['sampled_accuracy']:.3f}, mixed groups {sm['mixed_frac']:.2f} (>= {MIXED_MIN:.2f}: "
            f"{pre['mixed_ok']}), all right {sm['all_right_frac']:.2f}, all wrong {sm['all_wrong_frac']:.2f} "
            f"over {sm['n_prompts']} prompts; PRE-CHECK {'PASSED' if pre['in_band'] else 'FAILED'}"
        )
    return text


def _read_prechecks(runs: Path, seeds: list[int]) -> dict[str, Any]:
    out = {}
    for seed in seeds:
        for key in (str(seed), f"{seed}-prefix"):
            p = runs / f"precheck-s{key}.json"
            if p.exists():
                out[key] = json.loads(p.read_text())
    return out


def _scored_episodes(trainer: Any, examples: list[Any], n: int, params: Any) -> tuple[Any, list[bool]]:
    """``n`` completions per example from the trainer's evaluation runner (same engine, formatter and
    precision as its evaluation), scored by its reward source: (episodes, right per completion)."""
    eps = trainer.eval_runner().run(examples, [n] * len(examples), params)
    scored = trainer.collector.reward_source.score(eps.texts, eps.examples)
    return eps, [float(r) >= trainer.cfg.reward.success_threshold for r in scored.rewards]


def greedy_verdicts(trainer: Any, examples: list[Any]) -> dict[str, Any]:
    """Per-question greedy verdicts of the trainer's current policy (same engine, runner, formatter and
    reward source as its evaluation): accuracy, mean length and the 0/1 list (for paired differences)."""
    from posttrain.rollout import SamplingParams

    cfg = trainer.cfg
    params = SamplingParams(temperature=0.0, max_new_tokens=cfg.rollout.max_new_tokens, logprobs=False)
    eps, correct = _scored_episodes(trainer, examples, 1, params)
    lengths = eps.batch.action_lengths.float()
    out = {
        "accuracy": sum(correct) / len(correct),
        "length_mean": float(lengths.mean()),
        "correct": correct,
        "samples": [t for t in eps.texts[:3]],
    }
    report = getattr(trainer.task, "eval_report", None)
    rep = report(list(eps.examples), list(eps.texts)) if report is not None else None
    if rep and rep.get("hacked_frac") is not None:  # instruction tasks: the hack probes and the bare checker
        out.update(hacked_frac=rep["hacked_frac"], checker_strict=rep["prompt_strict"])
    return out


MIXED_MIN = 0.10
"""Pre-check (proposed): at least this share of training prompts must give a MIXED group (some of its
G samples right, some wrong) — the only groups a group-relative advantage learns from."""


def sampled_verdicts(trainer: Any, examples: list[Any]) -> dict[str, Any]:
    """What RL will see on ``examples`` (training prompts): ``rollout.group_size`` samples per prompt
    at the rollout temperature, through the same engine, runner and reward source as the trainer's
    evaluation. Returns the sampled accuracy, the share of prompts whose group is mixed (neither all
    right nor all wrong), all right, and all wrong."""
    from posttrain.rollout import SamplingParams

    cfg = trainer.cfg
    g = cfg.rollout.group_size
    params = SamplingParams(
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        max_new_tokens=cfg.rollout.max_new_tokens,
        logprobs=False,
    )
    eps, ok = _scored_episodes(trainer, examples, g, params)
    per: dict[int, list[bool]] = {}
    for gid, o in zip(eps.batch.group_ids.tolist(), ok, strict=True):
        per.setdefault(int(gid), []).append(o)
    n = max(1, len(per))
    return {
        "sampled_accuracy": sum(ok) / max(1, len(ok)),
        "mixed_frac": sum(0 < sum(v) < len(v) for v in per.values()) / n,
        "all_right_frac": sum(all(v) for v in per.values()) / n,
        "all_wrong_frac": sum(not any(v) for v in per.values()) / n,
        "group_size": g,
        "n_prompts": len(per),
        "temperature": cfg.rollout.temperature,
    }


def _result_path(runs: Path, arm: str, seed: int) -> Path:
    return runs.parent / "results" / f"{arm}-s{seed}.json"


def task_scores(trainer: Any, rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Replayed trajectories and APARL's last curriculum level from the run's step rows; on a task with
    an ``ood`` split (dialogue-events) greedy accuracy and macro-F1 in-domain (``heldout``) and OOD."""
    steps = [r for r in rows if r.get("kind") == "step"]
    out: dict[str, Any] = {"replayed_total": float(sum(r.get("replayed", 0) for r in steps))}
    if steps and "sampler/level" in steps[-1]:
        out["aparl_level_end"] = float(steps[-1]["sampler/level"])
    if "ood" in getattr(trainer.task, "splits", ()):
        from posttrain_lab.recipes.aparl.event_eval import evaluate_event_detection

        ev = evaluate_event_detection(trainer, n=n)
        out.update(
            id_acc=ev["heldout"]["accuracy"],
            id_f1=ev["heldout"]["macro_f1"],
            ood_acc=ev["ood"]["accuracy"],
            ood_f1=ev["ood"]["macro_f1"],
        )
    return out


def _run_seed_logged(args: tuple[AblationSettings, int, Path]) -> dict[str, dict[str, Any]]:
    import sys

    s, seed, runs = args
    return run_seed(s, seed, runs, lambda msg: print(msg, file=sys.stderr, flush=True))


def run_seed(
    s: AblationSettings, seed: int, runs: Path, say: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    """One seed: the starting model (tiny: the SFT warm start; a real model: as it is), a printed
    pre-check, then every arm from it; arm -> :func:`summarise_run` result plus its gate. Arms whose
    result file exists are loaded, not run again (resume)."""
    from importlib.resources import files

    from posttrain.models import load_model_and_tokenizer
    from posttrain.tasks import get_task
    from posttrain.train.config import RLConfig
    from posttrain.train.rl import DegenerateSettingWarning, RLTrainer
    from posttrain.train.sft import sft_warm_start
    from posttrain.utils.config import build_config
    from posttrain.utils.io import atomic_write_json, read_jsonl

    out: dict[str, dict[str, Any]] = {}
    todo = []
    for arm in s.arms:
        p = _result_path(runs, arm, seed)
        if p.exists():
            out[arm] = _stored_result(s, runs, arm, seed)
            say(f"seed {seed} {arm:>13}: done earlier ({p})")
        else:
            todo.append(arm)
    if not todo:
        return out
    base = str(files("posttrain_lab.demos") / "demo.yaml")
    base_cfg = build_config(RLConfig, base, arm_overrides(s, "grpo", seed, runs / f"sft-s{seed}"))
    model, tok = load_model_and_tokenizer(
        base_cfg.model.name, dtype=base_cfg.model.dtype, device="cpu", seed=seed
    )
    if not s.real:
        say(f"seed {seed}: SFT warm start ({s.sft_steps} steps, {s.warm_start} set)")
        t = time.perf_counter()
        sft_warm_start(
            base_cfg,
            model,
            tok,
            steps=s.sft_steps,
            seed=seed,
            out_dir=runs / f"sft-s{seed}",
            progress=False,
            save=False,
            # the mixed set (No-Thinking prefix, ASRR's arms) is built for arithmetic; dialogue-events SFTs
            # on its labels alone
            pairs=warm_start_pairs(get_task(base_cfg.task.name, **base_cfg.task.params), s.warm_start)
            if s.task == "arithmetic"
            else None,
        )
        say(f"seed {seed}: SFT done in {time.perf_counter() - t:.0f} s")
    state = copy.deepcopy(model.state_dict())
    for arm in todo:
        run_dir = runs / f"{arm}-s{seed}"
        shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished earlier attempt
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SingleUpdateWarning etc.: the bench sets minibatches itself
            cfg = build_config(RLConfig, base, arm_overrides(s, arm, seed, run_dir))
        pre_key = _precheck_key(seed, cfg)
        pre_path = runs / f"precheck-s{pre_key}.json"
        pre: dict[str, Any] | None = json.loads(pre_path.read_text()) if pre_path.exists() else None
        model.load_state_dict(state)
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateSettingWarning)
            with RLTrainer(cfg, model, tok) as tr:
                heldout = tr.task.split("heldout")[: s.eval_n]
                if pre is None:  # the starting model before any RL (per seed and prompt form)
                    pre = greedy_verdicts(tr, heldout)
                    # what RL learns from: G samples per TRAINING prompt at the rollout temperature
                    pre["sampled"] = sampled_verdicts(tr, tr.task.split("train")[: s.eval_n])
                    pre.update(
                        model=s.model,
                        task=s.task,
                        n=len(heldout),
                        greedy_in_band=0.10 <= pre["accuracy"] <= 0.40,
                        mixed_ok=pre["sampled"]["mixed_frac"] >= MIXED_MIN,
                    )
                    pre["in_band"] = pre["greedy_in_band"] and pre["mixed_ok"]
                    atomic_write_json(pre_path, pre)
                    say(
                        f"seed {seed} PRE-CHECK{' (assistant prefix)' if pre_key.endswith('prefix') else ''} "
                        f"{s.model} on {s.task}: {_precheck_text(pre)}; sample: {pre['samples'][0]!r}"
                    )
                tr.train(progress=False)
                rows = list(read_jsonl(run_dir / "metrics.jsonl"))
                extra = task_scores(tr, rows, s.eval_n)
                end = greedy_verdicts(tr, heldout)
        own = [dict(pre, step=0), dict(end, step=s.steps)] if s.real else None
        res = summarise_run(rows, warmup_frac=s.warmup_frac, evals=own)
        res.update(extra)
        res.update(
            seed=seed,
            wall_s=time.perf_counter() - t,
            run_dir=str(run_dir),
            correct_start=pre["correct"],
            correct_end=end["correct"],
            heldout_acc_end_verdicts=end["accuracy"],
            hacked_frac_start=pre.get("hacked_frac"),
            hacked_frac_end=end.get("hacked_frac"),
            checker_strict_end=end.get("checker_strict"),
            settings=settings_identity(s),
            micro_batch_size=s.micro_batch_size,
        )
        res["gate"] = arm_gate(arm, res)
        atomic_write_json(_result_path(runs, arm, seed), res)
        out[arm] = res
        say(
            f"seed {seed} {arm:>13}: held-out {res['heldout_acc_end']:.3f} (start {res['heldout_acc_start']:.3f}),"
            f" length {res['heldout_len_end']:.1f} (start {res['heldout_len_start']:.1f}), {res['wall_s']:.0f} s"
        )
        say(f"seed {seed} {arm:>13}: GATE {res['gate']['verdict']}: {res['gate']['detail']}")
    return out


def _mean_key(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if key in r]
    return statistics.fmean(vals) if vals else None


def arm_gate(arm: str, res: dict[str, Any]) -> dict[str, Any]:
    """Did the arm's mechanism fire? From its step metrics (``res['mech']``); verdict FIRED / NOT FIRED
    and the numbers behind it."""
    m = res.get("mech", {})
    if arm == "maspo":  # no hard clip: a soft Gaussian gate w < 1 on off-policy tokens (gated_frac)
        share = m.get("gated_frac")
        fired = share is not None and share > 0
        detail = (
            f"share of tokens the soft gate acted on {share}; mean gate {m.get('gate_mean')}; "
            f"mean sigma {m.get('sigma_mean')}; clipfrac {m.get('clipfrac')}"
        )
    elif arm in ("grpo", "dgpo", "e3-asrr-dgpo"):
        clip = m.get("clipfrac")
        fired = clip is not None and clip > 0
        extra = {k: m[k] for k in m if "clip" in k or "boundary" in k or "gate" in k or k == "ratio_dev"}
        detail = f"clip/boundary token fractions {extra}"
    elif arm == "e3":
        dev, nh, ne = res.get("entropy_dev_max"), res.get("n_hard_mean"), res.get("n_easy_mean")
        fired = nh is not None and ne is not None and nh > ne
        detail = (
            f"entropy max dev {dev:.3f} from target (within 10 %: {dev is not None and dev <= 0.10}); "
            f"rollouts per hard prompt {nh}, per easy prompt {ne}; τ end {res.get('temperature_end'):.3f}"
        )
    elif arm == "asrr":
        share = m.get("shaped_groups_frac")
        fired = bool(share)
        detail = f"share of groups where the length penalty fired {share}; continue-thinking {m.get('continue_thinking_frac')}"
    elif arm == "nothink":  # a control: no mechanism of its own
        fired = None
        detail = f"control (prefix only, no penalty); continue-thinking {m.get('continue_thinking_frac')}"
    elif arm == "dapo":
        # dynamic sampling acted when a step needed a second round: it dropped a group whose raw rewards
        # were all equal and sampled more. The zero-variance share of the trained groups is read after
        # the overlong shaper, which can make a kept group constant, so it is no test of the filter
        rounds = m.get("sampling_rounds")
        fired = rounds is not None and rounds > 1.0
        detail = (
            f"rounds per step {rounds} (> 1: zero-variance groups dropped and drawn again); rollouts "
            f"generated {res.get('rollouts_total')}; share of steps that hit max_rounds "
            f"{m.get('filter/cap_hit')}; trained groups constant after the overlong shaper "
            f"{m.get('zero_var_frac')}"
        )
    elif arm in ("nexgrpo", "random-failure", "success"):
        fired = bool(res.get("replayed_total"))
        detail = (
            f"replayed {res.get('replayed_total')} trajectories; near-miss rate of replayed failures "
            f"{m.get('replay/near_miss_rate')}"
        )
    else:
        fired, detail = None, ""
    return {"verdict": {True: "FIRED", False: "NOT FIRED", None: "n/a"}[fired], "detail": detail}


def paired_differences(results: dict[str, list[dict[str, Any]]], ref: str = "grpo") -> dict[str, Any]:
    """Each arm minus ``ref`` on held-out greedy accuracy and length: per seed, and pooled over the
    (seed, question) pairs of the same held-out questions with SE = sd(d) / sqrt(n)."""
    if ref not in results:
        return {}
    by_seed = {r["seed"]: r for r in results[ref]}
    out: dict[str, Any] = {}
    for arm, runs in results.items():
        if arm == ref:
            continue
        d_acc: list[float] = []
        seeds = []
        d_len = []
        for r in runs:
            g = by_seed.get(r["seed"])
            if g is None or "correct_end" not in r or "correct_end" not in g:
                continue
            seeds.append(r["seed"])
            d_acc += [float(a) - float(b) for a, b in zip(r["correct_end"], g["correct_end"], strict=True)]
            d_len.append(r["heldout_len_end"] - g["heldout_len_end"])
        if not d_acc:
            continue
        n = len(d_acc)
        mean, se = mean_se(d_acc)
        out[arm] = {
            "seeds": seeds,
            "acc_diff": mean,
            "acc_diff_se": se,
            "n_pairs": n,
            "len_diff_per_seed": d_len,
            "len_diff_mean": statistics.fmean(d_len),
            "len_diff_se": mean_se(d_len)[1] if len(d_len) > 1 else None,
        }
    return out


# ----------------------------------------------------------------------------------------- summary
def mechanism_means(steps: list[dict[str, Any]]) -> dict[str, float]:
    """Mean over a run's step rows of every metric a gate reads (clip, boundary, gate, sigma, replay and
    group-filter keys, the shaping, sampling and zero-variance shares); keys a run never logged are left
    out."""
    mech_keys = sorted(
        {
            k
            for r in steps
            for k in r
            if "clip" in k
            or "boundary" in k
            or "gate" in k
            or "sigma" in k
            or k.startswith(("replay/", "filter/"))
        }
        | {"shaped_groups_frac", "continue_thinking_frac", "zero_var_frac", "sampling_rounds", "ratio_mean"}
    )
    mech = {k: _mean_key(steps, k) for k in mech_keys}
    return {k: v for k, v in mech.items() if v is not None}


def summarise_run(
    rows: list[dict[str, Any]], *, warmup_frac: float = 0.25, evals: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Per-run numbers and curves from a run's ``metrics.jsonl`` rows (``evals``: the start and end
    evaluations when the bench made them itself, rows with ``step``, ``accuracy``, ``length_mean``)."""
    steps = [r for r in rows if r.get("kind") == "step"]
    evals = evals if evals is not None else [r for r in rows if r.get("kind") == "eval"]
    if not steps or not evals:
        raise InvalidValueError("ablation run logged no step or no eval rows")
    ent = [float(r["entropy_pre_update"]) for r in steps]
    target = ent[0]  # E3's target: the first step's entropy (also the reference for the other arms)
    warm = max(1, math.ceil(warmup_frac * len(steps)))
    after = ent[warm:] or ent[-1:]
    dev = [abs(h - target) / target for h in after] if target > 0 else [0.0]
    from posttrain.train.rl import step_rollouts

    rollouts = [step_rollouts(r) for r in steps]
    hard = [r["sampler/n_hard"] for r in steps if "sampler/n_hard" in r]
    easy = [r["sampler/n_easy"] for r in steps if "sampler/n_easy" in r]
    return {
        "mech": mechanism_means(steps),
        "heldout_acc_start": float(evals[0]["accuracy"]),
        "heldout_acc_end": float(evals[-1]["accuracy"]),
        "heldout_len_start": float(evals[0]["length_mean"]),
        "heldout_len_end": float(evals[-1]["length_mean"]),
        "train_len_last": statistics.fmean(
            float(r["length_mean"]) for r in steps[-max(1, len(steps) // 5) :]
        ),
        "entropy_target": target,
        "entropy_dev_max": max(dev),
        "entropy_dev_mean": statistics.fmean(dev),
        "entropy_end": ent[-1],
        "temperature_end": float(steps[-1]["temperature"]),
        "rollouts_total": sum(rollouts),
        "zero_var_share": statistics.fmean(float(r["zero_var_frac"]) for r in steps),
        "n_hard_mean": statistics.fmean(hard) if hard else None,
        "n_easy_mean": statistics.fmean(easy) if easy else None,
        "curves": {
            "step": [int(r["step"]) for r in steps],
            "length": [float(r["length_mean"]) for r in steps],
            "entropy": ent,
            "temperature": [float(r["temperature"]) for r in steps],
            "rollouts_cum": [sum(rollouts[: i + 1]) for i in range(len(rollouts))],
            "zero_var": [float(r["zero_var_frac"]) for r in steps],
            "eval_step": [int(r["step"]) for r in evals],
            "eval_acc": [float(r["accuracy"]) for r in evals],
        },
    }


#: (key, column title, digits). Titles: held-out greedy accuracy and completion length at the end; train
#: completion length over the last 20 % of steps; max relative entropy deviation from the first step's
#: entropy after warm-up; final temperature; rollouts generated; mean share of zero-variance groups;
#: E3's mean completions per prompt for ranked-hard (rank >= 0.5) and ranked-easy prompts.
COLUMNS = [
    ("heldout_acc_end", "acc", 3),
    ("heldout_len_end", "len", 1),
    ("train_len_last", "train len", 1),
    ("entropy_dev_max", "H dev", 3),
    ("temperature_end", "τ end", 2),
    ("rollouts_total", "rollouts", 0),
    ("zero_var_share", "zero-var", 2),
    ("n_hard_mean", "n hard", 1),
    ("n_easy_mean", "n easy", 1),
    ("replayed_total", "replayed", 0),
    ("id_f1", "F1 in", 3),
    ("ood_acc", "acc OOD", 3),
    ("ood_f1", "F1 OOD", 3),
    ("hacked_frac_end", "hacked", 3),
    ("checker_strict_end", "checker", 3),
]


def _ms(vals: list[float]) -> tuple[float, float]:
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0


def aggregate(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Mean and std over seeds of every column, per arm (None where the arm has no such number)."""
    table: dict[str, dict[str, Any]] = {}
    for arm, runs in results.items():
        row: dict[str, Any] = {"seeds": len(runs)}
        for key, _, _ in [*COLUMNS, ("heldout_acc_start", "", 0), ("entropy_dev_mean", "", 0)]:
            vals = [r[key] for r in runs if r.get(key) is not None]
            row[key] = dict(zip(("mean", "std"), _ms(vals), strict=True)) if vals else None
        table[arm] = row
    return table


def check_claims(table: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The papers' claims, checked on this ablation's numbers (None where an arm was not run)."""

    def m(arm: str, key: str) -> float | None:
        v = table.get(arm, {}).get(key)
        return None if v is None else v["mean"]

    claims: dict[str, Any] = {}
    e3_dev, grpo_dev = m("e3", "entropy_dev_max"), m("grpo", "entropy_dev_max")
    if e3_dev is not None:
        claims["e3_entropy_within_10pct"] = {
            "e3_max_dev": e3_dev,
            "grpo_max_dev": grpo_dev,
            "holds": e3_dev <= 0.10,
        }
    ga, gl, aa, al = (
        m("grpo", "heldout_acc_end"),
        m("grpo", "heldout_len_end"),
        m("asrr", "heldout_acc_end"),
        m("asrr", "heldout_len_end"),
    )
    if None not in (ga, gl, aa, al) and gl:
        cut = 1 - al / gl
        drop = 100 * (ga - aa)
        claims["asrr_length_cut_25pct_acc_drop_2pts"] = {
            "length_cut": cut,
            "acc_drop_points": drop,
            "holds": cut >= 0.25 and drop <= 2.0,
        }
    zv = m("dapo", "zero_var_share")
    if zv is not None:
        claims["dapo_no_zero_variance_group"] = {"zero_var_share": zv, "holds": zv == 0.0}
    nh, ne = m("e3", "n_hard_mean"), m("e3", "n_easy_mean")
    if m("e3", "heldout_acc_end") is not None:
        claims["e3_hard_prompts_get_more_rollouts"] = {
            "n_hard": nh,
            "n_easy": ne,
            "holds": None if nh is None or ne is None else nh > ne,
        }
    acc = {a: m(a, "heldout_acc_end") for a in ("nexgrpo", "random-failure", "success", "grpo")}
    if acc["nexgrpo"] is not None:  # NexGRPO abstract: failure replay beats random failure replay
        others = [v for k, v in acc.items() if k != "nexgrpo" and v is not None]
        claims["nexgrpo_beats_random_failure_success_grpo"] = {
            **acc,
            "holds": all(acc["nexgrpo"] > v for v in others) if others else None,
        }
    f1 = {(a, k): m(a, k) for a in ("aparl", "grpo", "dapo") for k in ("id_f1", "ood_f1")}
    if f1[("aparl", "id_f1")] is not None:  # APARL abstract: best F1, in-domain and OOD
        rivals = [(a, k) for (a, k) in f1 if a != "aparl" and f1[(a, k)] is not None]
        claims["aparl_best_f1_in_domain_and_ood"] = {
            **{f"{a}_{k}": v for (a, k), v in f1.items()},
            "holds": all(f1[("aparl", k)] > f1[(a, k)] for a, k in rivals) if rivals else None,
        }
    return claims


def _fmt(v: dict[str, float] | None, digits: int) -> str:
    if v is None:
        return "–"
    return f"{v['mean']:.{digits}f} ± {v['std']:.{digits}f}"


def table_rows(table: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["arm", "seeds", *(title for _, title, _ in COLUMNS)]
    rows = [[arm, str(row["seeds"]), *(_fmt(row[k], d) for k, _, d in COLUMNS)] for arm, row in table.items()]
    return header, rows


def markdown_table(result: dict[str, Any]) -> str:
    header, rows = table_rows(result["table"])
    s = result["settings"]
    lines = [
        f"# posttrain bench ablation — seeds {s['seeds']}, {s['steps']} RL steps after {s['sft_steps']} SFT steps, "
        f"{s['prompts_per_step']}×{s['group_size']} rollouts/step, {s['max_new_tokens']} tokens, "
        f"{s['minibatches']} minibatch(es)/step, {s['warm_start']} warm start (mean ± std over seeds)",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
        "acc / len: held-out greedy accuracy and completion length (tokens) at the end; train len: mean "
        "completion length over the last 20 % of steps; H dev: max |H − H₀| / H₀ after warm-up (H₀ = first "
        "step's entropy); τ end: final temperature; rollouts: completions generated; zero-var: mean share "
        "of zero-variance groups; n hard / n easy: E3's completions per ranked-hard / ranked-easy prompt; "
        "replayed: replayed trajectories; F1 in / acc OOD / F1 OOD (dialogue-events): greedy macro-F1 on "
        "the in-domain held-out split, accuracy and macro-F1 on the held-out business; hacked / checker "
        "(instructions): share of held-out greedy answers a hack probe flags, and the bare checker's strict "
        "accuracy (acc is the reward's: the checker guarded by the probes).",
        "",
        "Claims: " + "; ".join(f"{k}: {v['holds']}" for k, v in result["claims"].items()),
        "",
    ]
    for seed, pre in (result.get("prechecks") or {}).items():
        lines.append(f"Pre-check (seed {seed}): {pre['model']} on {pre['task']}, {_precheck_text(pre)}.")
    if result.get("gates"):
        lines += ["", "| arm | seed | gate | detail |", "|---|---|---|---|"]
        for arm, gates in result["gates"].items():
            for r, g in zip(result["runs"][arm], gates, strict=True):
                if g:
                    lines.append(f"| {arm} | {r['seed']} | {g['verdict']} | {g['detail']} |")
    if result.get("paired"):
        lines += [
            "",
            "Paired differences vs grpo (held-out greedy accuracy over the same (seed, question) pairs, "
            "SE = sd/sqrt(n); length per seed):",
            "",
            "| arm | seeds | Δacc ± SE | n pairs | Δlen (tokens) |",
            "|---|---|---|---|---|",
        ]
        for arm, d in result["paired"].items():
            lines.append(
                f"| {arm} | {d['seeds']} | {d['acc_diff']:+.3f} ± {d['acc_diff_se']:.3f} | {d['n_pairs']} | "
                f"{d['len_diff_mean']:+.1f} |"
            )
    lines.append("")
    return "\n".join(lines)


def print_ablation(result: dict[str, Any]) -> None:
    from posttrain.utils.tables import print_table

    header, rows = table_rows(result["table"])
    print_table("posttrain bench ablation (mean ± std over seeds)", header, rows)
    for k, v in result["claims"].items():
        print(f"  {k}: {v}")
    for arm, gates in (result.get("gates") or {}).items():
        for r, g in zip(result["runs"][arm], gates, strict=True):
            if g:
                print(f"  gate {arm} s{r['seed']}: {g['verdict']}: {g['detail']}")
    for arm, d in (result.get("paired") or {}).items():
        print(
            f"  {arm} - grpo: Δacc {d['acc_diff']:+.3f} ± {d['acc_diff_se']:.3f} (n={d['n_pairs']}), Δlen {d['len_diff_mean']:+.1f}"
        )


def plot_ablation(results: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """One PNG, six panels, one line per arm (mean over seeds)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posttrain.utils.io import atomic_write_bytes

    panels = [
        ("eval_acc", "held-out accuracy", "eval_step"),
        ("length", "mean response length (tokens)", "step"),
        ("entropy", "entropy before update (nats/token)", "step"),
        ("temperature", "temperature τ", "step"),
        ("rollouts_cum", "rollouts spent (cumulative)", "step"),
        ("zero_var", "zero-variance groups (share)", "step"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (key, title, xkey) in zip(axes.flat, panels, strict=True):
        for arm, runs in results.items():
            curves = [r["curves"] for r in runs]
            n = min(len(c[key]) for c in curves)
            ys = [statistics.fmean(c[key][i] for c in curves) for i in range(n)]
            ax.plot(curves[0][xkey][:n], ys, label=arm, marker="o" if key == "eval_acc" else None, ms=3)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path
