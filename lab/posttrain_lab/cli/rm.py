"""`posttrain rm sft | train | eval | score | demo`: PaTaRM-style generative reward models (arXiv 2510.24235)
and the Bradley-Terry baseline (heavy imports happen inside the commands)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from posttrain.cli.app import HELP, app, fail
from posttrain_lab.cli.demo import demo_app

rm_app = typer.Typer(
    help="Reward models: PaTaRM-style pointwise judges trained with PAR, Bradley-Terry baseline, evaluation.",
    no_args_is_help=True,
    context_settings=HELP,
)
app.add_typer(rm_app, name="rm")


def _pairs(data: Path, default_task_type: str) -> list:
    from posttrain_lab.recipes.patarm.data import PreferenceDataError, load_preferences

    try:
        return load_preferences(data, default_task_type=default_task_type)
    except PreferenceDataError as e:
        fail(str(e))
    raise AssertionError  # unreachable


_RUBRIC = typer.Option("full", "--rubric-style", help="judge prompt rubric block: full | names | none")
_TASK_TYPE = typer.Option(
    "chat", "--task-type", help="task type of rows without one: chat | math | code | safety"
)
_CHAT = typer.Option(False, "--chat-template/--plain", help="wrap judge prompts in the model's chat template")
_THINK = typer.Option(
    None,
    "--enable-thinking/--disable-thinking",
    help="pass enable_thinking to the judge's chat template (Qwen3); default: the template's own",
)
_KEY_ENV = typer.Option(None, "--api-key-env", help="environment variable holding the endpoint's API key")


@rm_app.command("sft")
def sft(
    overrides: list[str] | None = typer.Argument(None, help="key=value overrides of the SFT config"),
    config: Path | None = typer.Option(None, "--config", "-c", help="SFT YAML config (see docs/sft.md)"),
    traces: Path | None = typer.Option(
        None, "--traces", help="JSONL of judgment traces (prompt/completion, text or messages rows)"
    ),
    pairs: Path | None = typer.Option(
        None,
        "--pairs",
        help="preference JSONL whose chosen side is KNOWN correct: traces written by --trace "
        "(proposed templates for verifiable data)",
    ),
    trace: str = typer.Option(
        "fixed",
        "--trace",
        help="--pairs trace template: fixed (<score>8</score> / <score>3</score>) | range (7..10 / 1..4) | "
        "check (digit-by-digit final-answer check in <criteria>, then the fixed score; needs '#### answer')",
    ),
    rubric_style: str = _RUBRIC,
    task_type: str = _TASK_TYPE,
    overwrite: bool = typer.Option(False, "--overwrite", help="delete a previous run in out_dir"),
) -> None:
    """SFT cold start of a judge on judgment traces (the SFT trainer, its checkpoints and resume rules)."""
    from posttrain.train.sft import SFTConfig, SFTTrainer
    from posttrain.utils.config import ConfigError, build_config

    if (traces is None) == (pairs is None):
        fail(
            "give exactly one of --traces (a trace file) or --pairs (preference pairs with known-correct chosen)"
        )
    try:
        cfg = build_config(SFTConfig, config, [*(overrides or []), *([f"data={traces}"] if traces else [])])
    except ConfigError as e:
        fail(str(e))
    if cfg.eval.at_end and cfg.data is None and pairs is not None:
        cfg.eval.at_end = False  # held-out accuracy of the config's task is meaningless for a judge
    rows = None
    if pairs is not None:
        from posttrain_lab.recipes.patarm.demo import judgment_traces

        try:
            rows = judgment_traces(
                _pairs(pairs, task_type), rubric_style=rubric_style, seed=cfg.seed, template=trace
            )
        except ValueError as e:
            fail(f"{pairs}: {e}")
    try:
        trainer = SFTTrainer(cfg, pairs=rows)
        summary = trainer.train(overwrite=overwrite)
    except ValueError as e:
        fail(str(e))
    typer.echo(json.dumps({"steps": summary.get("steps"), "out_dir": cfg.out_dir}, default=str))


@rm_app.command("train")
def train(
    overrides: list[str] | None = typer.Argument(None, help="key=value overrides"),
    method: str = typer.Option(
        "par", "--method", help="par (RL of a judge with PAR rewards) | bt (Bradley-Terry)"
    ),
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML config (recipes/patarm/rm-*.yaml)"),
    data: Path | None = typer.Option(None, "--data", help="bt: preference JSONL / parquet"),
    task_type: str = _TASK_TYPE,
    overwrite: bool = typer.Option(False, "--overwrite", help="par: delete a previous run in out_dir"),
) -> None:
    """Train a reward model: PAR (RL of a judge) or Bradley-Terry.

    ``--method par`` runs the RL trainer with the ``par`` runner and reward source (task
    ``preferences``); ``--method bt`` trains a Bradley-Terry scalar model on ``--data``."""
    from posttrain.utils.config import ConfigError, build_config

    if method == "bt":
        from posttrain_lab.recipes.patarm.bt import BTConfig, train_bt

        if data is None:
            fail("--method bt needs --data (a preference file)")
        try:
            cfg = build_config(BTConfig, config, overrides or [])
        except ConfigError as e:
            fail(str(e))
        typer.echo(json.dumps(train_bt(cfg, _pairs(data, task_type), progress=True), default=str))
        return
    if method != "par":
        fail(f"unknown --method {method!r}; accepted: par, bt")
    from posttrain.train.config import RLConfig
    from posttrain.train.rl import RLTrainer

    try:
        rl_cfg = build_config(RLConfig, config, overrides or [])
    except ConfigError as e:
        fail(str(e))
    if rl_cfg.rollout.runner.name != "par" or rl_cfg.reward.source.name != "par":
        fail(
            "--method par needs rollout.runner.name=par and reward.source.name=par (see recipes/patarm/rm-par-demo.yaml)"
        )
    try:
        with RLTrainer(rl_cfg) as trainer:
            summary = trainer.train(overwrite=overwrite)
    except ValueError as e:
        fail(str(e))
    typer.echo(json.dumps({"steps": summary["steps"], "last": summary.get("last", {})}, default=str))


@rm_app.command("eval")
def evaluate(
    data: Path = typer.Option(..., "--data", help="RewardBench / RM-Bench-format JSONL or parquet"),
    model: list[str] = typer.Option(
        ..., "--model", "-m", help="hf:<model> | endpoint:<base_url>#<model> | bt:<dir>; repeat to compare"
    ),
    mode: str = typer.Option("pointwise", "--mode", help="pointwise | pairwise (judges only; both orders)"),
    out: Path = typer.Option(
        Path("runs/rm-eval"), "--out", help="folder for results.json, table.txt, accuracy.png"
    ),
    limit: Optional[int] = typer.Option(None, "--limit", help="first N pairs only"),  # noqa: UP045
    samples: int = typer.Option(1, "--samples", help="judgments per response (k; mean score)"),
    temperature: float = typer.Option(0.0, "--temperature", help="judge sampling temperature (0 = greedy)"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens"),
    rubric_style: str = _RUBRIC,
    task_type: str = _TASK_TYPE,
    chat_template: bool = _CHAT,
    enable_thinking: Optional[bool] = _THINK,  # noqa: UP045
    api_key_env: Optional[str] = _KEY_ENV,  # noqa: UP045
    n_boot: int = typer.Option(1000, "--n-boot", help="bootstrap resamples for the 95% CIs"),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Pairwise accuracy of reward models on RewardBench / RM-Bench-format files.

    Per subset and category, with ties, position bias and bootstrap CIs: table, JSON, PNG."""
    from posttrain_lab.recipes.patarm.evaluate import (
        evaluate_pairwise,
        evaluate_pointwise,
        table,
        write_reports,
    )
    from posttrain_lab.recipes.patarm.scorers import ScorerSpecError, build_scorer

    if mode not in ("pointwise", "pairwise"):
        fail(f"unknown --mode {mode!r}; accepted: pointwise, pairwise")
    pairs = _pairs(data, task_type)[:limit]
    results = {}
    for spec in model:
        try:
            sc = build_scorer(
                spec,
                rubric_style=rubric_style,
                samples=samples,
                temperature=temperature,
                max_new_tokens=max_new_tokens,
                chat_template=chat_template,
                enable_thinking=enable_thinking,
                api_key_env=api_key_env,
                seed=seed,
            )
            if mode == "pointwise":
                results[spec] = evaluate_pointwise(pairs, sc.pointwise, n_boot=n_boot, seed=seed)
            else:
                results[spec] = evaluate_pairwise(
                    pairs,
                    lambda items, sc=sc: sc.pairwise(items, rubric_style=rubric_style),
                    n_boot=n_boot,
                    seed=seed,
                )
        except ValueError as e:  # ScorerSpecError, model loading errors
            fail(str(e) if isinstance(e, ScorerSpecError) else f"{spec}: {e}")
    paths = write_reports(results, out)
    typer.echo(table(results))
    typer.echo(json.dumps(paths))


