"""Results as people read them: rich tables in the terminal, the same rows as Markdown."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


def _cell(v: Any, floatfmt: str) -> str:
    if isinstance(v, float):
        return format(v, floatfmt)
    return "" if v is None else str(v)


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    floatfmt: str = ".3f",
    console: Console | None = None,
) -> None:
    table = Table(title=title, show_lines=False)
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        table.add_row(*(_cell(v, floatfmt) for v in r))
    if console is None:
        console = Console()
        if not console.is_terminal:  # a pipe or a log file: no screen to fit, so no header is cut
            from rich.measure import Measurement

            need = Measurement.get(console, console.options.update(max_width=100_000), table).maximum
            console = Console(width=max(console.width, need))
    console.print(table)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, floatfmt: str = ".3f") -> str:
    head = "| " + " | ".join(columns) + " |"
    sep = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"
    body = ["| " + " | ".join(_cell(v, floatfmt) for v in r) + " |" for r in rows]
    return "\n".join([head, sep, *body]) + "\n"
