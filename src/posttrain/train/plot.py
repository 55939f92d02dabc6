"""Learning curves (PNG) from a run's ``metrics.jsonl``."""

from __future__ import annotations

import io
from pathlib import Path

from posttrain.train.checkpoint import RunWriteError, io_failure
from posttrain.utils.errors import InvalidValueError
from posttrain.utils.io import atomic_write_bytes, read_jsonl

PANELS = (
    ("loss", "loss (nats/token)"),
    ("reward_mean", "reward (mean)"),
    ("accuracy", "train accuracy"),
    ("entropy", "entropy (nats/token)"),
    ("length_mean", "completion length"),
    ("zero_var_frac", "zero-variance groups"),
    ("grad_norm", "grad norm"),
    ("clipfrac", "clip fraction"),
    ("kl", "KL to reference"),
    ("approx_kl", "KL(old || new), per update"),
    ("lr", "learning rate"),
)
"""Training panels, in order; a metric absent from the log gets no panel. The accuracy panel is
dropped when it repeats the reward panel (a 0/1 reward with success threshold 1 gives the same
curve), the old-vs-new KL when the KL to the reference (``kl.coef > 0``) is shown."""


def _redundant(key: str, steps: list[dict]) -> bool:
    if key == "accuracy":
        return all(r.get("accuracy") == r.get("reward_mean") for r in steps)
    if key == "approx_kl":
        return any("kl" in r for r in steps)
    return False


def select_panels(steps: list[dict]) -> list[tuple[str, str]]:
    """(metric, title) of the training panels for these step rows (see :data:`PANELS`)."""
    return [(k, t) for k, t in PANELS if any(k in r for r in steps) and not _redundant(k, steps)]


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``<run_dir>/curves.png`` (or ``out``): one panel per training metric present, plus
    held-out accuracy from the eval rows, plus the evaluation harness's scores (``eval.harness``:
    every ``harness/<task>/<metric>`` of the eval rows but the standard errors). A demo folder (``runs/demo``) plots its ``rl/`` run.
    Raises FileNotFoundError / ValueError naming the file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file() and (run_dir / "rl" / "metrics.jsonl").is_file():
        path = run_dir / "rl" / "metrics.jsonl"  # a demo folder: its RL stage
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics file (is {str(run_dir)!r} a run directory?)")
    rows = list(read_jsonl(path))
    steps = [r for r in rows if r.get("kind") == "step"]
    evals = [r for r in rows if r.get("kind") == "eval" and "accuracy" in r]
    if not steps and not evals:
        raise InvalidValueError(f"{path}: no step or eval rows to plot")
    panels = select_panels(steps)
    harness = sorted(
        {k for r in rows if r.get("kind") == "eval" for k in r if k.startswith("harness/") and "_stderr" not in k}
    )
    n = len(panels) + (1 if evals else 0) + (1 if harness else 0)
    cols = min(3, n)
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, (key, title) in zip(flat, panels, strict=False):
        pts = [(r["step"], r[key]) for r in steps if key in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.2, label="train")
        held = [(r["step"], r[key]) for r in rows if r.get("kind") == "eval" and key == "loss" and key in r]
        if held:  # an SFT run's held-out loss on the same axes
            ax.plot([p[0] for p in held], [p[1] for p in held], "o-", label="held-out")
            ax.legend(fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if evals:
        ax = flat[len(panels)]
        ax.plot([r["step"] for r in evals], [r["accuracy"] for r in evals], "o-", label="greedy pass@1")
        for k in sorted({k for r in evals for k in r if k.startswith("pass@")}):
            ax.plot([r["step"] for r in evals if k in r], [r[k] for r in evals if k in r], "s--", label=k)
        ax.set_title("held-out accuracy")
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if harness:
        ax = flat[len(panels) + (1 if evals else 0)]
        for k in harness:
            pts = [(r["step"], r[k]) for r in rows if r.get("kind") == "eval" and k in r]
            ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", label=k.removeprefix("harness/"))
        ax.set_title("evaluation harness")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in flat[n:]:
        ax.axis("off")
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    target = Path(out) if out is not None else run_dir / "curves.png"
    try:
        atomic_write_bytes(target, buf.getvalue())
    except OSError as e:  # a read-only or full disk, a folder in the way: one line, not a traceback
        reason = io_failure(e) or str(e)
        in_folder = e.filename and Path(e.filename).parent.resolve() == target.parent.resolve()
        where = f" at {e.filename}" if e.filename and not in_folder else ""  # not the temporary file
        raise RunWriteError(
            f"could not write the curves to {target}: {reason}{where}; give a writable PNG path "
            "(posttrain plot RUN_DIR --out PATH)"
        ) from e
    return target
