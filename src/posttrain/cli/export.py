"""`posttrain export --merge RUN OUT`: a LoRA run's adapters merged into a plain Hugging Face directory."""

from __future__ import annotations

from pathlib import Path

import typer

from posttrain.cli.app import app, fail


@app.command("export")
def export(
    source: str = typer.Argument(..., help="LoRA run folder, checkpoint or adapter directory"),
    out: Path = typer.Argument(..., help="output directory (a plain Hugging Face model directory)"),
    merge: bool = typer.Option(
        False, "--merge", help="merge the LoRA adapters into the base weights (merge_and_unload)"
    ),
    dtype: str | None = typer.Option(None, "--dtype", help="load dtype (default: the run's model.dtype)"),
) -> None:
    """Write a model a run produced as a standalone Hugging Face directory (docs/lora.md).

    ``--merge``: the base model with the adapters merged into its weights, loadable by anything that
    reads Hugging Face models (``from_pretrained``, vLLM, ``posttrain serve``) without peft."""
    if not merge:
        fail("posttrain export needs --merge (the only export so far): posttrain export --merge RUN OUT")
    from posttrain.models.loading import ModelSpecError, merged_model
    from posttrain.models.saving import save_model_dir

    try:
        model, tokenizer = merged_model(source, dtype=dtype)
    except (ModelSpecError, ValueError, ImportError) as e:
        fail(str(e))
    save_model_dir(model, tokenizer, out)
    n = sum(p.numel() for p in model.parameters())
    typer.echo(f"wrote {out} (merged, {n / 1e6:.2f} M parameters)")
