"""Command-line interface. Each area registers its commands in its own module, imported here.

Importing a command module registers its commands on the apps of `posttrain.cli.app`. Heavy libraries
(torch, transformers) are imported inside the command functions, so `posttrain --help` stays fast.

Other packages add commands through the entry point group ``posttrain.cli``: each entry names a module
that, on import, registers its commands on :data:`posttrain.cli.app.app` (or a group of it, such as
``bench_app``). Installed packages add their demos, benchmarks and studies this way.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from posttrain.cli import export as _export  # noqa: F401
from posttrain.cli import models as _models  # noqa: F401
from posttrain.cli import preference as _preference  # noqa: F401
from posttrain.cli import samples as _samples  # noqa: F401
from posttrain.cli import serve as _serve  # noqa: F401
from posttrain.cli import tasks as _tasks  # noqa: F401
from posttrain.cli import train as _train  # noqa: F401
from posttrain.cli.app import app, bench_app

__all__ = ["app", "bench_app", "load_command_plugins", "main"]


def load_command_plugins() -> list[str]:
    """Import every module of the ``posttrain.cli`` entry point group (each registers its commands);
    returns their names. A plug-in that fails to import is reported on stderr and skipped, so a broken
    add-on never takes the library's own commands down."""
    import sys

    loaded = []
    for ep in entry_points(group="posttrain.cli"):
        try:
            ep.load()
        except Exception as e:  # report, keep the core CLI usable
            print(
                f"warning: posttrain CLI plug-in {ep.name!r} ({ep.value}) failed to load: "
                f"{type(e).__name__}: {e}",
                file=sys.stderr,
            )
            continue
        loaded.append(ep.name)
    return loaded


load_command_plugins()


def main() -> None:
    import warnings

    from posttrain.cli.app import one_line_warning

    warnings.formatwarning = one_line_warning  # `warning: <message>`, no file:line and source line
    app()
