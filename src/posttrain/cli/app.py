"""The typer application objects. Command modules register onto these; see `posttrain.cli`.

``-h`` works as ``--help`` on every command (click passes ``help_option_names`` down to
sub-commands); ``posttrain --version`` prints the version.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NoReturn, Optional

import click
import typer
from typer.core import TyperGroup

HELP = {"help_option_names": ["-h", "--help"]}
TRACEBACK_ENV = "POSTTRAIN_TRACEBACK"


class OneLineErrors(TyperGroup):
    """The root command group: an error posttrain raises on purpose (a ``PosttrainError``: a missing
    package with its install command, a bad input ...) that no command caught ends the command with
    ``error: <message>`` on stderr and exit code 1, not a traceback of the library's internals. Every
    command runs inside, the lab's included (they join these groups). ``POSTTRAIN_TRACEBACK=1`` shows
    the traceback instead."""

    def invoke(self, ctx: click.Context) -> Any:
        from posttrain.utils.errors import PosttrainError

        try:
            return super().invoke(ctx)
        except PosttrainError as e:
            if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
                raise
            typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
            raise typer.Exit(code=1) from None


def fail(msg: str) -> NoReturn:
    """Print ``error: msg`` in red on stderr and exit with code 2 (bad input: file, key, option)."""
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


def run_folder_lock(target: Any) -> Any:
    """The run folder's exclusive lock for a whole command (``target``: a path or a config with
    ``out_dir``); a clear error when another live run holds it."""
    from posttrain.train.run_dir import RunDirError, lock_run_dir

    try:
        return lock_run_dir(target if isinstance(target, str | Path) else target.out_dir)
    except RunDirError as e:
        fail(str(e))


app = typer.Typer(
    name="posttrain",
    cls=OneLineErrors,
    help="LLM post-training: GRPO-family RL, SFT, generative reward models, SILO-BENCH, continual instruction tuning, IFT analyses, SCPG.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    context_settings=HELP,
)
bench_app = typer.Typer(
    help="Benchmarks that print side-by-side ratios measured in one run.",
    no_args_is_help=True,
    context_settings=HELP,
)
app.add_typer(bench_app, name="bench")


def _print_version(value: bool) -> None:
    if value:
        from posttrain import __version__

        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    version: Optional[bool] = typer.Option(  # noqa: UP045
        None, "--version", "-V", help="Print the version and exit.", callback=_print_version, is_eager=True
    ),
) -> None:
    """LLM post-training: GRPO-family RL, SFT, generative reward models, SILO-BENCH, continual instruction tuning, IFT analyses, SCPG."""
    from posttrain.utils.errors import command_line_messages

    # errors raised while a command runs name options by their flags (--resume), not as Python
    # arguments (resume=True); left when the command ends (the CLI may run inside a Python process)
    ctx.with_resource(command_line_messages())


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """Warnings on the command line (``main`` installs it): ``warning: <message>``, without Python's
    file:line and source line (``warnings.warn(msg, DegenerateSettingWarning, stacklevel=3)`` meant
    nothing to a user)."""
    return f"warning: {message}\n"


@app.command()
def version() -> None:
    """Print the posttrain version."""
    from posttrain import __version__

    typer.echo(__version__)
