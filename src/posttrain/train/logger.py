"""Run logging: ``metrics.jsonl`` always (one row per step, one per evaluation), ``samples.jsonl``
(the completions of every ``logging.samples_every``-th step, :mod:`posttrain.train.samples`),
TensorBoard and Weights & Biases optionally (imported only when enabled)."""

from __future__ import annotations

import json
import numbers
import sys
from pathlib import Path
from typing import Any

from posttrain.train.samples import SamplesLog, sample_rows
from posttrain.utils.errors import MissingPackageError
from posttrain.utils.io import append_jsonl, atomic_write_text, read_jsonl

METRICS_FILE = "metrics.jsonl"


def eval_line(step: int, ev: dict[str, Any]) -> str | None:
    """One line for stderr per evaluation (``echo``): held-out accuracy (RL, task SFT) or loss."""
    parts = []
    if isinstance(ev.get("accuracy"), numbers.Real):
        where = ev.get("split", "held-out")  # SFT's calibration set (sft_warm_start(stop_at=...))
        parts.append(f"{where} accuracy {ev['accuracy']:.3f} (greedy pass@1, n={ev.get('n', '?')})")
    if isinstance(ev.get("preference_accuracy"), numbers.Real):  # posttrain dpo (train/preference.py)
        parts.append(
            f"held-out preference accuracy {ev['preference_accuracy']:.3f} (n={ev.get('n', '?')} pairs)"
        )
    for k in sorted(k for k in ev if k.startswith("pass@")):
        parts.append(f"{k} {ev[k]:.3f}")
    if isinstance(ev.get("loss"), numbers.Real):
        parts.append(f"held-out loss {ev['loss']:.4f}")
    return f"eval at step {step}: " + ", ".join(parts) if parts else None


def logging_packages(*, tensorboard: bool, wandb: bool) -> tuple[Any, Any]:
    """(TensorBoard's ``SummaryWriter`` class, the ``wandb`` module), each None when not asked for; a
    :class:`MissingPackageError` naming the setting and the extra when one asked for is not installed
    (the command line checks this before it loads a model)."""
    writer = wb = None
    if tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter as writer
        except ImportError as e:
            raise MissingPackageError(
                'logging.tensorboard=true needs tensorboard: pip install -e ".[tensorboard]" '
                "(or pip install tensorboard)"
            ) from e
    if wandb:
        try:
            import wandb as wb
        except ImportError as e:
            raise MissingPackageError(
                'logging.wandb=true needs wandb: pip install -e ".[wandb]" (or pip install wandb)'
            ) from e
    return writer, wb


class MetricsLogger:
    """Rows are ``{"kind": "step", "step": s, ...metrics}`` or ``{"kind": "eval", "step": s, ...}``.

    ``truncate_after``: when resuming from step s, rows of the killed run with step > s are dropped
    (rewritten atomically) so the log has each step exactly once."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = False,
        wandb: bool = False,
        wandb_project: str = "posttrain",
        config: dict[str, Any] | None = None,
        truncate_after: int | None = None,
        echo: bool = True,
    ) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.samples = SamplesLog(run_dir, truncate_after=truncate_after)
        self.echo = echo
        if truncate_after is not None and self.path.exists():
            rows = [r for r in read_jsonl(self.path) if int(r.get("step", 0)) <= truncate_after]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))
        self._tb = None
        self._wandb = None
        writer, wb = logging_packages(tensorboard=tensorboard, wandb=wandb)
        if writer is not None:
            self._tb = writer(str(Path(run_dir) / "tensorboard"))
        if wb is not None:
            self._wandb = wb.init(project=wandb_project, config=config or {}, dir=str(run_dir))

    def log_step(self, metrics: dict[str, Any]) -> None:
        row = {"kind": "step", **metrics}
        self._append(row, f"the metrics of step {metrics['step']}")
        self._scalars("train", int(metrics["step"]), metrics)

    def log_eval(self, step: int, ev: dict[str, Any]) -> None:
        row = {"kind": "eval", "step": step, **{k: v for k, v in ev.items() if k != "samples"}}
        self._append(row, f"the evaluation at step {step}")
        self._scalars("eval", step, row)
        line = eval_line(step, row)
        if self.echo and line:
            print(line, file=sys.stderr, flush=True)

    def logged_eval(self, step: int) -> dict[str, Any] | None:
        """The evaluation logged at ``step`` (its metrics, as ``log_eval`` was given them), or None: a
        resumed run reports the ``eval_start`` its first part made."""
        if not self.path.exists():
            return None
        for row in read_jsonl(self.path):
            if row.get("kind") == "eval" and int(row.get("step", -1)) == step:
                return {k: v for k, v in row.items() if k not in ("kind", "step")}
        return None

    def log_samples(self, step: int, scored: Any, *, every: int) -> None:
        """Every ``every``-th step (0 = never): the step's completions (``scored`` = the step's
        ``(StepRollout, StepScores)``) to ``samples.jsonl`` and the enabled loggers."""
        if not every or step % every or scored is None:  # None: a custom step() that kept no batch
            return
        try:
            self.samples.write(sample_rows(step, *scored), tensorboard=self._tb, wandb=self._wandb)
        except OSError as e:
            raise self._write_failed(
                f"append the samples of step {step} to {self.samples.path}", e, "the rows before them"
            ) from e

    def _append(self, row: dict[str, Any], what: str) -> None:
        """One row onto metrics.jsonl; a failed write (disk full) is one line naming the file, what was
        kept and where to continue, not the traceback of the write (append_jsonl leaves no partial row)."""
        try:
            append_jsonl(self.path, row)
        except OSError as e:
            raise self._write_failed(f"append {what} to {self.path}", e, "the rows before it") from e

    def _write_failed(self, what: str, e: OSError, rows: str) -> Exception:
        from posttrain.train.checkpoint import run_write_failed

        kept = f"{rows} are kept (no partial row) and the run stopped"
        return run_write_failed(what, e, kept, self.path.parent / "checkpoints")

    def _scalars(self, prefix: str, step: int, values: dict[str, Any]) -> None:
        nums = {
            f"{prefix}/{k}": float(v)
            for k, v in values.items()
            if isinstance(v, numbers.Real) and k != "step"
        }
        if self._tb is not None:
            for k, v in nums.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(nums, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
