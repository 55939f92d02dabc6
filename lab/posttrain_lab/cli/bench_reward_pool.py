"""`posttrain bench reward-pool`: what a RewardPool costs per batch, measured against in-process."""

from __future__ import annotations

from pathlib import Path

import typer

from posttrain.cli.app import bench_app


@bench_app.command("reward-pool")
def bench_reward_pool(
    batch: int = typer.Option(128, help="Items per batch."),
    workers: list[int] = typer.Option([1, 2], "--workers", help="Worker counts to measure (repeatable)."),
    repeats: int = typer.Option(30, help="Timed batches per configuration (median reported)."),
    reward: str = typer.Option(
        "exact_match", help="Reward to score with (exact_match also measures hang recovery)."
    ),
    timeout_s: float = typer.Option(1.0, help="Pool per-item timeout (for the hang-recovery measurement)."),
    json_path: Path | None = typer.Option(None, "--json", help="Write all figures to this JSON file."),
) -> None:
    """Per-batch cost of RewardPool vs in-process scoring, pool start time, hang recovery time."""
    from posttrain.utils.io import atomic_write_json
    from posttrain_lab.benchmarks.perf.reward_pool import print_report, run_bench

    try:
        result = run_bench(batch=batch, workers=workers, repeats=repeats, reward=reward, timeout_s=timeout_s)
    except (KeyError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    print_report(result)
    if json_path is not None:
        atomic_write_json(json_path, result)
        typer.echo(f"wrote {json_path}")
