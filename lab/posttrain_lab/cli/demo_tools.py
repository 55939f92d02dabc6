"""`posttrain demo tools`: the real model with a calculator: untrained, after a tool-use warm start, after RL."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posttrain.cli.app import fail, run_folder_lock
from posttrain_lab.cli.demo import demo_app


@demo_app.command("tools")
def tools_demo(
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides of the RL config (src/posttrain/configs/tool-calling.yaml)"
    ),
    out: Path = typer.Option(Path("runs/demo-tools"), "--out", help="run directory"),
    n_eval: int = typer.Option(100, "--n-eval", min=1, help="held-out problems per arm"),
    sft_steps: int = typer.Option(
        40, "--sft-steps", min=1, help="warm-start SFT steps (8 conversations each)"
    ),
    sft_lr: float = typer.Option(5e-5, "--sft-lr", min=0.0),
    rl_steps: Optional[int] = typer.Option(None, "--rl-steps", min=0),  # noqa: UP045
    seeds: int = typer.Option(
        1, "--seeds", min=1, help="training seeds (seed, seed+1, ...): a warm start and an RL run each"
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace a previous demo in --out"),
    resume: bool = typer.Option(False, "--resume", help="continue a stopped demo: finished arms are kept"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress"),  # noqa: UP045
) -> None:
    """Real model with a calculator: no tool / tool untrained / tool after SFT warm start / tool after RL."""
    from posttrain.models.loading import ModelSpecError
    from posttrain.utils.config import ConfigError
    from posttrain_lab.demos.tools import run_tools_demo

    try:
        with run_folder_lock(out):
            run_tools_demo(
                out,
                n_eval=n_eval,
                sft_steps=sft_steps,
                sft_lr=sft_lr,
                rl_steps=rl_steps,
                seeds=seeds,
                overrides=overrides or [],
                resume=resume,
                overwrite=overwrite,
                progress=progress,
            )
    except (ConfigError, ModelSpecError, ValueError, FileNotFoundError) as e:
        fail(str(e))
