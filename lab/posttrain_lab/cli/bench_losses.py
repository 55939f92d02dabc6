"""`posttrain bench losses`: memory/time of chunked token log-probs vs naive full logits."""

from __future__ import annotations

from pathlib import Path

import typer

from posttrain.cli.app import bench_app


@bench_app.command("losses")
def bench_losses(
    tokens: int = typer.Option(4096, help="B*T tokens per step."),
    hidden: int = typer.Option(1024, help="Hidden size H."),
    vocab: list[int] = typer.Option(
        [32_000, 151_936], "--vocab", help="Vocabulary size V (repeat the option for several)."
    ),
    chunk_size: int | None = typer.Option(None, help="Tokens per chunk (default: the library default)."),
    repeats: int = typer.Option(3, help="Timed fwd+bwd repetitions per variant (median reported)."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16 | float64."),
    device: str = typer.Option("auto", help="auto (cuda if available) | cpu | cuda | cuda:N."),
    threads: int | None = typer.Option(None, help="torch CPU threads in each measured process."),
    seed: int = typer.Option(0, help="Seed of the random inputs."),
    verl: bool = typer.Option(
        True, "--verl/--no-verl", help="Compare policy losses with verl if importable."
    ),
    json_path: Path | None = typer.Option(None, "--json", help="Write all figures to this JSON file."),
) -> None:
    """Time and peak memory of `token_logprobs` fwd+bwd vs naive full logits, side by side in one run.

    Targets: peak memory <= 1/4 of naive at V = 151,936; time <= 1.2x naive. Each variant runs in a
    fresh process; on CPU peak memory is the peak RSS above the RSS after the inputs were allocated.
    """
    from posttrain.cli.app import fail
    from posttrain.utils.io import atomic_write_json
    from posttrain_lab.benchmarks.perf.losses import OutOfMemory, print_report, run_bench

    try:
        result = run_bench(
            tokens=tokens,
            hidden=hidden,
            vocabs=vocab,
            chunk_size=chunk_size,
            repeats=repeats,
            dtype=dtype,
            device=device,
            seed=seed,
            threads=threads,
            check_verl=verl,
        )
    except OutOfMemory as e:
        fail(str(e))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    print_report(result)
    if json_path is not None:
        atomic_write_json(json_path, result)
        typer.echo(f"wrote {json_path}")
