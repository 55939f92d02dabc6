"""`posttrain bench dpo-step`: one DPO step of posttrain vs TRL's DPOTrainer (time and peak memory)."""

from __future__ import annotations

from pathlib import Path

import typer

from posttrain.cli.app import bench_app


@bench_app.command("dpo-step")
def bench_dpo_step(
    preset: str = typer.Option(
        "tiny", help="tiny (the tiny preset) | smol (SmolLM2-135M, native precision)."
    ),
    batch: int | None = typer.Option(None, help="Pairs per optimizer step (default: the preset's)."),
    repeats: int = typer.Option(5, help="Measured steps per side (median reported)."),
    warmup: int = typer.Option(2, help="Untimed warm-up steps per side."),
    threads: int | None = typer.Option(None, help="torch CPU threads (every side, every process)."),
    memory: bool = typer.Option(
        True, "--memory/--no-memory", help="Also measure each side's peak memory in a fresh process."
    ),
    seed: int = typer.Option(0),
    json_path: Path | None = typer.Option(None, "--json", help="Write all figures to this JSON file."),
) -> None:
    """Time per DPO step and peak memory, posttrain's PreferenceTrainer vs TRL's DPOTrainer: same
    model, pairs, batch, β, lr and precision, steps interleaved in one process; ratios printed
    (docs/preference.md)."""
    import dataclasses

    from posttrain.utils.io import atomic_write_json
    from posttrain_lab.benchmarks.perf.dpo_step import get_preset, print_report, run_dpo_step_bench

    try:
        p = get_preset(preset)
        if batch is not None:
            p = dataclasses.replace(p, batch=batch)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    result = run_dpo_step_bench(
        p,
        repeats=repeats,
        warmup=warmup,
        seed=seed,
        threads=threads,
        memory=memory,
        log=lambda m: typer.echo(m, err=True),
    )
    print_report(result, typer.echo)
    if json_path is not None:
        atomic_write_json(json_path, result)
        typer.echo(f"wrote {json_path}")
