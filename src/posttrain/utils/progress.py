"""Progress: a rich bar on a terminal, plain log lines everywhere else (nohup, Slurm, a pipe, CI).

``with progress_bar("rl", total=steps) as bar: bar.advance(reward=0.5)``. On a terminal (stderr is a
tty) a rich bar shows description, n/total, elapsed, ETA and the live metrics. Without a bar, one
plain line goes to stderr every ``log_every`` items (and for the last one), so a log file under nohup
or Slurm shows progress while the job runs, not only at the end::

    rl 10/100 (10%) reward=0.406 acc=0.406 len=41.2 | elapsed 0:01:02 eta 0:09:18
"""

from __future__ import annotations

import math
import sys
import time
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

AUTO_LINES = 20
"""With ``log_every=None``: about this many plain lines over a whole run."""


class _Bar:
    def __init__(
        self,
        progress: Progress | None,
        task_id: int | None,
        desc: str,
        *,
        total: int = 0,
        completed: int = 0,
        log_every: int = 0,
    ) -> None:
        self._progress, self._task, self._desc = progress, task_id, desc
        self._total, self._done, self._start_done = total, completed, completed
        self._every = log_every
        self._t0 = time.perf_counter()

    def advance(self, n: int = 1, /, **metrics: float | str) -> None:
        """``n`` more done (positional only, so a metric may be called ``n``: ``bench silo`` showed
        ``210/60 (350%)`` when its agent count went to ``n``)."""
        self._done += n
        if self._progress is not None:
            self._progress.update(self._task, advance=n, metrics=_fmt(metrics))
            return
        if self._every > 0 and (self._done % self._every == 0 or self._done == self._total):
            self._plain_line(metrics)

    def set_metrics(self, **metrics: float | str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, metrics=_fmt(metrics))

    def log(self, text: str) -> None:
        (self._progress.console if self._progress else console).print(text)

    def _plain_line(self, metrics: dict[str, float | str]) -> None:
        elapsed = time.perf_counter() - self._t0
        ran = self._done - self._start_done
        pct = f" ({100 * self._done / self._total:.0f}%)" if self._total else ""
        eta = elapsed / ran * max(0, self._total - self._done) if ran > 0 else math.nan
        parts = [f"{self._desc} {self._done}/{self._total}{pct}"]
        if metrics:
            parts.append(_fmt(metrics))
        line = " ".join(parts) + f" | elapsed {_hms(elapsed)} eta {_hms(eta)}"
        print(line, file=sys.stderr, flush=True)


def _fmt(metrics: dict[str, float | str]) -> str:
    parts = []
    for k, v in metrics.items():
        parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)


def _hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


@contextmanager
def progress_bar(
    desc: str,
    total: int,
    *,
    enabled: bool | None = None,
    completed: int = 0,
    log_every: int | None = None,
) -> Iterator[_Bar]:
    """A rich bar when ``enabled`` (None: when stderr is a terminal), else plain lines to stderr every
    ``log_every`` items (None: about ``AUTO_LINES`` lines over the run; 0: no lines at all)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        every = max(1, math.ceil(total / AUTO_LINES)) if log_every is None else log_every
        yield _Bar(None, None, desc, total=total, completed=completed, log_every=every)
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
        yield _Bar(progress, task_id, desc, total=total, completed=completed)
