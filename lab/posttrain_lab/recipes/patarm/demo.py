"""``posttrain demo rm``: train a tiny PaTaRM-style judge from synthetic preference pairs, compare it
with a Bradley-Terry baseline, then use it as the only reward of an RL run (proposed design).

1. Data: 2-digit addition in the scratchpad format (``arithmetic``, digit-by-digit with carries).
   Chosen = the reference solution; rejected = the same solution with a near-miss final answer (off by
   one, a carry slip, swapped digits): :func:`posttrain_lab.recipes.patarm.data.synthetic_pairs`.
2. Judges (tiny preset, 0.94 M parameters, character tokenizer; judge prompt with ``rubric_style
   = "none"`` to keep it short): the untrained judge; the **SFT** judge (cold start on judgment traces,
   by default the ``check`` template ``<criteria>11= 47x 74x</criteria><score>3</score>`` -- the
   expected final answer compared digit by digit with the response's, then 8 or 3; proposed trace
   templates for verifiable data, :func:`judgment_traces`); the **PAR** judge (the SFT judge trained further through
   :class:`~posttrain.train.rl.RLTrainer` with the ``par`` runner and reward source,
   ``recipes/patarm/rm-par-demo.yaml``); the **BT** baseline (same preset with a sequence-classification head).
3. Held-out pairwise accuracy of the four (pointwise, greedy, ties = wrong), with bootstrap CIs.
4. RLHF: a tiny policy (SFT warm start on the same task) trained with the PAR judge as its ONLY reward
   (``judge`` reward source), against the same run with a random judge; the verifiable held-out
   accuracy (exact match) before and after each run.

Run directory: ``heldout.jsonl`` (the held-out pairs), ``sft/``, ``par/``, ``bt/``, ``eval/``
(results.json, table.txt, accuracy.png),
``policy-sft/``, ``policy-judge/``, ``policy-random/`` and ``summary.json``.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError
from posttrain_lab.recipes.patarm.data import PreferencePair

TRACE_TEMPLATES = ("range", "fixed", "check")
ANSWER_MARK = "#### "


def _final_answer(text: str, where: str) -> str:
    at = text.rfind(ANSWER_MARK)
    if at < 0:
        raise InvalidValueError(
            f"{where}: trace template 'check' needs a final answer after {ANSWER_MARK.strip()!r} "
            "(verifiable-task format); use trace template 'range' or 'fixed' for other data"
        )
    return text[at + len(ANSWER_MARK) :].strip()


def check_marks(expected: str, given: str) -> str:
    """Digit-by-digit comparison written by a ``check`` trace (proposed design): for each position
    (left-aligned, ``_`` pads the shorter answer) the expected digit, the response's digit and ``=`` when
    they agree, ``x`` when not. ``check_marks("147", "174") == "11= 47x 74x"``."""
    from itertools import zip_longest

    return " ".join(f"{e}{g}{'=' if e == g else 'x'}" for e, g in zip_longest(expected, given, fillvalue="_"))


def judgment_traces(
    pairs: list[PreferencePair],
    *,
    rubric_style: str = "none",
    seed: int = 0,
    template: str = "range",
    good: int = 8,
    bad: int = 3,
) -> list[tuple[str, str]]:
    """(judge prompt, trace) SFT rows for pairs whose chosen side is known correct (proposed trace
    templates for verifiable data):

    - ``range``: ``<score>s</score>``, s drawn from 7..10 for a chosen and 1..4 for a rejected response;
    - ``fixed``: ``<score>good</score>`` / ``<score>bad</score>`` (default 8 / 3);
    - ``check``: instance-specific criteria first -- the expected final answer compared digit by digit
      with the response's (:func:`check_marks`) -- then the fixed score:
      ``<criteria>11= 47x 74x</criteria><score>3</score>``. The expected answer is the chosen
      response's final answer (after ``#### ``).

    With score-only traces the label depends on a comparison inside the response that a tiny judge did
    not find from one label token per example; ``check`` supervises the comparison itself (measured in
    docs/patarm.md). With a character-level tokenizer ``range`` writes 10 as ``1``, ``0``, a first token
    shared by the best chosen and the worst rejected score; ``fixed`` keeps the decision in one token."""
    from posttrain_lab.recipes.patarm.prompts import pointwise_prompt

    if template not in TRACE_TEMPLATES:
        raise InvalidValueError(
            f"unknown trace template {template!r}; expected one of {', '.join(TRACE_TEMPLATES)}"
        )
    rng = random.Random(seed)
    rows = []
    for k, p in enumerate(pairs):
        expected = _final_answer(p.chosen, f"pair {p.id or k} chosen") if template == "check" else ""
        for resp, is_good in ((p.chosen, True), (p.rejected, False)):
            prompt = pointwise_prompt(p.prompt, resp, p.task_type, rubric_style=rubric_style)  # type: ignore[arg-type]
            if template == "range":
                trace = f"<score>{rng.randint(7, 10) if is_good else rng.randint(1, 4)}</score>"
            else:
                trace = f"<score>{good if is_good else bad}</score>"
            if template == "check":
                given = _final_answer(resp, f"pair {p.id or k} {'chosen' if is_good else 'rejected'}")
                trace = f"<criteria>{check_marks(expected, given)}</criteria>" + trace
            rows.append((prompt, trace))
    return rows


def judge_scorer(
    model: Any,
    tokenizer: Any,
    *,
    rubric_style: str = "none",
    max_new_tokens: int = 20,
    samples: int = 1,
    temperature: float | None = None,
    chat_template: bool = False,
    enable_thinking: bool | None = None,
    seed: int = 0,
    judge: Any = None,
    batch_size: int = 256,
    precision: str = "fp32",
    engine: str = "hf",
) -> Any:
    """A ``score_fn(pairs, side)`` for :func:`posttrain_lab.recipes.patarm.evaluate.evaluate_pointwise`:
    the mean score of ``samples`` judgments per response — greedy when ``samples == 1`` (k = 1), at
    ``temperature`` 1.0 otherwise (k sampled judgments at T = 1, what PAR training optimises) unless
    ``temperature`` is given. ``judge`` replaces the in-process HF judge (tests)."""
    from posttrain_lab.recipes.patarm.judge import HFJudge, JudgeRewardSource

    if temperature is None:
        temperature = 0.0 if samples == 1 else 1.0
    if judge is None:
        judge = HFJudge(
            model_obj=model,
            tokenizer=tokenizer,
            chat_template=chat_template,
            enable_thinking=enable_thinking,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            max_batch_size=batch_size,
            precision=precision,
            engine=engine,
            seed=seed,
        )
    src = JudgeRewardSource(
        judge,
        samples=samples,
        rubric_style=rubric_style,
        cache_size=0,
        batch_size=batch_size,
        timeout_s=None,
        retry_unparsable=False,
        fallback=False,
    )

    def score(pairs: list[PreferencePair], side: str) -> list[float | None]:
        items = [(p.task_type, p.prompt, p.chosen if side == "chosen" else p.rejected) for p in pairs]
        out = []
        for j in src.judge_scores(items):
            vals = [v for v in j.scores if v is not None]
            out.append(sum(vals) / len(vals) if vals else None)
        return out

    return score


def bt_scorer(model: Any, tokenizer: Any) -> Any:
    from posttrain_lab.recipes.patarm.bt import BTRewardModel

    rm = BTRewardModel(model, tokenizer)

    def score(pairs: list[PreferencePair], side: str) -> list[float | None]:
        return rm.score(
            [p.prompt for p in pairs], [p.chosen if side == "chosen" else p.rejected for p in pairs]
        )  # type: ignore[return-value]

    return score


def _verifiable_eval(model: Any, tok: Any, task: Any, n: int, max_new_tokens: int) -> dict[str, Any]:
    from posttrain.rewards import get_reward
    from posttrain.rollout import FunctionRewardSource, HFEngine, PromptFormatter, SingleTurnRunner
    from posttrain.train.evaluate import EVAL_SEED, run_eval

    runner = SingleTurnRunner(HFEngine(model, tok, seed=EVAL_SEED, max_batch_size=512), PromptFormatter(tok))
    src = FunctionRewardSource(get_reward(task.default_reward), num_workers=0)
    ev = run_eval(runner, task.split("heldout")[:n], src, max_new_tokens=max_new_tokens)
    return {k: v for k, v in ev.items() if k != "samples"}


POLICY_MAX_NEW_TOKENS = 72


def policy_task_params(synthetic_params: dict[str, Any]) -> dict[str, Any]:
    """The policy's task parameters: the judge data's task with 5000 training questions."""
    return {**synthetic_params, "n_train": 5000}


def policy_eval(model: Any, tok: Any, task_params: dict[str, Any], n: int) -> dict[str, Any]:
    """Verifiable held-out accuracy (exact match, greedy) of a policy on ``arithmetic``."""
    from posttrain.tasks import get_task

    return _verifiable_eval(model, tok, get_task("arithmetic", **task_params), n, POLICY_MAX_NEW_TOKENS)


def judge_source(judge_dir: str | Path, *, rubric_style: str, max_new_tokens: int) -> dict[str, Any]:
    """``judge`` reward-source params for an in-process HF judge (greedy, one judgment)."""
    return {
        "judge": "hf",
        "model": str(judge_dir),
        "rubric_style": rubric_style,
        "max_new_tokens": max_new_tokens,
        "default_task_type": "math",
        "device": "cpu",
        "fallback": False,
    }


def policy_sft(
    out: Path, *, task_params: dict[str, Any], steps: int, seed: int, threads: int, progress: bool | None
) -> tuple[Any, Any]:
    """SFT warm start of the tiny policy on ``arithmetic`` (saved in ``out``)."""
    from posttrain.models import load_model_and_tokenizer
    from posttrain.train.sft import SFTConfig, SFTTrainer

    policy, ptok = load_model_and_tokenizer("tiny", device="cpu", seed=seed + 1)
    cfg = SFTConfig(
        steps=steps,
        batch_size=32,
        lr=3e-3,
        seed=seed,
        style="long",
        threads=threads,
        out_dir=str(out),
        task={"name": "arithmetic", "params": task_params},
        progress=progress,
    )
    cfg.eval.at_end = False
    sft = SFTTrainer(cfg, policy, ptok)
    sft.train()
    return sft.model, ptok


def policy_rl(
    out: Path,
    start: Path,
    source: dict[str, Any],
    *,
    task_params: dict[str, Any],
    steps: int,
    seed: int,
    prompts_per_step: int,
    threads: int,
    progress: bool | None,
    n_eval: int,
) -> dict[str, Any]:
    """RL of the policy in ``start`` with the ``judge`` reward source ``source`` as its only reward
    (PPO-clip, GRPO advantages, 8 completions per prompt, lr 1e-4); held-out accuracy after."""
    from posttrain.models import load_model_and_tokenizer
    from posttrain.train.config import RLConfig
    from posttrain.train.rl import RLTrainer
    from posttrain.utils.config import build_config

    pol, ptok = load_model_and_tokenizer(str(start), device="cpu")
    overrides = [
        f"out_dir={out}",
        "task.name=arithmetic",
        f"steps={steps}",
        f"seed={seed}",
        f"rollout.max_new_tokens={POLICY_MAX_NEW_TOKENS}",
        "rollout.group_size=8",
        f"rollout.prompts_per_step={prompts_per_step}",
        "objective.name=ppo",
        "kl.coef=0.0",
        "reward.source.name=judge",
        "reward.success_threshold=0.5",
    ]
    cfg: RLConfig = build_config(RLConfig, None, overrides)
    cfg.task.params = task_params
    cfg.reward.source.params = source
    cfg.eval.at_start = cfg.eval.at_end = False
    cfg.checkpoint.final = False
    cfg.optimizer.lr = 1e-4
    cfg.threads = threads
    with RLTrainer(cfg, pol, ptok) as tr:
        s = tr.train(progress=progress)
        after = policy_eval(tr.model, ptok, task_params, n_eval)
    return {"after": after, "last": s.get("last", {}), "wall_s": s["wall_s"]}


def run_rm_demo(
    out_dir: str | Path = "runs/rm-demo",
    *,
    quick: bool = False,
    seed: int = 0,
    judge_sft_steps: int | None = None,
    par_steps: int | None = None,
    bt_steps: int | None = None,
    policy_sft_steps: int | None = None,
    policy_rl_steps: int | None = None,
    progress: bool | None = False,
    overwrite: bool = False,
    trace: str = "check",
) -> dict[str, Any]:
    from importlib.resources import files

    from posttrain.models import load_model_and_tokenizer
    from posttrain.models.saving import save_model_dir
    from posttrain.tasks import get_task
    from posttrain.train.config import RLConfig
    from posttrain.train.rl import RLTrainer
    from posttrain.train.run_dir import prepare_run_dir
    from posttrain.train.sft import SFTConfig, SFTTrainer
    from posttrain.utils.config import build_config
    from posttrain.utils.io import atomic_write_json
    from posttrain_lab.recipes.patarm.bt import BTConfig, load_bt_model, train_bt
    from posttrain_lab.recipes.patarm.data import save_preferences
    from posttrain_lab.recipes.patarm.evaluate import evaluate_pointwise, table, write_reports

    if trace not in TRACE_TEMPLATES:
        raise InvalidValueError(
            f"unknown trace template {trace!r}; expected one of {', '.join(TRACE_TEMPLATES)}"
        )
    t0 = time.perf_counter()
    out = Path(out_dir)
    prepare_run_dir(out, overwrite=overwrite, can_resume=False)
    out.mkdir(parents=True, exist_ok=True)
    # the defaults are the settings of the measured run (docs/patarm.md, "Run 2")
    judge_sft_steps = judge_sft_steps if judge_sft_steps is not None else (5 if quick else 250)
    par_steps = par_steps if par_steps is not None else (2 if quick else 30)
    bt_steps = bt_steps if bt_steps is not None else (5 if quick else 250)
    policy_sft_steps = policy_sft_steps if policy_sft_steps is not None else (5 if quick else 350)
    policy_rl_steps = policy_rl_steps if policy_rl_steps is not None else (2 if quick else 20)
    n_eval = 40 if quick else 200

    par_cfg: RLConfig = build_config(
        RLConfig,
        str(files("posttrain_lab.recipes.patarm") / "rm-par-demo.yaml"),
        [f"out_dir={out / 'par'}", f"steps={par_steps}", f"seed={seed}"]
        + (["rollout.prompts_per_step=4"] if quick else []),
    )
    pref_task = get_task(par_cfg.task.name, **par_cfg.task.params)
    train_pairs = pref_task.pairs("train")
    held_pairs = pref_task.pairs("heldout")[:n_eval]
    save_preferences(held_pairs, out / "heldout.jsonl")  # for `posttrain rm eval --data`
    rubric = par_cfg.rollout.runner.params.get("rubric_style", "none")
    max_judge = par_cfg.rollout.max_new_tokens
    timings: dict[str, float] = {}
    results: dict[str, dict[str, Any]] = {}

    def evaluate(name: str, score_fn: Any) -> None:
        results[name] = r = evaluate_pointwise(held_pairs, score_fn, n_boot=1000, seed=seed)
        o = r["overall"]
        print(
            f"[{time.perf_counter() - t0:.0f} s] {name}: held-out accuracy {100 * o['accuracy']:.1f} % "
            f"(ties {100 * o['tie']:.1f} %, unparsable {100 * o['unparsable']:.1f} %)",
            flush=True,
        )

    # ---- untrained judge
    judge0, jtok = load_model_and_tokenizer(par_cfg.model.name, device="cpu", seed=seed)
    traces = judgment_traces(train_pairs, rubric_style=rubric, seed=seed, template=trace)
    # room for the longest trace (+ EOS and slack) when judging and in the PAR rollouts
    max_judge = max(max_judge, max(len(jtok.encode(c, add_special_tokens=False)) for _, c in traces) + 4)
    par_cfg.rollout.max_new_tokens = max_judge
    evaluate("untrained judge", judge_scorer(judge0, jtok, rubric_style=rubric, max_new_tokens=max_judge))

    # ---- SFT cold start on judgment traces
    t = time.perf_counter()
    sft_cfg = SFTConfig(
        model=par_cfg.model,
        steps=judge_sft_steps,
        batch_size=32,
        lr=3e-3,
        seed=seed,
        threads=par_cfg.threads,
        out_dir=str(out / "sft"),
        progress=progress,
    )
    sft_cfg.eval.at_end = False
    sft = SFTTrainer(sft_cfg, judge0, jtok, pairs=traces)
    sft.train()
    timings["judge_sft_s"] = time.perf_counter() - t
    evaluate("SFT judge", judge_scorer(sft.model, jtok, rubric_style=rubric, max_new_tokens=max_judge))

    # ---- PAR RL of the judge (the ordinary RL trainer; runner + reward source 'par')
    t = time.perf_counter()
    par_cfg.model.name = str(out / "sft")
    with RLTrainer(par_cfg, sft.model, jtok) as trainer:
        par_summary = trainer.train(progress=progress)
        par_dir = save_model_dir(trainer.model, trainer.tokenizer, out / "par" / "model")
        evaluate(
            "PAR judge", judge_scorer(trainer.model, jtok, rubric_style=rubric, max_new_tokens=max_judge)
        )
    timings["par_rl_s"] = time.perf_counter() - t

    # ---- Bradley-Terry baseline
    t = time.perf_counter()
    bt_cfg = BTConfig(
        model="tiny", steps=bt_steps, batch_size=32, lr=1e-3, seed=seed, device="cpu", out_dir=str(out / "bt")
    )
    bt_summary = train_bt(bt_cfg, train_pairs)
    timings["bt_s"] = time.perf_counter() - t
    bt_model, bt_tok = load_bt_model(bt_summary["model"], device="cpu")
    evaluate("BT (scalar head)", bt_scorer(bt_model, bt_tok))

    reports = write_reports(results, out / "eval")
    judge_table = table(results)
    print(judge_table)

    # ---- RLHF: policy trained with the PAR judge as its only reward vs a random judge
    t = time.perf_counter()
    task_params = policy_task_params(par_cfg.task.params["synthetic_params"])
    psft_model, ptok = policy_sft(
        out / "policy-sft",
        task_params=task_params,
        steps=policy_sft_steps,
        seed=seed,
        threads=par_cfg.threads,
        progress=progress,
    )
    before = policy_eval(psft_model, ptok, task_params, n_eval)
    runs: dict[str, Any] = {}
    for name, source in (
        ("PAR judge", judge_source(par_dir, rubric_style=rubric, max_new_tokens=max_judge)),
        ("random judge", {"judge": "random"}),
    ):
        runs[name] = policy_rl(
            out / ("policy-" + name.split()[0].lower()),
            out / "policy-sft",
            source,
            task_params=task_params,
            steps=policy_rl_steps,
            seed=seed,
            prompts_per_step=4 if quick else 16,
            threads=par_cfg.threads,
            progress=progress,
            n_eval=n_eval,
        )
    timings["policy_s"] = time.perf_counter() - t

    slim = {k: {kk: vv for kk, vv in v.items() if kk != "per_pair"} for k, v in results.items()}
    summary = {
        "judges": slim,
        "judge_table": judge_table,
        "par_last_metrics": par_summary.get("last", {}),
        "bt_last": bt_summary["last"],
        "policy": {"before": before, **runs},
        "steps": {
            "judge_sft": judge_sft_steps,
            "par": par_steps,
            "bt": bt_steps,
            "policy_sft": policy_sft_steps,
            "policy_rl": policy_rl_steps,
        },
        "trace_template": trace,
        "judge_max_new_tokens": max_judge,
        "n_train_pairs": len(train_pairs),
        "n_eval_pairs": len(held_pairs),
        "timings": timings,
        "wall_s": time.perf_counter() - t0,
        "reports": reports,
    }
    atomic_write_json(out / "summary.json", summary)
    print(
        f"\npolicy held-out accuracy (exact match, greedy): after SFT {100 * before['accuracy']:.1f} %; "
        + "; ".join(f"RL with {k}: {100 * v['after']['accuracy']:.1f} %" for k, v in runs.items())
    )
    print(f"wall {summary['wall_s']:.0f} s; summary: {out / 'summary.json'}; judge eval: {reports}")
    return summary
