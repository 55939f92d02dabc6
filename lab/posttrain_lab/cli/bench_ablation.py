"""`posttrain bench ablation`: sampling / reward-shaping methods against GRPO from one SFT warm start."""

from __future__ import annotations

from pathlib import Path

import typer

from posttrain.cli.app import bench_app


def _ints(text: str, option: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"expected comma-separated integers, got {text!r}", param_hint=option
        ) from None


@bench_app.command("ablation")
def ablation(
    arms: str = typer.Option(
        "grpo,dgpo,maspo,e3,asrr,dapo,e3-asrr-dgpo", "--arms", help="Comma-separated arms to run."
    ),
    seeds: str | None = typer.Option(
        None, "--seeds", help="Comma-separated seeds, mean ± std over them (default 0,1; --quick: 0)."
    ),
    steps: int | None = typer.Option(None, "--steps", min=1, help="RL steps per arm (default 60)."),
    sft_steps: int | None = typer.Option(
        None,
        "--sft-steps",
        min=0,
        help="SFT warm-start steps (default 1050: the mixed set has 3 rows per question).",
    ),
    n_train: int | None = typer.Option(
        None,
        "--n-train",
        min=1,
        help="Training questions (default 320: an epoch = 20 steps, E3 ranks per epoch).",
    ),
    eval_every: int | None = typer.Option(None, "--eval-every", min=1, help="Held-out eval every N steps."),
    task: str = typer.Option(
        "arithmetic",
        "--task",
        help="arithmetic or dialogue-events (adds OOD macro-F1); with --model smollm2-135m: word_problems or instructions.",
    ),
    warm_start: str | None = typer.Option(
        None,
        "--warm-start",
        help="SFT set shared by all arms: mixed (scratchpad + No-Thinking direct answers, default) or scratchpad.",
    ),
    minibatches: int | None = typer.Option(
        None, "--minibatches", min=1, help="AdamW updates per rollout batch for every arm (default 2)."
    ),
    jobs: int | None = typer.Option(
        None, "--jobs", min=1, help="Worker processes, one seed each (default 1; 2 on 2 idle cores)."
    ),
    model: str = typer.Option(
        "tiny",
        "--model",
        help="tiny (SFT warm start first) or the built-in real model smollm2-135m (no SFT).",
    ),
    prompts_per_step: int | None = typer.Option(
        None, "--prompts-per-step", min=1, help="Prompts per RL step."
    ),
    group_size: int | None = typer.Option(
        None, "--group-size", min=4, max=12, help="Completions per prompt."
    ),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", min=1, help="Generation limit."),
    eval_n: int | None = typer.Option(None, "--eval-n", min=1, help="Held-out questions evaluated."),
    micro_batch_size: int | None = typer.Option(
        None,
        "--micro-batch-size",
        min=1,
        help="Sequences per forward/backward (gradient accumulation: the same update in less memory).",
    ),
    lr: float | None = typer.Option(
        None, "--lr", help="Learning rate (default: 1e-4 tiny, 2e-5 real model)."
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Keep the finished (arm, seed) results in --out and run only the missing ones.",
    ),
    summary_only: bool = typer.Option(
        False,
        "--summary-only",
        help="Run nothing: tabulate the finished (arm, seed) results in --out (same settings as their runs).",
    ),
    quick: bool = typer.Option(False, "--quick", help="Seconds-long smoke run (2 steps, tiny batches)."),
    out: Path = typer.Option(
        Path("runs/ablation"), "--out", help="Output folder (each run in its own subfolder)."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace the runs of an earlier ablation in --out."
    ),
) -> None:
    """Run the arms from the same SFT warm start, seeds and rollout budget; print the table and write
    ablation.json, ablation.md and ablation.png into --out (docs/sampling-methods.md)."""
    from rich.console import Console

    from posttrain_lab.benchmarks.ablation import AblationSettings, print_ablation, run_ablation

    given = {
        "arms": [a.strip() for a in arms.split(",") if a.strip()],
        "seeds": _ints(seeds, "--seeds") if seeds is not None else None,
        "steps": steps,
        "sft_steps": sft_steps,
        "n_train": n_train,
        "eval_every": eval_every,
        "task": task,
        "warm_start": warm_start,
        "minibatches": minibatches,
        "jobs": jobs,
        "model": model,
        "prompts_per_step": prompts_per_step,
        "group_size": group_size,
        "max_new_tokens": max_new_tokens,
        "eval_n": eval_n,
        "micro_batch_size": micro_batch_size,
        "lr": lr,
    }
    given = {k: v for k, v in given.items() if v is not None}
    try:
        settings = AblationSettings.quick(**given) if quick else AblationSettings(**given)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    err = Console(stderr=True)
    try:
        result = run_ablation(
            settings,
            out,
            overwrite=overwrite,
            resume=resume,
            summary_only=summary_only,
            log=lambda m: err.print(m, highlight=False),
        )
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        raise typer.BadParameter(str(e), param_hint="--out") from None
    print_ablation(result)
    typer.echo(f"wrote {out / 'ablation.json'}, {out / 'ablation.md'}, {result['plot']}")
