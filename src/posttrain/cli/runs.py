"""The body every training command shares: run-folder checks and lock, building the trainer, training
with Ctrl-C / SIGTERM reported as a resumable stop, and one-line errors. ``posttrain dpo`` runs
through it; ``posttrain sft`` (cli/train.py) has the same body inline."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posttrain.cli.app import fail, run_folder_lock


def run_training_command(
    command: str,
    cfg: Any,
    make_trainer: Callable[[], Any],
    *,
    config: Path | None,
    overrides: list[str],
    resume: bool,
    overwrite: bool,
    allow_config_change: bool,
) -> dict[str, Any]:
    """Check and lock ``cfg.out_dir`` (when ``cfg.save``), build the trainer with ``make_trainer()``,
    train it; return the run summary. Bad input ends the command with ``error: ...`` (exit 2); an
    interrupt prints where it stopped and the exact resume command (exit 130 / 143)."""
    from posttrain.cli.train import (
        _check_run_dir,
        _interrupted,
        _sigterm_as_interrupt,
        _write_failed,
    )
    from posttrain.train.checkpoint import CheckpointError, CheckpointWriteError, RunWriteError
    from posttrain.train.run_dir import RunDirError

    with run_folder_lock(cfg) if cfg.save else contextlib.nullcontext():
        if cfg.save:
            _check_run_dir(cfg, resume=resume, overwrite=overwrite, allow_config_change=allow_config_change)
        try:
            trainer = make_trainer()
        except (ValueError, FileNotFoundError) as e:
            fail(str(e))
        with trainer:
            try:
                with _sigterm_as_interrupt():
                    return trainer.train(overwrite=overwrite, allow_config_change=allow_config_change)
            except KeyboardInterrupt as e:
                _interrupted(command, cfg, trainer.step_idx, config, overrides, e)
            except (CheckpointWriteError, RunWriteError) as e:
                _write_failed(command, cfg, config, overrides, e)
            except (RunDirError, CheckpointError, ValueError, FileNotFoundError) as e:
                fail(str(e))
