"""The typer application objects. Command modules register onto these; see `posttrain.cli`."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="posttrain",
    help="LLM post-training: GRPO-family RL, reward models, SILO-BENCH, instruction tuning.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
bench_app = typer.Typer(
    help="Benchmarks that print side-by-side ratios measured in one run.", no_args_is_help=True
)
silo_app = typer.Typer(help="SILO-BENCH multi-agent coordination benchmark.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(silo_app, name="silo")


@app.command()
def version() -> None:
    """Print the posttrain version."""
    from posttrain import __version__

    typer.echo(__version__)
