"""`posttrain dpo`: preference optimization (DPO, IPO, SimPO, ORPO, KTO) on a preference file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from posttrain.cli.app import app
from posttrain.cli.train import _ALLOW_CHANGE, _OVERWRITE, _RESUME, _load, run_training_command


@app.command()
def dpo(
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides, e.g. data=pairs.jsonl loss.name=ipo loss.params.beta=0.5"
    ),
    config: Optional[Path] = typer.Option(None, "--config", "-c"),  # noqa: UP045
    resume: bool = _RESUME,
    overwrite: bool = _OVERWRITE,
    allow_config_change: bool = _ALLOW_CHANGE,
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress"),  # noqa: UP045
) -> None:
    """Preference optimization on prompt/chosen/rejected pairs (TRL's standard or conversational rows):
    loss.name = dpo (sigmoid, cDPO), ipo, simpo, orpo or kto; see docs/preference.md."""
    from posttrain.train.preference import PreferenceConfig, PreferenceTrainer

    cfg = _load(PreferenceConfig, config, overrides or [])
    if progress is not None:
        cfg.progress = progress
    summary = run_training_command(
        "posttrain dpo",
        cfg,
        lambda: PreferenceTrainer(cfg, resume=resume),
        config=config,
        overrides=overrides or [],
        resume=resume,
        overwrite=overwrite,
        allow_config_change=allow_config_change,
    )
    last = summary["last"]
    keys = ("loss", "rewards/margins", "rewards/accuracies")
    typer.echo(json.dumps({k: v for k, v in summary.items() if k != "last"} | {k: last.get(k) for k in keys}))
