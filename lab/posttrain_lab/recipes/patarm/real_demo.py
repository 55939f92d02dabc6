"""``posttrain demo rm``: PaTaRM-style judges on the built-in real model, and RLHF with the judge as the
only reward (proposed design after PaTaRM, arXiv 2510.24235; the character-level demo is
``posttrain demo rm --char``, :mod:`posttrain_lab.recipes.patarm.demo`).

Stages (each writes its result file as soon as it finishes; a rerun with the same ``--out`` skips every
stage whose file exists, so a long run resumes per arm and seed):

1. **Pairs** (``pairs/{train,eval}.jsonl``, RewardBench-style rows, ``posttrain rm eval --data``
   reads them): the policy (the real model) samples ``samples_per_prompt`` completions per prompt at
   T = 1; a verifiable reward checks them. chosen = a completion that satisfies the checker (else the
   task's reference solution when it has one: ``subset`` ends in ``:reference``), rejected = a
   completion that does not — the **near miss**, i.e. the failing completion most similar to the
   chosen one (``difflib`` ratio). Training pairs come from the train prompts of ``pair_task``;
   evaluation pairs from its held-out prompts and from the held-out prompts of a second task
   (``heldout_task``) the judges never saw: unseen prompts and an unseen task.
2. **Judges** (``judges/<arm>.json``), all on the same evaluation pairs and training budget:
   ``base`` (the real model as a judge), ``sft`` (cold start on ``<score>8</score>`` /
   ``<score>3</score>`` traces of the training pairs), ``par_indicator`` and ``par_antisymmetric``
   (the SFT judge trained further with PAR under each rule, same steps), ``bt`` (Bradley-Terry scalar
   head on the same backbone and pairs). Generative judges are evaluated on the first
   ``judge_eval_pairs`` evaluation pairs of each source task, greedy (k = 1) with the rubric block
   (``full``) and without (``none``), and with k = ``eval_k`` sampled judgments at T = 1 with the rubric
   (:func:`judge_settings`); accuracy strict and tie-as-½ (:mod:`posttrain_lab.recipes.patarm.evaluate`),
   per-pair outcomes kept for paired differences.
3. **RLHF** (``rlhf/<arm>-s<seed>.json``; ``rlhf/before.json``): the policy trained by GRPO on
   ``pair_task``'s train prompts with one reward — ``judge`` (the ``par_antisymmetric`` judge, mean
   of one greedy judgment, normalised), ``random`` (a random judge) or ``verifiable`` (the task's own
   checker) — for each seed; evaluated greedy on the held-out prompts of ``pair_task`` and on IFBench.
   ``summary.json`` gathers what exists, with standard errors (binomial per run; over seeds
   ``sd/sqrt(seeds)``).
"""

from __future__ import annotations

import difflib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from posttrain.utils.config import settings_diff
from posttrain.utils.errors import InvalidValueError
from posttrain.utils.io import atomic_write_json
from posttrain.utils.stats import mean_se as _mean_se
from posttrain.utils.stats import se_binomial
from posttrain_lab.recipes.patarm.data import PreferencePair, load_preferences, save_preferences

JUDGE_ARMS: tuple[str, ...] = ("base", "sft", "par_indicator", "par_antisymmetric", "bt")
RLHF_ARMS: tuple[str, ...] = ("judge", "random", "verifiable")
TASK_TYPE_OF: dict[str, str] = {"instructions": "chat", "word_problems": "math", "arithmetic": "math"}


