"""`posttrain dpo`: preference optimization (DPO, IPO, SimPO, ORPO, KTO) on a preference file."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Optional

import typer

from posttrain.cli.app import app, fail, run_folder_lock
from posttrain.cli.train import (
    _ALLOW_CHANGE,
    _OVERWRITE,
    _RESUME,
    _check_run_dir,
    _interrupted,
    _load,
    _sigterm_as_interrupt,
    _write_failed,
)


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
    from posttrain.train.checkpoint import CheckpointError, CheckpointWriteError, RunWriteError
    from posttrain.train.preference import PreferenceConfig, PreferenceTrainer
    from posttrain.train.run_dir import RunDirError

    cfg = _load(PreferenceConfig, config, overrides or [])
    if progress is not None:
        cfg.progress = progress
    with run_folder_lock(cfg) if cfg.save else contextlib.nullcontext():
        if cfg.save:
            _check_run_dir(cfg, resume=resume, overwrite=overwrite, allow_config_change=allow_config_change)
        try:
            trainer = PreferenceTrainer(cfg, resume=resume)
        except (ValueError, FileNotFoundError) as e:
            fail(str(e))
        with trainer:
            try:
                with _sigterm_as_interrupt():
                    summary = trainer.train(overwrite=overwrite, allow_config_change=allow_config_change)
            except KeyboardInterrupt as e:
                _interrupted("posttrain dpo", cfg, trainer.step_idx, config, overrides or [], e)
            except (CheckpointWriteError, RunWriteError) as e:
                _write_failed("posttrain dpo", cfg, config, overrides or [], e)
            except (RunDirError, CheckpointError, ValueError, FileNotFoundError) as e:
                fail(str(e))
    last = summary["last"]
    keys = ("loss", "rewards/margins", "rewards/accuracies")
    typer.echo(json.dumps({k: v for k, v in summary.items() if k != "last"} | {k: last.get(k) for k in keys}))
