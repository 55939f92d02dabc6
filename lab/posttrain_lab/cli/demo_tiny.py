"""`posttrain demo` (default `rl`): the tiny model's SFT warm start, RL, held-out accuracy before/after."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posttrain.cli.app import fail, run_folder_lock
from posttrain_lab.cli.demo import demo_app


@demo_app.command("rl")
def demo(
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides of the RL config (posttrain_lab/demos/demo.yaml)"
    ),
    out: Path = typer.Option(Path("runs/demo"), "--out", help="run directory"),
    objective: str = typer.Option("dgpo", "--objective", help="policy loss for the RL stage"),
    quick: bool = typer.Option(False, "--quick", help="a few steps only (smoke test)"),
    sft_steps: Optional[int] = typer.Option(  # noqa: UP045
        None, "--sft-steps", help="the warm start's step limit (default 400)"
    ),
    sft_until: float = typer.Option(
        0.3,
        "--sft-until",
        min=0.0,
        max=1.0,
        help="stop the warm start at this greedy accuracy on 200 calibration questions (0: run all steps)",
    ),
    rl_steps: Optional[int] = typer.Option(None, "--rl-steps"),  # noqa: UP045
    seed: int = typer.Option(0, "--seed"),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="--out holds a previous demo: delete its run files and start again"
    ),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress"),  # noqa: UP045
) -> None:
    """Tiny model: short SFT warm start, RL (DGPO by default), held-out accuracy before/after (default)."""
    from posttrain.algos import POLICY_LOSSES

    try:
        POLICY_LOSSES.check(objective)  # a registered name or a plug-in package.module:Name
    except ValueError as e:
        fail(f"--objective: {e}")
    from posttrain.utils.config import ConfigError
    from posttrain_lab.demos.tiny import run_demo

    try:
        with run_folder_lock(out):
            run_demo(
                out,
                objective=objective,
                quick=quick,
                sft_steps=sft_steps,
                sft_until=sft_until or None,
                rl_steps=rl_steps,
                seed=seed,
                progress=progress,
                overrides=overrides or [],
                overwrite=overwrite,
            )
    except (ConfigError, ValueError) as e:
        fail(str(e))