@dataclass
class RealRMSettings:
    """Every setting of the real-model demo (``quick()``: a smoke run of every stage)."""

    model: str = "smollm2-135m"
    chat_template: bool = True
    pair_task: str = "instructions"
    pair_task_params: dict[str, Any] = field(
        default_factory=lambda: {
            "types": ["startend:quotation", "detectable_format:title", "change_case:english_lowercase"],
            "n_train": 500,
            "n_heldout": 100,
            "seed": 0,
        }
    )
    heldout_task: str | None = "word_problems"
    heldout_task_params: dict[str, Any] = field(default_factory=lambda: {"n_heldout": 200, "seed": 0})
    n_train_prompts: int = 192
    n_eval_prompts: int = 64
    samples_per_prompt: int = 4
    sample_max_new_tokens: int = 64
    rubric_style: str = "full"
    judge_max_new_tokens: int = 12
    base_judge_max_new_tokens: int = 48
    judge_sft_steps: int = 30
    par_steps: int = 16
    par_group: int = 4
    par_pairs_per_step: int = 2
    bt_steps: int = 30
    judge_lr: float = 1e-5
    batch_size: int = 8
    eval_k: int = 4
    judge_eval_pairs: int | None = 24
    """Judges are evaluated on at most this many evaluation pairs per source task (the first ones;
    None = all): a judgment costs a ~250-token prefill, and five judges x 6 judgments per response
    over every pair did not fit a CPU session."""
    rl_steps: int = 20
    rl_prompts_per_step: int = 4
    rl_group: int = 4
    rl_lr: float = 2e-5
    rl_eval_n: int = 100
    ifbench: bool = True
    ifbench_n: int | None = 100
    seeds: tuple[int, ...] = (0, 1)
    threads: int = 2
    precision: str = "bf16"
    """Every stage's compute precision (``model.precision``: bf16 autocast over fp32 weights, the
    setting the real model runs fast in; docs/precision.md)."""
    engine: str = "fast"
    """Rollout engine for the policy's samples, PAR's judge rollouts, RLHF and its evaluations."""

    @classmethod
    def quick(cls, **kw: Any) -> RealRMSettings:
        base = dict(
            n_train_prompts=8,
            n_eval_prompts=4,
            samples_per_prompt=4,
            sample_max_new_tokens=24,
            judge_sft_steps=2,
            par_steps=1,
            par_pairs_per_step=2,
            par_group=2,
            bt_steps=2,
            eval_k=2,
            rl_steps=1,
            rl_prompts_per_step=2,
            rl_group=2,
            rl_eval_n=4,
            ifbench_n=4,
            base_judge_max_new_tokens=16,
            precision="fp32",
        )
        base.update(kw)
        return cls(**base)  # type: ignore[arg-type]


def mean_se(xs: list[float]) -> dict[str, float]:
    """Mean and standard error over seeds (``sd / sqrt(n)``, sample sd; NaN with one seed)."""
    m, se = _mean_se(xs)
    return {"mean": m, "se": se, "n": len(xs)}


def near_miss_index(chosen: str, failing: list[str]) -> int:
    """The failing completion most similar to ``chosen`` (``difflib`` ratio; ties: the first)."""
    if not failing:
        raise InvalidValueError("near_miss_index: no failing completion")
    ratios = [difflib.SequenceMatcher(None, chosen, f, autojunk=False).ratio() for f in failing]
    return max(range(len(failing)), key=lambda i: (ratios[i], -i))


def pairs_from_samples(
    examples: list[Any],
    texts: list[list[str]],
    passed: list[list[bool]],
    *,
    task_name: str,
    task: Any = None,
    task_type: str = "chat",
) -> tuple[list[PreferencePair], dict[str, int]]:
    """Preference pairs from each example's sampled completions and checker verdicts: chosen = the
    first passing completion (else the task's reference solution, when it has one), rejected = the
    failing completion nearest to it. Examples with no failing completion, or with no passing one and
    no reference, give no pair (counted)."""
    out: list[PreferencePair] = []
    stats = {
        "prompts": len(examples),
        "policy_chosen": 0,
        "reference_chosen": 0,
        "all_pass": 0,
        "no_chosen": 0,
    }
    for ex, ts, ok in zip(examples, texts, passed, strict=True):
        failing = [t for t, o in zip(ts, ok, strict=True) if not o]
        good = [t for t, o in zip(ts, ok, strict=True) if o]
        if not failing:
            stats["all_pass"] += 1
            continue
        if good:
            chosen, source = good[0], "policy"
        else:
            chosen = ""
            if task is not None:
                try:
                    chosen = task.reference_completion(ex)
                except (NotImplementedError, AttributeError, KeyError, ValueError):
                    chosen = ""
            if not chosen.strip():
                stats["no_chosen"] += 1
                continue
            source = "reference"
        stats[f"{source}_chosen"] += 1
        rejected = failing[near_miss_index(chosen, failing)]
        if not rejected.strip() or rejected == chosen:
            stats["no_chosen"] += 1
            continue
        out.append(
            PreferencePair(
                prompt=ex.prompt,
                chosen=chosen,
                rejected=rejected,
                task_type=task_type,
                subset=f"{task_name}:{source}",
                id=f"{task_name}/{ex.id}",
            )
        )
    return out, stats


