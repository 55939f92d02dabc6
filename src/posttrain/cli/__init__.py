"""Command-line interface. Each area registers its commands in its own module, imported here.

Importing a command module registers its commands on the apps of `posttrain.cli.app`. Heavy libraries
(torch, transformers) are imported inside the command functions, so `posttrain --help` stays fast.
"""

from __future__ import annotations

from posttrain.cli import analyze as _analyze  # noqa: F401
from posttrain.cli import bench_ablation as _bench_ablation  # noqa: F401
from posttrain.cli import bench_losses as _bench_losses  # noqa: F401
from posttrain.cli import bench_rl as _bench_rl  # noqa: F401
from posttrain.cli import cit as _cit  # noqa: F401
from posttrain.cli import demo_smol as _demo_smol  # noqa: F401
from posttrain.cli import models as _models  # noqa: F401
from posttrain.cli import rm as _rm  # noqa: F401
from posttrain.cli import scpg as _scpg  # noqa: F401
from posttrain.cli import serve as _serve  # noqa: F401
from posttrain.cli import silo as _silo  # noqa: F401
from posttrain.cli import tasks as _tasks  # noqa: F401
from posttrain.cli import train as _train  # noqa: F401
from posttrain.cli.app import app, bench_app, silo_app

__all__ = ["app", "bench_app", "main", "silo_app"]


def main() -> None:
    app()
