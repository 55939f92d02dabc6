"""`posttrain demo smol`: RL with verifiable instruction rewards on the built-in real model."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posttrain.cli.app import fail, run_folder_lock
from posttrain_lab.cli.demo import demo_app


@demo_app.command("smol")
def smol_demo(
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides of the RL config (posttrain_lab/demos/demo_smol.yaml)"
    ),
    out: Path = typer.Option(Path("runs/demo-smol"), "--out", help="run directory"),
    rl_steps: Optional[int] = typer.Option(None, "--rl-steps", min=0),  # noqa: UP045
    ifbench: bool = typer.Option(True, "--ifbench/--no-ifbench", help="also evaluate IFBench before/after"),
    ifbench_max_new_tokens: int = typer.Option(64, "--ifbench-max-new-tokens", min=1),
    seeds: int = typer.Option(
        1, "--seeds", min=1, help="RL seeds (seed, seed+1, ...), one shared evaluation before RL"
    ),
    seed: int = typer.Option(0, "--seed", help="first RL seed"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace a previous demo in --out"),
    resume: bool = typer.Option(False, "--resume", help="continue a stopped demo: finished parts are kept"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress"),  # noqa: UP045
) -> None:
    """Real model (SmolLM2-135M-Instruct): RL on verifiable instructions, held-out + IFBench before/after."""
    from posttrain.models.loading import ModelSpecError
    from posttrain.utils.config import ConfigError
    from posttrain_lab.demos.smol import run_smol_demo

    try:
        with run_folder_lock(out):  # one demo per folder, as `posttrain demo`
            run_smol_demo(
                out,
                rl_steps=rl_steps,
                ifbench=ifbench,
                ifbench_max_new_tokens=ifbench_max_new_tokens,
                seeds=seeds,
                seed=seed,
                resume=resume,
                progress=progress,
                overrides=overrides or [],
                overwrite=overwrite,
            )
    except (ConfigError, ModelSpecError, ValueError, FileNotFoundError) as e:
        fail(str(e))