# ------------------------------------------------------------------------------------------ helpers
def _done(path: Path) -> dict[str, Any] | None:
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    return None


def _fresh(run_dir: Path) -> None:
    """Remove what an interrupted attempt of one arm left (its result file was never written)."""
    import shutil

    if run_dir.is_dir():
        shutil.rmtree(run_dir)


def _load(spec: str, seed: int = 0) -> tuple[Any, Any]:
    from posttrain.models import load_model_and_tokenizer

    return load_model_and_tokenizer(spec, device="cpu", seed=seed)


def _sample(s: RealRMSettings, model: Any, tok: Any, examples: list[Any], seed: int) -> list[list[str]]:
    import torch

    from posttrain.rollout import RolloutSpec, SamplingParams

    n, max_new_tokens = s.samples_per_prompt, s.sample_max_new_tokens
    built = RolloutSpec(engine=s.engine, chat=s.chat_template, precision=s.precision, max_batch_size=32).build(
        model, tok, seed=seed
    )
    fmt, eng = built.formatter, built.engine
    out: list[list[str]] = [[] for _ in examples]
    for b in range(0, len(examples), 8):
        chunk = examples[b : b + 8]
        with torch.no_grad():
            batch = eng.generate(
                [fmt.encode(e.prompt) for e in chunk],
                [n] * len(chunk),
                SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, logprobs=False),
            )
        texts = tok.batch_decode(batch.completion_lists(), skip_special_tokens=True)
        for g, t in zip(batch.group_ids.tolist(), texts, strict=True):
            out[b + g].append(t)
    return out


def build_pairs(s: RealRMSettings, out: Path, *, seed: int = 0) -> dict[str, Any]:
    """Stage 1 (see the module docstring). Writes ``pairs/train.jsonl``, ``pairs/eval.jsonl`` and
    ``pairs/stats.json``."""
    from posttrain.rewards import get_reward
    from posttrain.tasks import get_task

    done = _done(out / "pairs" / "stats.json")
    if done is not None:
        return done
    t0 = time.perf_counter()
    model, tok = _load(s.model, seed)
    stats: dict[str, Any] = {}
    made: dict[str, list[PreferencePair]] = {"train": [], "eval": []}
    jobs = [(s.pair_task, s.pair_task_params, "train", "train", s.n_train_prompts)]
    jobs.append((s.pair_task, s.pair_task_params, "heldout", "eval", s.n_eval_prompts))
    if s.heldout_task:
        jobs.append((s.heldout_task, s.heldout_task_params, "heldout", "eval", s.n_eval_prompts))
    for name, params, split, dest, n in jobs:
        task = get_task(name, **params)
        reward = get_reward(task.default_reward)
        exs = task.split(split)[:n]
        texts = _sample(s, model, tok, exs, seed)
        passed = [[reward(t, ex) >= 1.0 for t in ts] for ex, ts in zip(exs, texts, strict=True)]
        pairs, st = pairs_from_samples(
            exs, texts, passed, task_name=name, task=task, task_type=TASK_TYPE_OF.get(name, "chat")
        )
        st["pass_rate"] = sum(map(sum, passed)) / max(1, sum(map(len, passed)))
        stats[f"{name}/{split}"] = {**st, "pairs": len(pairs)}
        made[dest] += pairs
        print(f"[rm-real] pairs {name}/{split}: {len(pairs)} of {len(exs)} prompts {st}", flush=True)
    for k, v in made.items():
        if not v:
            raise InvalidValueError(
                f"demo rm: no {k} pairs could be built (every sampled completion passed, or none passed and the "
                "task has no reference solution); raise samples_per_prompt or change the task"
            )
        save_preferences(v, out / "pairs" / f"{k}.jsonl")
    stats["wall_s"] = time.perf_counter() - t0
    atomic_write_json(out / "pairs" / "stats.json", stats)
    return stats


