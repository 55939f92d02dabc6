"""`posttrain samples RUN [--step N] [--worst]`: the completions an RL run logged (samples.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from posttrain.cli.app import app, fail


@app.command("samples")
def samples(
    run: Path = typer.Argument(..., help="RL run folder (holds samples.jsonl)"),
    step: Optional[int] = typer.Option(None, "--step", help="step to show (default: the last logged)"),  # noqa: UP045
    worst: bool = typer.Option(False, "--worst", help="lowest reward first (truncated first among equals)"),
    n: Optional[int] = typer.Option(None, "--n", "-n", min=1, help="show at most this many completions"),  # noqa: UP045
    width: int = typer.Option(80, "--width", min=10, help="characters of prompt / completion shown"),
    as_json: bool = typer.Option(False, "--json", help="print the rows as JSON lines instead of a table"),
) -> None:
    """Show the prompts, completions, rewards, advantages and truncation flags of one logged step
    (written every ``logging.samples_every`` steps; docs/rl-trainer.md)."""
    from posttrain.train.samples import read_samples, select

    try:
        shown, rows = select(read_samples(run), step=step, worst=worst, n=n)
    except ValueError as e:
        fail(str(e))
    if as_json:
        for r in rows:
            typer.echo(json.dumps(r))
        return
    from rich.console import Console
    from rich.table import Table

    def clip(text: str) -> str:
        text = text.replace("\n", "⏎")
        return text if len(text) <= width else text[: width - 1] + "…"

    table = Table(
        title=f"{run} · step {shown} · {len(rows)} completions" + (" · worst first" if worst else "")
    )
    for col, justify in (
        ("group", "right"),
        ("reward", "right"),
        ("adv", "right"),
        ("trunc", "center"),
        ("len", "right"),
        ("prompt", "left"),
        ("completion", "left"),
        ("answer", "left"),
    ):
        table.add_column(col, justify=justify, overflow="fold")
    for r in rows:
        table.add_row(
            str(r["group"]),
            f"{r['reward']:.3g}",
            f"{r['advantage']:+.3f}",
            "yes" if r["truncated"] else "",
            str(r["length"]),
            clip(r["prompt"]),
            clip(r["completion"]),
            clip(str(r.get("answer", ""))),
        )
    Console(width=max(120, 3 * width)).print(table)
