"""The completions behind the numbers: every ``logging.samples_every`` steps, one row per completion of
that step (prompt, completion, raw and shaped reward, advantage, correct, truncated, length, group)
is appended to ``<run>/samples.jsonl``, and to TensorBoard (a text table) / W&B (a ``wandb.Table``)
when those loggers are on. ``posttrain samples RUN [--step N] [--worst]`` shows them.

Row layout (one JSON object per completion)::

    {"step": 10, "group": 3, "example_id": "arithmetic-train-41", "prompt": "12+7=", "answer": "19",
     "completion": "19", "reward": 1.0, "shaped_reward": 1.0, "advantage": 0.87, "correct": true,
     "truncated": false, "length": 3, "replayed": false}

``advantage`` is the sequence's advantage (for token-level advantages, their mean over the
completion's action tokens). A resumed run drops rows of steps after its checkpoint, as
``metrics.jsonl`` does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError
from posttrain.utils.io import append_jsonl, atomic_write_text, read_jsonl

SAMPLES_FILE = "samples.jsonl"


def sample_rows(step: int, rollout: Any, scores: Any) -> list[dict[str, Any]]:
    """Rows of one RL step from its :class:`~posttrain.train.rl.StepRollout` and ``StepScores``."""
    ep, b = rollout.episodes, rollout.episodes.batch
    adv = scores.advantages.detach().float().cpu()
    if adv.dim() == 2:  # token-level advantages: mean over the action tokens
        m = rollout.actions.detach().float().cpu()
        adv = (adv * m).sum(1) / m.sum(1).clamp(min=1)
    lengths, truncated = b.action_lengths.cpu(), b.truncated.cpu()
    gids = b.group_ids.cpu()
    rows = []
    for i in range(len(ep)):
        ex = ep.examples[i]
        rows.append(
            {
                "step": step,
                "group": int(gids[i]),
                "example_id": str(getattr(ex, "id", "")),
                "prompt": str(getattr(ex, "prompt", "")),
                "answer": str(getattr(ex, "answer", "")),
                "completion": ep.texts[i],
                "reward": float(scores.raw[i]),
                "shaped_reward": float(scores.shaped[i]),
                "advantage": float(adv[i]),
                "correct": bool(scores.correct[i]),
                "truncated": bool(truncated[i]),
                "length": int(lengths[i]),
                "replayed": bool(ep.replayed[i]),
            }
        )
    return rows


class SamplesLog:
    """Appends step samples to ``samples.jsonl`` and mirrors them to TensorBoard / W&B writers."""

    def __init__(self, run_dir: str | Path, *, truncate_after: int | None = None) -> None:
        self.path = Path(run_dir) / SAMPLES_FILE
        if truncate_after is not None and self.path.exists():
            rows = [r for r in read_jsonl(self.path) if int(r.get("step", 0)) <= truncate_after]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))

    def write(self, rows: list[dict[str, Any]], *, tensorboard: Any = None, wandb: Any = None) -> None:
        for r in rows:
            append_jsonl(self.path, r)
        if not rows:
            return
        step = int(rows[0]["step"])
        if tensorboard is not None:
            tensorboard.add_text("samples", markdown_table(rows), step)
        if wandb is not None:
            import wandb as wb

            cols = list(rows[0])
            wandb.log(
                {"samples": wb.Table(columns=cols, data=[[r[c] for c in cols] for r in rows])}, step=step
            )


def markdown_table(rows: list[dict[str, Any]], width: int = 200) -> str:
    """A Markdown table of the rows (TensorBoard's text plugin renders it)."""

    def cell(v: Any) -> str:
        s = f"{v:.3g}" if isinstance(v, float) else str(v)
        s = s.replace("|", "\\|").replace("\n", "⏎")
        return s if len(s) <= width else s[: width - 1] + "…"

    cols = ["group", "reward", "advantage", "truncated", "length", "prompt", "completion"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def read_samples(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every row of ``<run_dir>/samples.jsonl`` (ValueError naming the file when there is none)."""
    path = Path(run_dir) / SAMPLES_FILE
    if not path.is_file():
        raise InvalidValueError(
            f"{path}: no samples file; RL runs write it every logging.samples_every steps (default 10; "
            "0 = never)"
        )
    return list(read_jsonl(path))


def select(
    rows: list[dict[str, Any]], *, step: int | None = None, worst: bool = False, n: int | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """(the step shown, its rows): ``step`` (default: the last step with samples); ``worst``: lowest
    reward first (truncated before not truncated at equal reward); ``n``: at most this many rows."""
    steps = sorted({int(r["step"]) for r in rows})
    if not steps:
        raise InvalidValueError("the samples file holds no rows")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise InvalidValueError(
            f"no samples at step {step}; steps with samples: {', '.join(map(str, steps))}"
        )
    out = [r for r in rows if int(r["step"]) == step]
    if worst:
        out.sort(key=lambda r: (r["reward"], not r["truncated"], r["advantage"]))
    return step, out[:n] if n else out
