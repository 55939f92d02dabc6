"""`posttrain demo [NAME] ...`: the registry of demos.

Each demo is a typer command registered on :data:`demo_app` under its name, in its own CLI module::

    from posttrain_lab.cli.demo import demo_app

    @demo_app.command("mything")
    def mything_demo(out: Path = typer.Option(...), ...) -> None:
        \"\"\"One line shown by `posttrain demo --help`.\"\"\"

Dispatch (:class:`DemoGroup`): a first argument that does not start with ``-`` and holds no ``=`` is a
demo name (an unknown one is an error that lists the registered names); anything else -- no argument,
options, ``key=value`` overrides -- runs the default demo, ``rl`` (so ``posttrain demo --out runs/demo
--overwrite`` is ``posttrain demo rl --out runs/demo --overwrite``).
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from posttrain.cli.app import HELP, app

DEFAULT_DEMO = "rl"


class DemoGroup(TyperGroup):
    """A command group whose subcommand name is optional (missing -> :data:`DEFAULT_DEMO`)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] in ctx.help_option_names:
            return super().parse_args(ctx, args)  # `posttrain demo --help`: the list of demos
        first = args[0] if args else None
        if first is None or first.startswith("-") or "=" in first:
            args = [DEFAULT_DEMO, *args]
        elif first not in self.commands:
            typer.secho(
                f"error: unknown demo {first!r}; registered demos: {', '.join(sorted(self.commands))} "
                f"(with no name, or only options and key=value overrides, `posttrain demo` runs "
                f"the {DEFAULT_DEMO!r} demo)",
                fg=typer.colors.RED,
                err=True,
            )
            raise typer.Exit(code=2)
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted(self.commands)


demo_app = typer.Typer(
    cls=DemoGroup,
    help=(
        "Runnable end-to-end demos on the tiny preset. `posttrain demo NAME [OPTIONS]` runs the named demo; "
        f"with no name (only options or key=value overrides) the {DEFAULT_DEMO!r} demo runs."
    ),
    context_settings=HELP,
)
app.add_typer(demo_app, name="demo")


def demo_names() -> list[str]:
    """Names of the registered demos (those whose CLI modules have been imported)."""
    group: Any = typer.main.get_group(demo_app)
    return sorted(group.commands)
