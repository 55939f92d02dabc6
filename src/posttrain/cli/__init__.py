"""Command-line interface. Each area registers its commands in its own module, imported here."""

from __future__ import annotations

from posttrain.cli.app import app, bench_app, silo_app

# Command modules: importing them registers their commands on the apps above.
# Keep imports of heavy libraries (torch, transformers) inside the command functions.
# (one line per area, e.g. `from posttrain.cli import rl as _rl  # noqa: F401`)
from posttrain.cli import silo as _silo  # noqa: F401
from posttrain.cli import bench_rl as _bench_rl  # noqa: F401
from posttrain.cli import bench_losses as _bench_losses  # noqa: F401
from posttrain.cli import tasks as _tasks  # noqa: F401
from posttrain.cli import train as _train  # noqa: F401

__all__ = ["app", "bench_app", "main", "silo_app"]


def main() -> None:
    app()
