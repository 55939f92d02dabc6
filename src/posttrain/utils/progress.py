"""Rich progress bars with ETA and a live metric, quiet when output is not a terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)


class _Bar:
    def __init__(self, progress: Progress | None, task_id: int | None, desc: str) -> None:
        self._progress, self._task, self._desc = progress, task_id, desc

    def advance(self, n: int = 1, **metrics: float | str) -> None:
        if self._progress is None:
            return
        self._progress.update(self._task, advance=n, metrics=_fmt(metrics))

    def set_metrics(self, **metrics: float | str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, metrics=_fmt(metrics))

    def log(self, text: str) -> None:
        (self._progress.console if self._progress else console).print(text)


def _fmt(metrics: dict[str, float | str]) -> str:
    parts = []
    for k, v in metrics.items():
        parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)


@contextmanager
def progress_bar(desc: str, total: int, *, enabled: bool | None = None, completed: int = 0) -> Iterator[_Bar]:
    """`with progress_bar("rl", total=steps) as bar: bar.advance(reward=0.5)`.

    Shows description, bar, n/total, elapsed, ETA and the live metrics. Disabled (no output) when
    stderr is not a terminal unless `enabled=True`; CI logs stay clean.
    """
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield _Bar(None, None, desc)
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[metrics]}"),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task_id = progress.add_task(desc, total=total, completed=completed, metrics="")
        yield _Bar(progress, task_id, desc)