@rm_app.command("score")
def score(
    data: Path = typer.Option(
        ..., "--data", help="JSONL rows {prompt, response[, task_type]} or preference pairs"
    ),
    model: str = typer.Option(
        ..., "--model", "-m", help="hf:<model> | endpoint:<base_url>#<model> | bt:<dir>"
    ),
    out: Optional[Path] = typer.Option(None, "--out", help="JSONL output (default: stdout)"),  # noqa: UP045
    samples: int = typer.Option(1, "--samples"),
    temperature: float = typer.Option(0.0, "--temperature"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens"),
    rubric_style: str = _RUBRIC,
    task_type: str = _TASK_TYPE,
    chat_template: bool = _CHAT,
    api_key_env: Optional[str] = _KEY_ENV,  # noqa: UP045
) -> None:
    """Score responses with a judge or BT model (JSONL out).

    One JSON line per row with ``score`` (None when the judge gave no parsable score); preference rows
    get ``chosen_score`` and ``rejected_score``."""
    from posttrain_lab.recipes.patarm.scorers import build_scorer

    rows: list[dict] = []
    try:
        with open(data, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"{data}:{n}: invalid JSON ({e.msg})")
                if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                    fail(f"{data}:{n}: expected an object with a string 'prompt'")
                if "response" not in row and not ("chosen" in row and "rejected" in row):
                    fail(f"{data}:{n}: expected 'response' (or 'chosen' and 'rejected')")
                if "response" in row and not isinstance(row["response"], str):
                    fail(f"{data}:{n}: field 'response' must be a string")
                rows.append(row)
    except OSError as e:
        fail(f"{data}: {e}")
    try:
        sc = build_scorer(
            model,
            rubric_style=rubric_style,
            samples=samples,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            chat_template=chat_template,
            api_key_env=api_key_env,
        )
    except ValueError as e:
        fail(str(e))
    items, where = [], []
    for i, row in enumerate(rows):
        tt = str(row.get("task_type") or task_type)
        if "response" in row:
            items.append((tt, row["prompt"], row["response"]))
            where.append((i, "score"))
        else:
            for side in ("chosen", "rejected"):
                items.append((tt, row["prompt"], str(row[side])))
                where.append((i, f"{side}_score"))
    scores = sc.score(items)
    for (i, key), s in zip(where, scores, strict=True):
        rows[i][key] = s
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {len(rows)} rows to {out}", err=True)


def demo(
    out: Optional[Path] = typer.Option(  # noqa: UP045
        None, "--out", help="run directory (default runs/rm-real; with --char runs/rm-demo)"
    ),
    quick: bool = typer.Option(False, "--quick", help="a smoke test: a few steps of every stage"),
    char: bool = typer.Option(
        False,
        "--char",
        help="the character-level demo (tiny judge, 2-digit addition) instead of the real model",
    ),
    judge_arms: str = typer.Option(
        "base,sft,par_indicator,par_antisymmetric,bt", "--judge-arms", help="real model: judge arms to run"
    ),
    rlhf_arms: str = typer.Option(
        "judge,random,verifiable", "--rlhf-arms", help="real model: RLHF arms ('' none)"
    ),
    seeds: str = typer.Option("0,1", "--seeds", help="real model: RLHF seeds"),
    threads: Optional[int] = typer.Option(None, "--threads", help="real model: torch threads (default 2)"),  # noqa: UP045
    seed: int = typer.Option(0, "--seed"),
    judge_sft_steps: Optional[int] = typer.Option(None, "--judge-sft-steps", help="default 250"),  # noqa: UP045
    par_steps: Optional[int] = typer.Option(None, "--par-steps", help="default 30"),  # noqa: UP045
    bt_steps: Optional[int] = typer.Option(None, "--bt-steps", help="default 250"),  # noqa: UP045
    policy_sft_steps: Optional[int] = typer.Option(None, "--policy-sft-steps", help="default 350"),  # noqa: UP045
    policy_rl_steps: Optional[int] = typer.Option(None, "--policy-rl-steps", help="default 20"),  # noqa: UP045
    trace: str = typer.Option(
        "check", "--trace", help="judge SFT trace template: check | fixed | range (see docs/patarm.md)"
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="delete a previous demo in --out"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress"),  # noqa: UP045
) -> None:
    """PaTaRM on the built-in real model: judges from the policy's own verifiable samples, RLHF.

    Preference pairs from the real model's samples on verifiable instructions (chosen passes the
    checker, rejected is the nearest failure; evaluation pairs from unseen prompts and an unseen task)
    -> base / SFT / PAR (indicator and antisymmetric rules) judges and a BT baseline (accuracy strict
    and tie-as-1/2, greedy and k sampled judgments, rubrics on/off), then RLHF with the judge as the only
    reward vs a random judge vs the verifiable reward (held-out + IFBench, per seed). Every finished arm
    is written at once; rerun the same command to resume. --char: the character-level demo."""
    if not char:
        from posttrain_lab.recipes.patarm.real_demo import RealRMSettings, run_real_rm_demo

        def names(text: str) -> tuple[str, ...]:
            return tuple(x.strip() for x in text.split(",") if x.strip())

        try:
            base = RealRMSettings.quick() if quick else RealRMSettings()
            base.seeds = tuple(int(x) for x in names(seeds))
            if threads is not None:
                base.threads = threads
            run_real_rm_demo(
                out or Path("runs/rm-real"),
                settings=base,
                judge_arms=names(judge_arms),
                rlhf_arms=names(rlhf_arms),
                progress=progress,
            )
        except ValueError as e:
            fail(str(e))
        return
    from posttrain_lab.recipes.patarm.demo import run_rm_demo

    try:
        run_rm_demo(
            out or Path("runs/rm-demo"),
            quick=quick,
            seed=seed,
            judge_sft_steps=judge_sft_steps,
            par_steps=par_steps,
            bt_steps=bt_steps,
            policy_sft_steps=policy_sft_steps,
            policy_rl_steps=policy_rl_steps,
            progress=progress,
            overwrite=overwrite,
            trace=trace,
        )
    except ValueError as e:
        fail(str(e))


# `posttrain demo rm` (the demo registry) and its alias `posttrain rm demo`
demo_app.command("rm")(demo)
rm_app.command("demo", help="Alias of `posttrain demo rm`.")(demo)