def eval_pairs(s: RealRMSettings, pairs: list[PreferencePair]) -> list[PreferencePair]:
    """The judges' evaluation pairs: the first ``judge_eval_pairs`` of each source task (``id`` is
    ``<task>/<example id>``), all when None."""
    if s.judge_eval_pairs is None:
        return list(pairs)
    seen: dict[str, int] = {}
    out = []
    for p in pairs:
        src = (p.id or "").split("/", 1)[0]
        if seen.get(src, 0) < s.judge_eval_pairs:
            seen[src] = seen.get(src, 0) + 1
            out.append(p)
    return out


def judge_settings(s: RealRMSettings) -> list[tuple[str, int]]:
    """(rubric style, k) of the judge evaluations: greedy k = 1 with the rubric and without, and
    k = ``eval_k`` sampled judgments at T = 1 with the rubric."""
    grid = [(s.rubric_style, 1)]
    if s.rubric_style != "none":
        grid.append(("none", 1))
    if s.eval_k > 1:
        grid.append((s.rubric_style, s.eval_k))
    return grid


def _judge_evals(
    s: RealRMSettings, model: Any, tok: Any, pairs: list[PreferencePair], max_new: int, seed: int
) -> dict[str, Any]:
    from posttrain_lab.recipes.patarm.demo import judge_scorer
    from posttrain_lab.recipes.patarm.evaluate import evaluate_pointwise

    res: dict[str, Any] = {}
    for rubric, k in judge_settings(s):
        fn = judge_scorer(
            model,
            tok,
            rubric_style=rubric,
            max_new_tokens=max_new,
            samples=k,
            chat_template=s.chat_template,
            seed=seed,
            batch_size=32,
            precision=s.precision,
            engine=s.engine,
        )
        # per_pair kept: the arms are judged on the same pairs, so differences can be paired
        res[f"rubric={rubric},k={k}"] = evaluate_pointwise(pairs, fn, n_boot=1000, seed=seed)
    return res


def _bt_eval(
    model_dir: str, pairs: list[PreferencePair], chat: bool, seed: int, precision: str = "fp32"
) -> dict[str, Any]:
    from posttrain_lab.recipes.patarm.bt import BTRewardModel, load_bt_model
    from posttrain_lab.recipes.patarm.evaluate import evaluate_pointwise

    m, t = load_bt_model(model_dir, device="cpu")
    rm = BTRewardModel(m, t, chat_template=chat, precision=precision)

    def score(ps: list[PreferencePair], side: str) -> list[float | None]:
        return rm.score([p.prompt for p in ps], [p.chosen if side == "chosen" else p.rejected for p in ps])  # type: ignore[return-value]

    return {"scalar": evaluate_pointwise(pairs, score, n_boot=1000, seed=seed)}  # per_pair kept (paired)


def _traces(s: RealRMSettings, pairs: list[PreferencePair]) -> list[tuple[str, str]]:
    from posttrain_lab.recipes.patarm.prompts import pointwise_prompt

    rows = []
    for p in pairs:
        for resp, score in ((p.chosen, 8), (p.rejected, 3)):
            rows.append(
                (
                    pointwise_prompt(p.prompt, resp, p.task_type, rubric_style=s.rubric_style),
                    f"<score>{score}</score>",
                )  # type: ignore[arg-type]
            )
    return rows


