"""`posttrain bench preference`: GRPO vs online DPO vs offline DPO from one warm start, same budget."""

from __future__ import annotations

from pathlib import Path

import typer

from posttrain.cli.app import bench_app


@bench_app.command("preference")
def bench_preference(
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides of the GRPO arm's config (demo_smol.yaml), e.g. eval.n=200"
    ),
    out: Path = typer.Option(Path("runs/bench-preference"), "--out", help="Output folder (resumable)."),
    model: str | None = typer.Option(None, "--model", help="Warm start (default: demo smol's smollm2-135m)."),
    steps: int = typer.Option(30, "--steps", min=1, help="Training steps per arm (demo smol's 30)."),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Seeds per arm: seed, seed+1, ..."),
    seed: int = typer.Option(0, "--seed"),
    arms: str = typer.Option("grpo,online-dpo,offline-dpo", "--arms", help="Comma-separated arms."),
    dpo_lr: float = typer.Option(
        2e-5, "--dpo-lr", help="DPO arms' learning rate (GRPO arm's: the same AdamW step size)."
    ),
    beta: float = typer.Option(0.1, "--beta", help="DPO's beta."),
    resume: bool = typer.Option(False, "--resume", help="Keep finished arms and seeds, continue the rest."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Delete the output folder first."),
) -> None:
    """GRPO vs online DPO vs offline DPO (pairs sampled once from the warm start) on demo smol's
    instruction task and guarded reward, at the same number of generated completions: held-out
    accuracy, hacked_frac, answer length, paired SEs (docs/preference.md)."""
    from posttrain_lab.benchmarks.preference import run_preference_bench, table

    summary = run_preference_bench(
        out,
        model=model,
        steps=steps,
        seeds=seeds,
        seed=seed,
        arms=tuple(a.strip() for a in arms.split(",") if a.strip()),
        dpo_lr=dpo_lr,
        beta=beta,
        overrides=list(overrides or []),
        resume=resume,
        overwrite=overwrite,
    )
    typer.echo(table(summary))
    typer.echo(f"wrote {out / 'summary.json'}")