def run_judge_arm(
    s: RealRMSettings, out: Path, arm: str, *, seed: int = 0, progress: bool | None = False
) -> dict[str, Any]:
    """Stage 2 for one arm; result in ``judges/<arm>.json`` (skipped when it exists)."""
    from posttrain.train.sft import SFTConfig, SFTTrainer

    path = out / "judges" / f"{arm}.json"
    done = _done(path)
    if done is not None:
        return done
    if arm not in JUDGE_ARMS:
        raise InvalidValueError(f"unknown judge arm {arm!r}; expected one of {', '.join(JUDGE_ARMS)}")
    t0 = time.perf_counter()
    train = load_preferences(out / "pairs" / "train.jsonl")
    held = eval_pairs(s, load_preferences(out / "pairs" / "eval.jsonl"))
    res: dict[str, Any] = {"arm": arm}
    if arm == "base":
        model, tok = _load(s.model, seed)
        res["evals"] = _judge_evals(s, model, tok, held, s.base_judge_max_new_tokens, seed)
    elif arm == "sft":
        _fresh(out / "judges" / "sft")
        model, tok = _load(s.model, seed)
        cfg = SFTConfig(
            steps=s.judge_sft_steps,
            batch_size=s.batch_size,
            lr=s.judge_lr,
            seed=seed,
            threads=s.threads,
            out_dir=str(out / "judges" / "sft"),
            progress=progress,
        )
        cfg.task.chat_template = s.chat_template
        cfg.model.precision = s.precision
        cfg.eval.at_end = False
        from posttrain.models.saving import save_model_dir

        with SFTTrainer(cfg, model, tok, pairs=_traces(s, train)) as tr:  # frees its AdamW state on exit
            sm = tr.train()
            trained = tr.model
            save_model_dir(trained, tok, out / "judges" / "sft-model")
        res["train_last"] = {k: v for k, v in (sm.get("last") or {}).items() if isinstance(v, int | float)}
        res["evals"] = _judge_evals(s, trained, tok, held, s.judge_max_new_tokens, seed)
    elif arm.startswith("par_"):
        res.update(_par_arm(s, out, arm.removeprefix("par_"), train, held, seed=seed, progress=progress))
    else:  # bt
        from posttrain_lab.recipes.patarm.bt import BTConfig, train_bt

        _fresh(out / "judges" / "bt")
        bt = train_bt(
            BTConfig(
                model=s.model,
                chat_template=s.chat_template,
                steps=s.bt_steps,
                # pairs per step: half the SFT judge's rows per step, so both see the same number of
                # sequences (each pair is two sequences, chosen and rejected)
                batch_size=max(1, s.batch_size // 2),
                lr=s.judge_lr,
                seed=seed,
                device="cpu",
                precision=s.precision,
                out_dir=str(out / "judges" / "bt"),
            ),
            train,
        )
        res["train_last"] = bt.get("last", {})
        res["evals"] = _bt_eval(bt["model"], held, s.chat_template, seed, s.precision)
    res["wall_s"] = time.perf_counter() - t0
    res["n_train_pairs"], res["n_eval_pairs"] = len(train), len(held)
    atomic_write_json(path, res)
    return res


def _par_arm(
    s: RealRMSettings,
    out: Path,
    rule: str,
    train: list[PreferencePair],
    held: list[PreferencePair],
    *,
    seed: int,
    progress: bool | None,
) -> dict[str, Any]:
    from posttrain.models.saving import save_model_dir
    from posttrain.train.config import RLConfig
    from posttrain.train.rl import RLTrainer
    from posttrain.utils.config import build_config

    sft_dir = out / "judges" / "sft-model"
    if not (sft_dir / "config.json").is_file():
        raise InvalidValueError(f"demo rm: PAR arm needs the SFT judge in {sft_dir}; run the 'sft' arm first")
    overrides = [
        f"out_dir={out / 'judges' / ('par_' + rule)}",
        f"model.name={sft_dir}",
        "model.device=cpu",
        f"model.precision={s.precision}",
        f"rollout.engine.name={s.engine}",
        "task.name=preferences",
        f"task.chat_template={str(s.chat_template).lower()}",
        f"steps={s.par_steps}",
        f"seed={seed}",
        f"threads={s.threads}",
        "reward.source.name=par",
        "reward.success_threshold=1.0",
        "reward.num_workers=0",
        "rollout.temperature=1.0",
        f"rollout.max_new_tokens={s.judge_max_new_tokens}",
        f"rollout.group_size={s.par_group}",
        f"rollout.prompts_per_step={s.par_pairs_per_step}",
        "rollout.runner.name=par",
        "objective.name=ppo",
        "advantage.name=grpo",
        "kl.coef=0.001",
        "kl.kind=low_var_kl",
        f"optimizer.lr={s.judge_lr}",
    ]
    _fresh(out / "judges" / f"par_{rule}")
    cfg: RLConfig = build_config(RLConfig, None, overrides)
    cfg.task.params = {
        "path": str(out / "pairs" / "train.jsonl"),
        "heldout_path": str(out / "pairs" / "eval.jsonl"),
        "seed": seed,
    }
    cfg.reward.source.params = {"rule": rule, "fallback": False}
    cfg.rollout.runner.params = {"rubric_style": s.rubric_style}
    cfg.eval.at_start = cfg.eval.at_end = False
    cfg.checkpoint.final = False
    model, tok = _load(str(sft_dir), seed)
    with RLTrainer(cfg, model, tok) as tr:
        sm = tr.train(progress=progress)
        save_model_dir(tr.model, tr.tokenizer, out / "judges" / f"par_{rule}-model")
        evals = _judge_evals(s, tr.model, tok, held, s.judge_max_new_tokens, seed)
    last = {k: v for k, v in (sm.get("last") or {}).items() if isinstance(v, int | float)}
    return {"rule": rule, "train_last": last, "evals": evals}


# --------------------------------------------------------------------------------------------- RLHF
def _policy_eval(s: RealRMSettings, model: Any, tok: Any, seed: int) -> dict[str, Any]:
    from posttrain.rewards import get_reward
    from posttrain.rollout import PromptFormatter
    from posttrain.rollout.reward_source import FunctionRewardSource
    from posttrain.tasks import get_task
    from posttrain.train.evaluate import evaluate

    res: dict[str, Any] = {}
    benches = [("heldout", get_task(s.pair_task, **s.pair_task_params), s.rl_eval_n)]
    if s.ifbench:
        benches.append(("ifbench", get_task("ifbench"), s.ifbench_n))
    for key, task, n in benches:
        exs = task.split("heldout")[:n] if n else task.split("heldout")
        src = FunctionRewardSource(get_reward(task.default_reward), num_workers=0)
        try:
            ev = evaluate(
                model,
                tok,
                exs,
                src,
                formatter=PromptFormatter(tok, chat=s.chat_template),
                max_new_tokens=s.sample_max_new_tokens,
                batch_size=16,
                report=getattr(task, "eval_report", None),
                engine=s.engine,
                precision=s.precision,
            )
        finally:
            src.close()
        row = {
            "n": len(exs),
            "accuracy": ev["accuracy"],
            "accuracy_se": se_binomial(ev["accuracy"], len(exs)),
        }
        rep = ev.get("report") or {}
        for k in ("prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose"):
            if k in rep:
                row[k] = rep[k]
        res[key] = row
    return res


def run_rlhf_arm(
    s: RealRMSettings, out: Path, arm: str, seed: int, *, progress: bool | None = False
) -> dict[str, Any]:
    """Stage 3 for one (arm, seed); result in ``rlhf/<arm>-s<seed>.json`` (skipped when it exists)."""
    from posttrain.train.config import RLConfig
    from posttrain.train.rl import RLTrainer
    from posttrain.utils.config import build_config

    path = out / "rlhf" / f"{arm}-s{seed}.json"
    done = _done(path)
    if done is not None:
        return done
    if arm not in RLHF_ARMS:
        raise InvalidValueError(f"unknown RLHF arm {arm!r}; expected one of {', '.join(RLHF_ARMS)}")
    t0 = time.perf_counter()
    overrides = [
        f"out_dir={out / 'rlhf' / f'{arm}-s{seed}'}",
        f"model.name={s.model}",
        "model.device=cpu",
        f"model.precision={s.precision}",
        f"rollout.engine.name={s.engine}",
        f"task.name={s.pair_task}",
        f"task.chat_template={str(s.chat_template).lower()}",
        f"steps={s.rl_steps}",
        f"seed={seed}",
        f"threads={s.threads}",
        "rollout.temperature=1.0",
        f"rollout.max_new_tokens={s.sample_max_new_tokens}",
        f"rollout.group_size={s.rl_group}",
        f"rollout.prompts_per_step={s.rl_prompts_per_step}",
        "objective.name=grpo",
        "advantage.name=grpo",
        f"optimizer.lr={s.rl_lr}",
        "reward.num_workers=0",
    ]
    if arm != "verifiable":
        overrides += ["reward.source.name=judge", "reward.success_threshold=0.5"]
    _fresh(out / "rlhf" / f"{arm}-s{seed}")
    cfg: RLConfig = build_config(RLConfig, None, overrides)
    cfg.task.params = dict(s.pair_task_params)
    if arm == "judge":
        judge_dir = out / "judges" / "par_antisymmetric-model"
        if not (judge_dir / "config.json").is_file():
            raise InvalidValueError(f"demo rm: RLHF arm 'judge' needs {judge_dir}; run the judge arms first")
        cfg.reward.source.params = {
            "judge": "hf",
            "model": str(judge_dir),
            "chat_template": s.chat_template,
            "rubric_style": s.rubric_style,
            "max_new_tokens": s.judge_max_new_tokens,
            "default_task_type": TASK_TYPE_OF.get(s.pair_task, "chat"),
            "device": "cpu",
            "precision": s.precision,
            "engine": s.engine,
            "fallback": False,
        }
    elif arm == "random":
        cfg.reward.source.params = {"judge": "random"}
    cfg.eval.at_start = cfg.eval.at_end = False
    cfg.checkpoint.final = False
    model, tok = _load(s.model, seed)
    with RLTrainer(cfg, model, tok) as tr:
        sm = tr.train(progress=progress)
        after = _policy_eval(s, tr.model, tok, seed)
    res = {
        "arm": arm,
        "seed": seed,
        "after": after,
        "train_last": {k: v for k, v in (sm.get("last") or {}).items() if isinstance(v, int | float)},
        "wall_s": time.perf_counter() - t0,
    }
    atomic_write_json(path, res)
    return res


def run_before(s: RealRMSettings, out: Path, *, seed: int = 0) -> dict[str, Any]:
    path = out / "rlhf" / "before.json"
    done = _done(path)
    if done is not None:
        return done
    t0 = time.perf_counter()
    model, tok = _load(s.model, seed)
    res = {"after": _policy_eval(s, model, tok, seed), "wall_s": time.perf_counter() - t0}
    atomic_write_json(path, res)
    return res


def _pair_points(outcomes: list[dict[str, Any]]) -> list[float]:
    """Per pair: 1 right, ½ tie (tie-as-½ scoring), 0 wrong or unparsable."""
    return [1.0 if o["correct"] else 0.5 if o["tie"] else 0.0 for o in outcomes]


def paired_vs(evals: dict[str, dict[str, Any]], ref: str = "sft") -> dict[str, dict[str, Any]]:
    """Tie-as-½ accuracy difference of every judge arm against ``ref`` on the same evaluation pairs,
    per setting both were evaluated in (BT's scalar scores are compared with each setting of ``ref``):
    mean of the per-pair differences and its standard error ``sd(d)/sqrt(n)``."""
    from posttrain.utils.stats import mean_se as _ms

    if ref not in evals:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for arm, ev in evals.items():
        if arm == ref:
            continue
        for setting, ref_ev in evals[ref].items():
            mine = ev.get(setting) or ev.get("scalar")
            if mine is None or "per_pair" not in mine or "per_pair" not in ref_ev:
                continue
            a, b = _pair_points(mine["per_pair"]), _pair_points(ref_ev["per_pair"])
            if len(a) != len(b):
                continue
            m, se = _ms([x - y for x, y in zip(a, b, strict=True)])
            out[f"{arm} - {ref} [{setting}]"] = {"mean": m, "se": se, "n": len(a)}
    return out


def summarise_real(out: Path) -> dict[str, Any]:
    """Everything finished so far: judge accuracies (strict, tie-½, CIs) per arm and setting, and the
    RLHF results per arm, mean ± SE over seeds."""
    judges = {}
    raw: dict[str, dict[str, Any]] = {}
    for arm in JUDGE_ARMS:
        r = _done(out / "judges" / f"{arm}.json")
        if r is None:
            continue
        raw[arm] = r["evals"]
        judges[arm] = {
            setting: {
                "strict": e["overall"]["accuracy"],
                "ci95": e["overall"]["ci95"],
                "tie_half": e["overall"]["accuracy_tie_half"],
                "tie": e["overall"].get("tie", 0.0),
                "unparsable": e["overall"].get("unparsable", 0.0),
                "categories": {c: v["accuracy"] for c, v in e["categories"].items()},
            }
            for setting, e in r["evals"].items()
        }
        judges[arm]["wall_s"] = r["wall_s"]  # type: ignore[assignment]
    rlhf: dict[str, Any] = {}
    before = _done(out / "rlhf" / "before.json")
    if before is not None:
        rlhf["before"] = before["after"]
    for arm in RLHF_ARMS:
        runs = sorted((out / "rlhf").glob(f"{arm}-s*.json")) if (out / "rlhf").is_dir() else []
        rows = [json.loads(p.read_text(encoding="utf-8")) for p in runs]
        if not rows:
            continue
        agg: dict[str, Any] = {"seeds": [r["seed"] for r in rows]}
        for bench in rows[0]["after"]:
            for key in (
                "accuracy",
                "prompt_strict",
                "prompt_loose",
                "instruction_strict",
                "instruction_loose",
            ):
                vals = [r["after"][bench][key] for r in rows if key in r["after"].get(bench, {})]
                if vals:
                    agg[f"{bench}/{key}"] = mean_se(vals)
        agg["wall_s"] = sum(r["wall_s"] for r in rows)
        rlhf[arm] = agg
    summary = {
        "judges": judges,
        "judges_paired_vs_sft": paired_vs(raw),
        "rlhf": rlhf,
        "pairs": _done(out / "pairs" / "stats.json"),
    }
    atomic_write_json(out / "summary.json", summary)
    return summary


def run_real_rm_demo(
    out_dir: str | Path = "runs/rm-real",
    *,
    settings: RealRMSettings | None = None,
    quick: bool = False,
    judge_arms: tuple[str, ...] = JUDGE_ARMS,
    rlhf_arms: tuple[str, ...] = RLHF_ARMS,
    progress: bool | None = False,
) -> dict[str, Any]:
    """Every stage in order, skipping finished ones (resume: rerun with the same ``out_dir``); the
    settings are saved in ``settings.json`` and a rerun must use the same ones."""
    s = settings or (RealRMSettings.quick() if quick else RealRMSettings())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cur = json.loads(json.dumps(asdict(s)))
    prev = _done(out / "settings.json")

    # threads change speed, not results
    diff = settings_diff(prev, cur, ignore=("threads",)) if prev is not None else {}
    if diff:
        raise InvalidValueError(
            f"demo rm: {out} holds a run with other settings ({', '.join(diff)} differ); use another --out "
            "or delete it"
        )
    atomic_write_json(out / "settings.json", cur)
    t0 = time.perf_counter()
    import torch

    torch.set_num_threads(s.threads)
    if judge_arms:  # the pairs feed the judges only (RLHF's judge arm reads the trained judge)
        build_pairs(s, out, seed=s.seeds[0])
    import gc

    for arm in judge_arms:
        gc.collect()  # each arm loads its own model copy: free the previous arm's before (OOM at 12 GB)
        r = run_judge_arm(s, out, arm, seed=s.seeds[0], progress=progress)
        print(f"[rm-real] judge {arm} done ({r['wall_s']:.0f} s)", flush=True)
    if rlhf_arms:
        run_before(s, out, seed=s.seeds[0])
    for seed in s.seeds:
        for arm in rlhf_arms:
            gc.collect()
            r = run_rlhf_arm(s, out, arm, seed, progress=progress)
            print(f"[rm-real] RLHF {arm} seed {seed} done ({r['wall_s']:.0f} s)", flush=True)
    summary = summarise_real(out)
    summary["wall_s_this_call"] = time.perf_counter() - t0
    print(json.dumps({"judges": summary["judges"], "rlhf": summary["rlhf"]}, indent=1, default=float)[:4000])
    return summary
